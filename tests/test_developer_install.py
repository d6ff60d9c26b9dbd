"""The README's developer install (requirements.txt) brings what the test suite needs to run, not skip, on a CPU."""

import importlib.metadata
import re
from pathlib import Path

from packaging.requirements import Requirement

from conftest import TRL_VERSION

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"
README = REQUIREMENTS.with_name("README.md")


def developer_requirements() -> dict[str, str]:
    """Name -> requirement, for every line of requirements.txt and every extra its `-e .[...]` line selects (read
    from grpo-kit's metadata, which that line installed)."""
    wanted = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        extras = re.fullmatch(r"-e \.\[(.+)\]", line)
        if extras:
            for text in importlib.metadata.requires("grpo-kit"):
                requirement = Requirement(text)
                if any(
                    requirement.marker and requirement.marker.evaluate({"extra": extra})
                    for extra in extras.group(1).split(",")
                ):
                    wanted[requirement.name] = str(requirement).split(";")[0]
        elif line and not line.startswith("-e "):
            wanted[line if line.startswith(".") else Requirement(line).name] = line
    return wanted


def test_the_developer_install_brings_trl_at_the_compared_version():
    assert developer_requirements()["trl"] == f"trl=={TRL_VERSION}"


def test_the_developer_install_brings_what_skipped_tests_import():
    names = set(developer_requirements())
    assert {"peft", "tensorboard", "wandb", "hydra-joblib-launcher", "hydra-optuna-sweeper", "build"} <= names
    assert "./docs/plugins/example" in names  # the example plugin's own tests and tests/test_example_plugin.py


def test_the_readme_installs_torchs_cpu_build_first():
    """On Linux, PyPI's torch is the CUDA build: several GB that the README's CPU user never uses."""
    first_command = README.read_text().split("```\n", 2)[1].splitlines()[0]
    # An extra index: its 2.13.0+cpu outranks PyPI's 2.13.0, and pip goes on with PyPI where it cannot be reached.
    assert first_command.endswith("pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu")

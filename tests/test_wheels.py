"""`pip install grpo-kit` as a user does it: every distribution built as a wheel, installed into a fresh virtual
environment from those wheels alone (no editable install, no checkout on the path), then used from elsewhere."""

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE_SOURCES = ("grpo_kit", "conf", "pyproject.toml", "README.md")
# Left behind by earlier builds and installs; a stale build/ folder would put deleted modules into the wheel.
NOT_SOURCES = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests")


def run(command: list, **kwargs) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def build_wheels(sources: Path, wheels: Path) -> list[Path]:
    """A wheel of the core and of each built-in plugin, each built from a clean copy of its source."""
    core = sources / "grpo_kit"
    core.mkdir(parents=True)
    for name in CORE_SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, core / name, **({"ignore": NOT_SOURCES} if (ROOT / name).is_dir() else {}))
    plugins = [
        shutil.copytree(plugin, sources / plugin.name, ignore=NOT_SOURCES)
        for plugin in sorted((ROOT / "plugins").iterdir())
        if (plugin / "pyproject.toml").exists()
    ]
    for source in [core, *plugins]:
        run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", wheels, source])
    return sorted(wheels.glob("*.whl"))


@pytest.mark.slow
def test_the_wheels_install_a_working_toolkit(tmp_path):
    wheels = build_wheels(tmp_path / "sources", tmp_path / "wheels")
    assert len(wheels) == 1 + len(list((ROOT / "plugins").glob("*/pyproject.toml")))

    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    # The CPU build first, so that resolving grpo-kit's `torch` does not fetch a CUDA one.
    run([python, "-m", "pip", "install", "--quiet", "torch==2.13.0"])
    run([python, "-m", "pip", "install", "--quiet", *wheels])  # the wheel files themselves, not an index's grpo-kit

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean = {
        "PATH": f"{environment / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GRPO_KIT_CACHE": str(tmp_path / "cache"),
    }
    where = run(
        [python, "-c", "import grpo_kit, grpo_kit_losses; print(grpo_kit.__file__, grpo_kit_losses.__file__)"],
        cwd=elsewhere,
        env=clean,
    )
    assert str(ROOT) not in where and where.count(str(environment)) == 2, where
    assert not list(environment.glob("lib/python*/site-packages/__editable__*"))

    listed = json.loads(run([environment / "bin" / "grpo-kit", "plugins", "--json"], cwd=elsewhere, env=clean))
    names = {(plugin["kind"], plugin["name"]) for plugin in listed}
    assert {("loss", "grpo"), ("loss", "dapo"), ("reward", "accuracy"), ("generation", "transformers")} <= names

    run(
        [python, "-m", "grpo_kit", "+loss=dapo", "+reward=accuracy", "trainer.max_steps=2", "hydra.run.dir=run"],
        cwd=elsewhere,
        env=clean,
    )
    metrics = [json.loads(line) for line in (elsewhere / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in metrics if "loss" in line] == [1, 2]

"""What answers at once loads no heavy library: the CLI's help and errors, `grpo-kit plugins`, `grpo_kit.compose`
and every plugin's registration. torch and the rest load only when a run starts training."""

import importlib.metadata
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import grpo_kit
from grpo_kit.plugins.registry import ENTRY_POINT_GROUP

HEAVY = ("torch", "transformers", "accelerate", "peft", "datasets", "math_verify", "trl", "numpy")


def heavy_modules_after(code: str, cwd=None) -> list[str]:
    """The HEAVY modules that `code` leaves in sys.modules, run in a fresh interpreter (until it ends or exits)."""
    probe = textwrap.dedent(f"""
        import atexit, json, sys
        atexit.register(lambda: print("HEAVY=" + json.dumps([m for m in {HEAVY!r} if m in sys.modules])))
    """)
    child = subprocess.run(
        [sys.executable, "-c", probe + textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd
    )
    reports = [line for line in child.stdout.splitlines() if line.startswith("HEAVY=")]
    assert reports, f"the child process did not finish: {child.stderr}"
    return json.loads(reports[-1].removeprefix("HEAVY="))


def test_compose_loads_nothing_heavy():
    code = """
        import grpo_kit
        grpo_kit.compose(["+loss=vespo", "+reward=[accuracy,think_format]", "+hook=dynamic_sampling", "advantage=rloo",
                          "rollout_correction=token_truncate", "generation=vllm_server"])
    """
    assert heavy_modules_after(code) == []


def test_the_run_schema_loads_no_hydra():
    """The run's sections are plain dataclasses that a module imports without the composition. `import grpo_kit`
    composes (grpo_kit.compose), so schema.py is loaded alone, from its file: then it loads neither Hydra nor
    OmegaConf, nor any module of grpo_kit (which would load grpo_kit/__init__.py, and Hydra with it)."""
    schema = Path(grpo_kit.__file__).parent / "config" / "schema.py"
    code = f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("grpo_kit.config.schema", {str(schema)!r})
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.RunConfig().trainer.max_steps > 0
        print("LOADED=" + json.dumps([name for name in ("hydra", "omegaconf", "grpo_kit") if name in sys.modules]))
    """
    child = subprocess.run(
        [sys.executable, "-c", "import json\n" + textwrap.dedent(code)], capture_output=True, text=True
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "LOADED=[]"


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["+loss=nope"],  # not installed
        ["loss.epsilon=abc"],  # not a float
        ["+loss=vespo", "rollout_correction=sequence_mask", "+reward=accuracy"],  # a combination the run refuses
    ],
)
def test_the_cli_answers_without_loading_anything_heavy(argv, tmp_path):
    code = f"""
        import runpy, sys
        sys.argv = ["grpo_kit", *{argv!r}]
        runpy.run_module("grpo_kit", run_name="__main__")
    """
    assert heavy_modules_after(code, cwd=tmp_path) == []


def test_listing_the_plugins_loads_nothing_heavy():
    assert heavy_modules_after("from grpo_kit.cli.commands import main; main(['plugins', '--json'])") == []


def test_no_entry_point_module_imports_torch():
    modules = sorted({ep.module for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
    assert "grpo_kit_losses.plugin" in modules
    code = f"""
        import sys
        for module in {modules!r}:
            __import__(module)
            assert "torch" not in sys.modules, module + " imports torch"
    """
    assert heavy_modules_after(code) == []


def test_the_heavy_public_names_import_when_used():
    from grpo_kit import Run, ScoredBatch, build_advantage, build_objective, train
    from grpo_kit.contract import pipeline
    from grpo_kit.objective.objective import build_objective as objective_builder
    from grpo_kit.training.builders import build_advantage as advantage_builder
    from grpo_kit.training.loop import train as trainer_train

    assert (build_advantage, build_objective, train) == (advantage_builder, objective_builder, trainer_train)
    assert (Run, ScoredBatch) == (pipeline.Run, pipeline.ScoredBatch)
    assert set(grpo_kit.__all__) <= set(dir(grpo_kit)) | set(grpo_kit._IMPORTED_ON_USE)
    with pytest.raises(AttributeError, match="has no attribute 'trian'"):
        grpo_kit.trian  # noqa: B018


def test_the_conformance_kit_names_what_imports_torch(local_plugin):
    from grpo_kit.testing.contracts.plugin import _what_imports_torch

    heavy = local_plugin("heavy_plugin_module", "import torch\n")
    registers_heavy = local_plugin(
        "registers_heavy_class",
        """
        import grpo_kit

        @grpo_kit.hookimpl
        def register_losses(register):
            from grpo_kit_losses.dapo import DAPO  # imported in the hook: still at registration
            register("heavy", DAPO)
    """,
    )
    assert _what_imports_torch(heavy) == "Importing heavy_plugin_module"
    assert _what_imports_torch(registers_heavy).startswith("Registering the plugins of registers_heavy_class")
    assert _what_imports_torch("grpo_kit_losses.plugin") is None

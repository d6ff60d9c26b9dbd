"""Fixtures shared by the core's tests and the plugins' tests."""

import importlib
import os
import tempfile
import textwrap

import pytest
from accelerate.state import AcceleratorState, GradientState

from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing import build_tiny_model

# trackio keeps its runs in one store, read when it is imported: the tests' runs go to a folder of their own, not
# into the user's ~/.cache/huggingface/trackio.
os.environ.setdefault("TRACKIO_DIR", tempfile.mkdtemp(prefix="grpo_kit-tests-trackio-"))


@pytest.fixture
def registry(monkeypatch):
    """The installed plugins, discovered afresh, with no GRPO_KIT_* variables of the caller's shell in the way."""
    for variable in ("GRPO_KIT_PLUGINS", "GRPO_KIT_DISABLE_PLUGINS", "GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(variable, raising=False)
    return Registry(plugin_manager())


TRL_VERSION = (
    "1.16.0"  # the TRL whose GRPOTrainer grpo_kit computes exactly (docs/architecture.md), pinned in requirements.txt
)


@pytest.fixture(scope="session")
def trl():
    """The trl module, for the tests that compare with TRL. Without trl==1.16.0 they skip, or fail where
    GRPO_KIT_REQUIRE_TRL=1 (.ci/run sets it), so that a broken install cannot pass CI by skipping the comparisons."""
    try:
        module = importlib.import_module("trl")
    except ImportError as error:
        problem = f"trl cannot be imported ({error})"
    else:
        if module.__version__ == TRL_VERSION:
            return module
        problem = f"trl {module.__version__} is installed"
    reason = f"{problem}; the comparisons need trl=={TRL_VERSION}: pip install -r requirements.txt"
    if os.environ.get("GRPO_KIT_REQUIRE_TRL") == "1":
        pytest.fail(f"GRPO_KIT_REQUIRE_TRL=1, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def soft_capped_model():
    """An untrained one-layer Gemma2 whose logits are soft-capped (final_logit_softcapping), from seed 0."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    size = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8)
    return Gemma2ForCausalLM(
        Gemma2Config(vocab_size=23, num_key_value_heads=1, final_logit_softcapping=0.5, pad_token_id=0, **size)
    )


@pytest.fixture
def local_plugin(tmp_path, monkeypatch):
    """Write a plugin module into a folder on sys.path; returns its module name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


@pytest.fixture
def plain_loss_registry(local_plugin):
    """The installed plugins and `plain_pg`, a loss class that declares nothing: no base class, no attributes, no
    config, no Liger equivalent, so the core supplies every default grpo_kit/contract/kinds.py gives."""
    module = local_plugin(
        "plain_pg_loss",
        """
        import grpo_kit
        from grpo_kit.contract.reductions import sequence_mean

        class PlainPG:
            def per_token_loss(self, inputs):
                return -inputs.advantages * inputs.per_token_logps, {}

            def reduce(self, per_token_loss, mask, reduction):
                return sequence_mean(per_token_loss, mask, reduction)

        @grpo_kit.hookimpl
        def register_losses(register):
            register("plain_pg", PlainPG)
    """,
    )
    return Registry(plugin_manager(local_modules=[module]))


@pytest.fixture(params=["built-ins", "with a third-party loss"])
def installed(request, registry, local_plugin, tmp_path, monkeypatch):
    """The installed plugins as they are, then with a third-party loss whose name sorts before every built-in one:
    a test must pass whatever else a user has installed. Subprocesses load it too (GRPO_KIT_PLUGINS)."""
    if request.param == "built-ins":
        return registry
    module = local_plugin(
        "aardvark_loss",
        """
        import grpo_kit

        @grpo_kit.hookimpl
        def register_losses(register):
            register("aardvark", "aardvark_loss:Never")  # an import path: never imported unless a run selects it
    """,
    )
    monkeypatch.setenv("GRPO_KIT_PLUGINS", module)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return Registry(plugin_manager())


@pytest.fixture
def digits_registry(local_plugin):
    """The installed plugins and `digits`, a reward an untrained model can earn: the share of digits it writes."""
    module = local_plugin(
        "digits_reward",
        """
        import grpo_kit

        def digits(prompts, completions, completion_ids, **columns):
            return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("digits", digits)
    """,
    )
    return Registry(plugin_manager(local_modules=[module]))


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate keeps its state in process-wide singletons: each test gets its own, as a run would."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()

"""trainer.torch_compile: the policy's scoring passes go through torch.compile (grpo_kit/model/fast/compiled.py),
and a compiled run trains as the plain one does."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model import logprobs
from grpo_kit.model.fast.compiled import use_compiled_passes
from grpo_kit.testing import tiny_run
from grpo_kit.testing.micro_batches import random_micro_batch

ONES_REWARD = """
def ones(completions, **columns):
    return [float(completion.count("1")) for completion in completions]
"""


def passes_through_compiled_call(model, monkeypatch) -> list:
    """The torch.compile options of each model call that one log-prob pass over a micro-batch sends through
    `compiled_call` (called plainly)."""
    sent = []

    def recorded(options, model, inputs, kwargs):
        sent.append(options)
        return model(**inputs, **kwargs)

    monkeypatch.setattr(logprobs, "compiled_call", recorded)
    batch = random_micro_batch(model.config.vocab_size)
    logprobs.per_token_logps_and_entropies(model, batch, temperature=1.0)
    return sent


def test_only_a_policy_switched_to_torch_compile_passes_through_it(tiny_model, monkeypatch):
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert passes_through_compiled_call(plain, monkeypatch) == []
    compiled = AutoModelForCausalLM.from_pretrained(tiny_model)
    use_compiled_passes(compiled, backend="aot_eager", mode=None)
    sent = passes_through_compiled_call(compiled, monkeypatch)
    assert sent and set(sent) == {("aot_eager", None)}


@pytest.mark.parametrize(
    ("backend", "mode", "message"),
    [("no_such_backend", None, "Invalid backend: 'no_such_backend'"), (None, "fastest", "Unrecognized mode=fastest")],
)
def test_a_backend_or_mode_torch_does_not_know_is_refused_before_the_first_pass(tiny_model, backend, mode, message):
    with pytest.raises(ConfigError, match=message):
        use_compiled_passes(AutoModelForCausalLM.from_pretrained(tiny_model), backend, mode)


def test_the_options_of_torch_compile_need_it_and_packing_is_warned_of(tiny_model, caplog):
    base = tiny_run(tiny_model, "+reward=accuracy")
    with pytest.raises(ConfigError, match="trainer.torch_compile_mode=max-autotune is an option of trainer.torch_"):
        grpo_kit.compose([*base, "trainer.torch_compile_mode=max-autotune"])
    grpo_kit.compose([*base, "trainer.torch_compile=true", "trainer.torch_compile_backend=aot_eager"])
    assert "recompile limit" not in caplog.text
    grpo_kit.compose([*base, "trainer.torch_compile=true", "trainer.packing=true"])
    assert "trainer.torch_compile=true with trainer.packing=true" in caplog.text


def run(tiny_model, run_dir, *overrides) -> list[dict]:
    cfg = grpo_kit.compose(
        tiny_run(
            tiny_model,
            "+reward=python",
            "reward.python.function=ones_reward:ones",  # rewards that differ within a group: gradients to compare
            "trainer.max_steps=2",
            "algorithm.beta=0.04",  # the reference's passes too, which stay plain
            *overrides,
        )
    )
    grpo_kit.train(cfg, run_dir)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_compiled_run_compiles_the_passes_and_trains_as_the_plain_run(local_plugin, tiny_model, tmp_path):
    local_plugin("ones_reward", ONES_REWARD)
    plain = run(tiny_model, tmp_path / "plain")
    counters.clear()
    torch._dynamo.reset()  # what an earlier test compiled is compiled again, and counted
    compiled = run(tiny_model, tmp_path / "compiled", "trainer.torch_compile=true")
    assert counters["frames"]["ok"] >= 1 and counters["stats"]["unique_graphs"] >= 1, dict(counters)
    steps = [(row["loss"], row["grad_norm"], row["entropy"]) for row in plain if "loss" in row]
    assert len(steps) == 2 and all(grad_norm > 0 for _, grad_norm, _ in steps)
    compiled_steps = [(row["loss"], row["grad_norm"], row["entropy"]) for row in compiled if "loss" in row]
    torch.testing.assert_close(compiled_steps, steps, rtol=1e-5, atol=1e-6)
    # The compiled call wraps nothing into the model: its weights are saved under their own names. (Their values
    # are not compared: Adam's first steps turn gradient differences of float rounding into steps of a whole
    # learning rate wherever a gradient is near zero.)
    saved, plain_saved = (load_file(tmp_path / name / "model" / "model.safetensors") for name in ("compiled", "plain"))
    assert saved.keys() == plain_saved.keys()

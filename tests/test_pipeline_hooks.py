"""The two hooks that hand a value on (on_rollout_scored, on_advantages), in real runs on a tiny model: every
implementation applies, each to what the one before returned."""

import importlib
import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import PluginError
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing import tiny_run

HOOKS = """
    from dataclasses import dataclass

    import torch

    import grpo_kit

    SEEN = []  # (hook plugin, what it was handed) in the order the run called them


    @dataclass
    class Config:
        pass


    def tagging_filter(label):  # returns a new batch, tagged in its metrics, and notes what it was handed

        class Filter:
            def __init__(self, config):
                pass

            @grpo_kit.hookimpl
            def on_rollout_scored(self, scored):
                SEEN.append((label, dict(scored.metrics)))
                kept = scored.select_groups(list(range(scored.num_groups)))
                kept.metrics = {**scored.metrics, f"{label}/ran": 1.0}
                return kept

        return Filter


    class AdvantagesToOne:
        def __init__(self, config):
            pass

        @grpo_kit.hookimpl
        def on_advantages(self, advantages):
            return torch.ones_like(advantages)


    class AdvantagesToZero:
        def __init__(self, config):
            pass

        @grpo_kit.hookimpl
        def on_advantages(self, advantages):
            SEEN.append(("advantages_to_zero", advantages.tolist()))
            return torch.zeros_like(advantages)


    class DropsAGroup:
        def __init__(self, config):
            pass

        @grpo_kit.hookimpl
        def on_rollout_scored(self, scored):
            return scored.select_groups([0])


    @grpo_kit.hookimpl
    def register_hooks(register):
        for name, hook in [("filter_a", tagging_filter("filter_a")), ("filter_b", tagging_filter("filter_b")),
                           ("advantages_to_one", AdvantagesToOne), ("advantages_to_zero", AdvantagesToZero),
                           ("drops_a_group", DropsAGroup)]:
            register(name, hook, Config)
"""


@pytest.fixture
def hooks(digits_registry, local_plugin, monkeypatch):
    """The module of the test's hook plugins (imported afresh: SEEN starts empty), and a registry with them and the
    `digits` reward."""
    name = local_plugin("chained_hooks", HOOKS)
    monkeypatch.delitem(sys.modules, name, raising=False)
    registry = Registry(plugin_manager(local_modules=["digits_reward", name]))
    return importlib.import_module(name), registry


def test_two_filters_both_apply_in_the_order_selected(hooks, tiny_model, tmp_path):
    module, registry = hooks
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=digits", "+hook=[filter_b,filter_a]"), registry)
    grpo_kit.train(cfg, tmp_path, registry)
    assert [name for name, _ in module.SEEN] == ["filter_b", "filter_a"] * 3
    assert all("filter_b/ran" in metrics for name, metrics in module.SEEN if name == "filter_a")  # b's batch
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        assert json.loads(line)["filter_a/ran"] == json.loads(line)["filter_b/ran"] == 1.0


def test_replacement_advantages_are_chained_and_trained_on(hooks, tiny_model, tmp_path):
    module, registry = hooks
    overrides = tiny_run(tiny_model, "+reward=digits", "+loss=dapo", "+hook=[advantages_to_one,advantages_to_zero]")
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path, registry)

    handed = [advantages for name, advantages in module.SEEN if name == "advantages_to_zero"]
    assert len(handed) == 3 and all(value == 1.0 for advantages in handed for value in advantages)
    # Zero advantages give the loss no gradient: the weights the run saved are the weights it started from.
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_filter_that_changes_the_batch_size_is_named(hooks, tiny_model, tmp_path):
    _, registry = hooks
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=digits", "+hook=drops_a_group"), registry)
    with pytest.raises(PluginError, match="on_rollout_scored hook of DropsAGroup returned 1 groups for a batch of 2"):
        grpo_kit.train(cfg, tmp_path, registry)

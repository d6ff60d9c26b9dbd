"""The contract in grpo_kit/contract/kinds.py: every attribute the core reads of a plugin has its default there,
whether the
plugin subclasses its kind's protocol or not."""

import json

import torch

import grpo_kit
from grpo_kit.contract.kinds import PROTOCOLS, TRAITS, declared
from grpo_kit.plugins.registry import REGISTER_HOOK_OF_KIND, Registry, plugin_manager
from grpo_kit.testing import tiny_run


def test_every_trait_has_a_default_in_its_kinds_protocol():
    for kind, names in TRAITS.items():
        for name in names:
            assert hasattr(PROTOCOLS[kind], name), f"grpo_kit.contract.kinds.{PROTOCOLS[kind].__name__} lacks {name}"


def test_a_subclass_without_options_is_built_without_a_config(local_plugin):
    hooks = "\n".join(
        f"@grpo_kit.hookimpl\ndef {REGISTER_HOOK_OF_KIND[kind]}(register):\n"
        f"    register('without_options', type('WithoutOptions', (grpo_kit.contract.kinds.{protocol.__name__},), "
        f"{{}}))\n"
        for kind, protocol in PROTOCOLS.items()
    )
    registry = Registry(plugin_manager(local_modules=[local_plugin("without_options", f"import grpo_kit\n{hooks}")]))
    for kind, protocol in PROTOCOLS.items():
        # Twice: on a first call, Python 3.10 replaces an __init__ inherited from a protocol with object's.
        for _ in range(2):
            assert protocol in type(registry.build(kind, "without_options", {})).__mro__, kind


def test_a_subclass_states_only_what_differs():
    class TokenLoss(grpo_kit.Loss):
        importance_sampling_level = "token"

    loss = TokenLoss()
    assert declared(loss, "loss", "importance_sampling_level") == "token"
    assert declared(loss, "loss", "consumes_rollout_ratio") is False
    assert declared(loss, "loss", "rollout_correction_levels") is None
    assert loss.liger_loss() is None


def test_a_class_that_does_not_subclass_gets_the_same_defaults():
    class Bare:
        pass

    bare = Bare()
    for kind, protocol in PROTOCOLS.items():
        for name in TRAITS.get(kind, ()):
            assert declared(bare, kind, name) == getattr(protocol, name)
    assert declared(bare, "loss", "liger_loss")() is None
    assert declared(bare, "reward", "quick_scores")(prompts=[], completions=[], completion_ids=[]) == {}
    assert declared(bare, "reward", "cpu_heavy") is False and declared(bare, "reward", "required_columns") is None


def test_a_plain_loss_class_trains_with_the_defaults(plain_loss_registry, tiny_model, tmp_path):
    assert plain_loss_registry.get("loss", "plain_pg").traits == {
        "importance_sampling_level": None,
        "rollout_correction_levels": None,
        "accumulation_invariant": False,
    }
    # A token-level correction: the core multiplies the loss by its ratio, as it does for a loss that does not
    # declare consumes_rollout_ratio.
    overrides = tiny_run(tiny_model, "+loss=plain_pg", "+reward=accuracy", "rollout_correction=token_truncate")
    cfg = grpo_kit.compose(overrides, plain_loss_registry)
    grpo_kit.train(cfg, tmp_path, plain_loss_registry)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in metrics if "loss" in line]
    assert len(losses) == cfg.trainer.max_steps and all(torch.isfinite(torch.tensor(losses)))

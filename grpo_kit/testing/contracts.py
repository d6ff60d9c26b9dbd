"""The conformance kit: what every plugin of a kind must do, as pytest classes a plugin's tests subclass.

    from grpo_kit.testing.contracts import LossContract

    class TestMyLoss(LossContract):
        plugin_name = "my_loss"                  # an installed plugin, built with Registry().build(kind, name, config)
        required_metrics = ("my_loss/clip_ratio",)

The subject is one of:

- `plugin_name = "NAME"`: the installed plugin of that name, exactly as a run builds it;
- `plugin_names = ["a", "b"]`: several installed plugins, the whole suite once for each (test ids are the names);
- `implementation = MyLoss` and `config = MyConfig` (a class or an instance): a plugin that is not installed yet,
  registered under `plugin_name` (or the implementation's name) through the same registration path, with the
  traits its `register` call will declare (`traits = {"accumulation_invariant": True}`).

`options = {...}` sets config fields (a field without a default must be set here). Options that need a fixture
(a model folder, say) come from overriding the class-scoped fixture `plugin_options`. `assert_contracts_cover`
checks that a test module leaves none of its distribution's plugins unchecked.

Every suite also checks an installed plugin's registration: its distribution's entry-point module, and registering
its plugins, must not import torch (docs/plugins/README.md, "Registering lazily").

The suites check what the core relies on; a plugin's own tests check its formulas with worked numbers.
"""

import asyncio
import copy
import dataclasses
import functools
import importlib.metadata
import inspect
import json
import math
import numbers
import os
import pickle
import subprocess
import sys
import textwrap
import types
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
import torch
from omegaconf import OmegaConf

from grpo_kit.config.compose import hydra_composition, options
from grpo_kit.contract.eos import eos_token_ids
from grpo_kit.contract.hookspecs import hookimpl
from grpo_kit.contract.kinds import (
    KINDS,
    MULTI_CHOICE_KINDS,
    Completions,
    GenerationConfig,
    LossInputs,
    PromptImages,
    Reduction,
    declared,
)
from grpo_kit.plugins.inventory import split_distribution
from grpo_kit.plugins.registry import ENTRY_POINT_GROUP, REGISTER_HOOK_OF_KIND, Plugin, Registry, plugin_manager

__all__ = [
    "AdvantageContract",
    "EnvironmentContract",
    "GenerationContract",
    "HookContract",
    "ImportanceSamplingContract",
    "LossContract",
    "PluginContract",
    "RewardContract",
    "RolloutContract",
    "RolloutCorrectionContract",
    "assert_contracts_cover",
]

TOKEN, SEQUENCE = "token", "sequence"


@dataclasses.dataclass(frozen=True)
class ContractCase:
    """One plugin under test: its registry and its name there."""

    registry: Registry
    kind: str
    name: str

    @property
    def plugin(self) -> Plugin:
        return self.registry.get(self.kind, self.name)

    def __repr__(self) -> str:
        return f"{self.kind} plugin {self.name!r}"


class PluginContract:
    """What every plugin does: it is built from its config, and its config survives Hydra's round trip."""

    kind: ClassVar[str]
    plugin_name: ClassVar[str | None] = None
    plugin_names: ClassVar[Sequence[str]] = ()
    implementation: ClassVar[Any] = None
    config: ClassVar[Any] = None  # the config dataclass, or an instance of it
    traits: ClassVar[dict] = {}  # with `implementation`: what its registration declares (accumulation_invariant=...)
    options: ClassVar[dict] = {}

    # --- how the subject is found and built ---

    def pytest_generate_tests(self, metafunc):
        if "contract_case" in metafunc.fixturenames:
            cases = self.contract_cases()
            metafunc.parametrize("contract_case", cases, ids=[case.name for case in cases], scope="class")

    @classmethod
    def contract_cases(cls) -> list[ContractCase]:
        """The plugins this class checks; found once per class (pytest asks for each test method)."""
        if "_contract_cases" not in cls.__dict__:
            cls._contract_cases = cls._find_contract_cases()
        return cls._contract_cases

    @classmethod
    def _find_contract_cases(cls) -> list[ContractCase]:
        if cls.implementation is not None:
            name = cls.plugin_name or getattr(cls.implementation, "__name__", "plugin_under_test")
            registry = _registry_of_one(cls.kind, name, cls.implementation, cls._config_class(), cls.traits)
            return [ContractCase(registry, cls.kind, name)]
        names = list(cls.plugin_names) or ([cls.plugin_name] if cls.plugin_name else [])
        if not names:
            raise TypeError(
                f"{cls.__name__} names no plugin: set plugin_name = 'NAME' (an installed {cls.kind} plugin), "
                f"plugin_names = [...], or implementation = YourClass and config = YourConfig."
            )
        registry = Registry()  # what a run sees, GRPO_KIT_PLUGINS and the block list included
        return [ContractCase(registry, cls.kind, name) for name in names]

    @classmethod
    def _config_class(cls):
        if cls.config is None or isinstance(cls.config, type):
            return cls.config
        return type(cls.config)

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_options(cls, contract_case) -> dict:
        """Config fields to set; override this fixture when a value needs another fixture."""
        return dict(cls.options)

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_config(cls, contract_case, plugin_options):
        """The config instance the plugin is built with."""
        if cls.config is not None and not isinstance(cls.config, type):
            return dataclasses.replace(cls.config, **plugin_options)
        return contract_case.plugin.config(**plugin_options)

    @pytest.fixture(scope="class")
    @classmethod
    def plugin(cls, contract_case, plugin_config):
        """The built plugin, as a run builds it."""
        return contract_case.registry.build(contract_case.kind, contract_case.name, plugin_config)

    # --- the contract every kind shares ---

    def test_config_round_trips_through_hydra(self, contract_case, plugin_config):
        """The config takes a run's way: stored in Hydra's ConfigStore, composed with `+KIND=NAME`, set as the
        command line sets it, read with `grpo_kit.config.compose.options` and typed by the registry. Every field
        must be a type OmegaConf can hold, and the plugin must be built with the values set, nested dataclasses
        included."""
        kind, name = contract_case.kind, contract_case.name
        cfg = hydra_composition([f"+{kind}={name}"], contract_case.registry)
        if cfg.generation is None:  # a run always has a backend, whose options a default may interpolate
            cfg.generation = OmegaConf.structured(GenerationConfig)
        node = cfg[kind][name] if kind in MULTI_CHOICE_KINDS else cfg[kind]
        node.merge_with(OmegaConf.to_container(OmegaConf.structured(plugin_config), resolve=False))
        back = contract_case.registry.config_instance(kind, name, options(node))
        # A default such as ${generation.max_completion_length} comes back resolved against the run's config.
        interpolated = {key: getattr(back, key) for key in node if OmegaConf.is_interpolation(node, key)}
        expected = dataclasses.replace(plugin_config, **interpolated)
        assert back == expected, f"{contract_case}: {expected} came back from a composed run as {back}"

    def test_registration_imports_no_torch(self, contract_case):
        """`grpo-kit plugins`, the CLI's help and errors, and `grpo_kit.compose` import every installed plugin's
        entry-point module and register its plugins: in a fresh process, neither may import torch."""
        if self.implementation is not None:
            pytest.skip("not installed yet: `implementation = ...` has no entry-point module")
        for module in _entry_point_modules(contract_case.plugin.distribution):
            torch_came_with = _what_imports_torch(module)
            assert torch_came_with is None, (
                f"{torch_came_with} imports torch, which then loads with every grpo-kit command and every composed "
                "run. Register the implementation by its import path, register(name, 'package.module:Class', Config), "
                "keep the config dataclass in a module that does not import torch, and declare the traits the core "
                f"reads to `register` (docs/plugins/README.md). `python -X importtime -c 'import {module}'` shows "
                "what imports it."
            )


def _entry_point_modules(distribution: str) -> list[str]:
    """The modules that register a distribution's plugins ("local module X": X itself)."""
    name, _ = split_distribution(distribution)
    if name.startswith("local module "):
        return [name.removeprefix("local module ")]
    entry_points = importlib.metadata.distribution(name).entry_points.select(group=ENTRY_POINT_GROUP)
    return sorted({entry_point.module for entry_point in entry_points})


_TORCH_CHECK = textwrap.dedent("""
    import json, sys
    module = sys.argv[1]
    __import__(module)
    on_import = "torch" in sys.modules
    from grpo_kit.plugins.inventory import installed_plugins
    from grpo_kit.plugins.registry import Registry, plugin_manager
    installed_plugins(Registry(plugin_manager(autoload=False, local_modules=[module], disabled=[])))
    print(json.dumps({"on_import": on_import, "on_registration": "torch" in sys.modules}))
""")


@functools.cache  # one fresh process per module, however many plugins and suites it has
def _what_imports_torch(module: str) -> str | None:
    """What, in a fresh process, imports torch: importing `module`, or registering its plugins; None: neither."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}  # local modules too
    child = subprocess.run(
        [sys.executable, "-c", _TORCH_CHECK, module], capture_output=True, text=True, env=environment
    )
    if child.returncode != 0:
        raise AssertionError(f"Registering the plugins of {module} in a fresh process failed:\n{child.stderr}")
    found = json.loads(child.stdout.splitlines()[-1])
    if found["on_import"]:
        return f"Importing {module}"
    if found["on_registration"]:
        return f"Registering the plugins of {module} (its register_* hooks, or the classes they import)"
    return None


def _registry_of_one(kind: str, name: str, implementation, config, traits: dict) -> Registry:
    """A registry holding only `implementation`, registered through a plugin module as an entry point would be."""
    if kind not in REGISTER_HOOK_OF_KIND:
        raise TypeError(f"Unknown plugin kind {kind!r}: one of {', '.join(KINDS)}.")

    def register_one(register):
        register(name, implementation, config, **traits)

    module = types.SimpleNamespace(**{REGISTER_HOOK_OF_KIND[kind]: hookimpl(register_one)})
    pm = plugin_manager(autoload=False, local_modules=[], disabled=[])
    pm.register(module, name=f"contract test of {name}")
    return Registry(pm)


def assert_contracts_cover(distribution: str, namespace: dict) -> None:
    """Fail unless the contract classes in `namespace` (a test module's `globals()`) check every plugin that the
    installed `distribution` (its name, as in pyproject.toml) registers."""
    installed = [plugin for kind in KINDS for plugin in Registry().plugins(kind)]
    registered = {(p.kind, p.name) for p in installed if split_distribution(p.distribution)[0] == distribution}
    if not registered:
        known = sorted({split_distribution(p.distribution)[0] for p in installed})
        raise AssertionError(
            f"No installed plugin comes from a distribution named {distribution!r} (installed: {', '.join(known)}). "
            "Is it installed in this environment (pip install -e .), and is that its name in pyproject.toml?"
        )
    checked = set()
    for value in namespace.values():
        collected = isinstance(value, type) and value.__name__.startswith("Test")  # what pytest runs
        if collected and issubclass(value, PluginContract) and getattr(value, "kind", None):
            if value.implementation is None:  # a class given as `implementation` is not the installed plugin
                checked |= {(value.kind, name) for name in list(value.plugin_names) or [value.plugin_name]}
    missing = sorted(registered - checked)
    if missing:
        advice = "; ".join(
            f"{kind} {name!r}: add `class Test{name.title().replace('_', '')}({_CONTRACT_OF_KIND[kind]}): "
            f"plugin_name = {name!r}`"
            for kind, name in missing
        )
        raise AssertionError(f"{distribution} registers plugins that no contract class here checks. {advice}.")


# ----------------------------------------------------------------------------------------------------- loss ---


def _assert_close(actual, expected, what: str, **tolerances) -> None:
    """torch.testing.assert_close, its message led by what was compared."""
    torch.testing.assert_close(actual, expected, msg=lambda detail: f"{what}: {detail}", **tolerances)


def _random_completions(seed: int, lengths=(6, 3, 1, 5)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs (B, T), a mask with the given numbers of active tokens, advantages (B, 1) of both signs."""
    generator = torch.Generator().manual_seed(seed)
    length = max(max(lengths), 1)
    per_token_logps = -(torch.rand(len(lengths), length, generator=generator) * 2.0 + 0.05)
    mask = (torch.arange(length).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    advantages = torch.randn(len(lengths), 1, generator=generator)
    advantages[0], advantages[1] = advantages[0].abs() + 0.1, -advantages[1].abs() - 0.1
    return per_token_logps, mask, advantages


def _log_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Log importance weights as the two standard levels form them: per token, or GSPO's per-sequence mean."""
    if level == TOKEN:
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


class LossContract(PluginContract):
    """A loss (grpo_kit/contract/kinds.py: Loss) on random inputs, with the importance weights of both levels.

    `required_metrics`: metric names the loss must report. A loss that declares `accumulation_invariant = True`
    must give the gradient of the whole batch however the batch is split into equal micro-batches, in order or
    grouped by length, with gradient accumulation.
    """

    kind = "loss"
    required_metrics: ClassVar[Sequence[str]] = ()

    def evaluate(
        self,
        loss,
        per_token_logps,
        old_per_token_logps,
        advantages,
        mask,
        level,
        rollout_ratio=None,
        accumulation=1,
        num_items_in_batch=None,
    ):
        """The loss as the core's objective applies it: weights -> per-token loss -> correction -> reduction."""
        log_ratio = per_token_logps - old_per_token_logps
        inputs = LossInputs(
            _log_weights(log_ratio, mask, level), log_ratio, advantages, per_token_logps, mask, rollout_ratio
        )
        per_token_loss, metrics = loss.per_token_loss(inputs)
        if rollout_ratio is not None and not declared(loss, "loss", "consumes_rollout_ratio"):
            per_token_loss = per_token_loss * rollout_ratio
        total_tokens = float(mask.sum()) if num_items_in_batch is None else num_items_in_batch
        reduction = Reduction(total_tokens, accumulation, accumulation, 1, mask.shape[1])
        return loss.reduce(per_token_loss, mask, reduction), metrics

    def loss_and_gradient(self, loss, per_token_logps, old_per_token_logps, advantages, mask, level, **kwargs):
        leaf = per_token_logps.clone().requires_grad_()
        value, metrics = self.evaluate(loss, leaf, old_per_token_logps, advantages, mask, level, **kwargs)
        is_scalar = isinstance(value, torch.Tensor) and value.dim() == 0
        assert is_scalar, f"reduce() must return a scalar tensor, got {value!r}"
        assert value.requires_grad, (
            "the loss does not depend on the policy's log-probs (inputs.per_token_logps, or inputs.log_weights and "
            "inputs.log_ratio, which carry their gradient): nothing would train"
        )
        value.backward()
        return value.detach(), leaf.grad, metrics

    def rollout_ratios(self, loss, mask):
        """No correction, and a ratio of every level the loss accepts (values in [0.5, 2])."""
        accepted = declared(loss, "loss", "rollout_correction_levels")
        ratios = {"no correction": None}
        generator = torch.Generator().manual_seed(7)
        if accepted is None or TOKEN in accepted:
            ratios["token-level correction"] = torch.rand(mask.shape, generator=generator) * 1.5 + 0.5
        if accepted is None or SEQUENCE in accepted:
            ratios["sequence-level correction"] = torch.rand(mask.shape[0], 1, generator=generator) * 1.5 + 0.5
        return ratios

    def test_declares_what_the_core_reads(self, plugin):
        level = declared(plugin, "loss", "importance_sampling_level")
        assert level in (None, TOKEN, SEQUENCE), "importance_sampling_level must be None, 'token' or 'sequence'"
        if level is not None:
            advice = declared(plugin, "loss", "importance_sampling_advice")
            assert isinstance(advice, str) and advice, (
                "a loss that wants one importance-sampling level says why in importance_sampling_advice (the "
                "warning a run shows for the other level)"
            )
        levels = declared(plugin, "loss", "rollout_correction_levels")
        assert levels is None or set(levels) <= {TOKEN, SEQUENCE}, "rollout_correction_levels: None, or levels"
        consumes = declared(plugin, "loss", "consumes_rollout_ratio")
        assert isinstance(consumes, bool), "consumes_rollout_ratio must be True or False"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_loss_and_gradient_are_finite(self, plugin, level):
        logps, mask, advantages = _random_completions(seed=0)
        noise = torch.randn(logps.shape, generator=torch.Generator().manual_seed(1)) * 0.3
        for policy in ("on-policy", "off-policy"):
            old = logps if policy == "on-policy" else logps + noise
            for correction, ratio in self.rollout_ratios(plugin, mask).items():
                value, grad, _ = self.loss_and_gradient(
                    plugin, logps, old, advantages, mask, level, rollout_ratio=ratio
                )
                where = f"{policy}, {level}-level weights, {correction}"
                assert torch.isfinite(value), f"loss is {value.item()} ({where})"
                assert torch.isfinite(grad).all(), f"gradient has non-finite values ({where}): {grad}"
                assert grad.abs().sum() > 0, f"the loss has a zero gradient ({where}): it trains nothing"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_a_completion_with_no_active_tokens_keeps_everything_finite(self, plugin, level):
        """algorithm.mask_truncated_completions zeroes a truncated completion's whole mask."""
        logps, mask, advantages = _random_completions(seed=2, lengths=(4, 0, 2, 3))
        old = logps + 0.1
        value, grad, _ = self.loss_and_gradient(plugin, logps, old, advantages, mask, level)
        assert torch.isfinite(value) and torch.isfinite(grad).all(), f"loss {value.item()}, gradient {grad}"
        assert (grad[1] == 0).all(), "a completion with no active tokens must get no gradient"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_masked_tokens_change_neither_loss_nor_gradient_nor_metrics(self, plugin, level):
        logps, mask, advantages = _random_completions(seed=3)
        old = logps + torch.randn(logps.shape, generator=torch.Generator().manual_seed(4)) * 0.2
        padding = mask == 0
        for correction, ratio in self.rollout_ratios(plugin, mask).items():
            results = []
            for pad_logp, pad_old, pad_ratio in ((-0.1, -0.2, 1.0), (-30.0, -1.0, 7.0)):
                padded_ratio = ratio
                if ratio is not None and ratio.shape == mask.shape:
                    padded_ratio = ratio.masked_fill(padding, pad_ratio)
                results.append(
                    self.loss_and_gradient(
                        plugin,
                        logps.masked_fill(padding, pad_logp),
                        old.masked_fill(padding, pad_old),
                        advantages,
                        mask,
                        level,
                        rollout_ratio=padded_ratio,
                    )
                )
            (loss_a, grad_a, metrics_a), (loss_b, grad_b, metrics_b) = results
            where = f"{level}-level weights, {correction}"
            _assert_close(loss_a, loss_b, what=f"padding changed the loss ({where})")
            _assert_close(grad_a, grad_b, what=f"padding changed the gradient ({where})")
            assert (grad_a[padding] == 0).all(), f"padding tokens got a gradient ({where})"
            for name in metrics_a:
                _assert_close(
                    metrics_a[name], metrics_b[name], equal_nan=True, what=f"padding changed metric {name!r} ({where})"
                )

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_on_policy_gradient_favours_positive_advantages(self, plugin, level):
        """At pi_theta = pi_old, gradient descent raises the log-probs of tokens with a positive advantage and
        lowers those with a negative one: the sign error this catches is the commonest bug of a new loss."""
        logps, mask, advantages = _random_completions(seed=5)
        _, grad, _ = self.loss_and_gradient(plugin, logps, logps, advantages, mask, level)
        descent = -grad * advantages * mask  # > 0 where a step moves the log-prob the advantage's way
        assert (descent >= -1e-8).all(), f"the gradient pushes some tokens against their advantage's sign: {grad}"
        assert (descent > 0).any(), "on-policy, the loss gives no token a gradient"

    def test_metrics_are_scalar_tensors(self, plugin):
        logps, mask, advantages = _random_completions(seed=6)
        _, _, metrics = self.loss_and_gradient(plugin, logps, logps + 0.1, advantages, mask, TOKEN)
        missing = set(self.required_metrics) - set(metrics)
        assert not missing, f"required metrics missing: {sorted(missing)} (it reported {sorted(metrics)})"
        for name, value in metrics.items():
            # The trainer gathers each metric across processes and averages it: a 0-dim tensor, NaN allowed.
            assert isinstance(value, torch.Tensor) and value.dim() == 0, f"metric {name!r} is not a scalar tensor"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_gradient_is_the_same_whole_or_accumulated(self, plugin, level):
        if not declared(plugin, "loss", "accumulation_invariant"):
            pytest.skip("the loss does not declare accumulation_invariant=True")
        logps, mask, advantages = _random_completions(seed=8, lengths=(6, 3, 1, 5, 2, 6))
        old = logps + torch.randn(logps.shape, generator=torch.Generator().manual_seed(9)) * 0.3
        total_tokens = float(mask.sum())  # num_items_in_batch: the whole generation batch
        in_order = torch.arange(logps.shape[0])
        by_length = mask.sum(-1).argsort(stable=True)  # as trainer.group_by_length splits a batch

        def accumulated_gradient(order: torch.Tensor, chunks: int) -> torch.Tensor:
            leaf = logps.clone().requires_grad_()
            for rows in order.chunk(chunks):
                value, _ = self.evaluate(
                    plugin,
                    leaf[rows],
                    old[rows],
                    advantages[rows],
                    mask[rows],
                    level,
                    accumulation=chunks,
                    num_items_in_batch=total_tokens,
                )
                value.backward()
            return leaf.grad

        whole = accumulated_gradient(in_order, 1)
        for order_name, order in (("in order", in_order), ("grouped by length", by_length)):
            for chunks in (2, 3):
                _assert_close(
                    accumulated_gradient(order, chunks),
                    whole,
                    what=f"{chunks} equal micro-batches ({order_name}) give another gradient than the whole batch",
                )


# ------------------------------------------------------------------------------------- importance sampling ---


class ImportanceSamplingContract(PluginContract):
    """An importance-sampling level (kinds.py: ImportanceSampling): log weights from log(pi_theta / pi_old)."""

    kind = "importance_sampling"

    def inputs(self, seed=0):
        logps, mask, _ = _random_completions(seed)
        log_ratio = torch.randn(logps.shape, generator=torch.Generator().manual_seed(seed + 1)) * 0.3
        return log_ratio, mask

    def expected_shape(self, plugin, mask) -> tuple[int, int]:
        return tuple(mask.shape) if plugin.level == TOKEN else (mask.shape[0], 1)

    def test_level_and_shape(self, plugin):
        assert plugin.level in (TOKEN, SEQUENCE), f"level must be 'token' or 'sequence', got {plugin.level!r}"
        log_ratio, mask = self.inputs()
        weights = plugin.log_weights(log_ratio, mask)
        expected = self.expected_shape(plugin, mask)
        assert tuple(weights.shape) == expected, f"{plugin.level}-level weights: shape {expected}, got {weights.shape}"
        assert torch.isfinite(weights).all()

    def test_weights_carry_the_gradient(self, plugin):
        log_ratio, mask = self.inputs(seed=2)
        leaf = log_ratio.clone().requires_grad_()
        weights = plugin.log_weights(leaf, mask)
        assert weights.requires_grad, "the log weights must keep the log-ratio's gradient: the loss trains through them"
        (weights * torch.linspace(0.5, 1.5, mask.shape[0]).unsqueeze(1)).sum().backward()
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all(), "no finite gradient reaches the log-ratio"
        assert (leaf.grad * mask).abs().sum() > 0, "the weights do not depend on the active tokens' log-ratios"

    def test_on_policy_weights_are_one(self, plugin):
        _, mask = self.inputs()
        weights = plugin.log_weights(torch.zeros(mask.shape), mask)
        active = weights * mask if plugin.level == TOKEN else weights
        assert torch.allclose(active, torch.zeros_like(active)), "log(pi_theta / pi_old) = 0 must give log weight 0"

    def test_masked_tokens_do_not_matter(self, plugin):
        log_ratio, mask = self.inputs(seed=4)
        padding = mask == 0
        a = plugin.log_weights(log_ratio.masked_fill(padding, 0.0), mask)
        b = plugin.log_weights(log_ratio.masked_fill(padding, 25.0), mask)
        if plugin.level == TOKEN:
            a, b = a * mask, b * mask
        _assert_close(a, b, what="padding changed the active weights")

    def test_a_completion_with_no_active_tokens_keeps_weights_finite(self, plugin):
        log_ratio, _ = self.inputs(seed=6)
        mask = torch.ones(log_ratio.shape)
        mask[1] = 0
        assert torch.isfinite(plugin.log_weights(log_ratio, mask)).all()


# ------------------------------------------------------------------------------------- rollout correction ---


class RolloutCorrectionContract(PluginContract):
    """A rollout correction (kinds.py: RolloutCorrection): the ratio pi_old / pi_sampler, or None for none."""

    kind = "rollout_correction"

    def inputs(self, seed=0, spread=0.5):
        old, mask, _ = _random_completions(seed)
        sampling = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(seed + 1)) * spread
        return old, sampling, mask

    def test_level_and_shape(self, plugin):
        assert plugin.level in (None, TOKEN, SEQUENCE), "level must be None, 'token' or 'sequence'"
        old, sampling, mask = self.inputs()
        ratio = plugin.ratio(old, sampling, mask)
        if plugin.level is None:
            assert ratio is None, "a correction of level None returns None (no correction)"
            return
        assert ratio is not None, f"a {plugin.level}-level correction must return a ratio, not None"
        expected = tuple(mask.shape) if plugin.level == TOKEN else (mask.shape[0], 1)
        assert tuple(ratio.shape) == expected, f"a {plugin.level}-level ratio has shape {expected}, got {ratio.shape}"

    def test_ratio_is_finite_and_non_negative(self, plugin):
        for spread in (0.1, 3.0):  # a close sampler and a far one
            ratio = plugin.ratio(*self.inputs(seed=2, spread=spread))
            if ratio is not None:
                assert torch.isfinite(ratio).all() and (ratio >= 0).all(), f"ratio {ratio}"

    def test_agreeing_sampler_needs_no_correction(self, plugin):
        old, _, mask = self.inputs(seed=3)
        ratio = plugin.ratio(old, old.clone(), mask)
        if ratio is not None:
            active = ratio[mask.bool()] if ratio.shape == mask.shape else ratio
            _assert_close(active, torch.ones_like(active), what="sampler == trainer")

    def test_masked_tokens_do_not_matter(self, plugin):
        old, sampling, mask = self.inputs(seed=4)
        padding = mask == 0
        a = plugin.ratio(old.masked_fill(padding, -0.5), sampling.masked_fill(padding, -0.5), mask)
        b = plugin.ratio(old.masked_fill(padding, -9.0), sampling.masked_fill(padding, -0.1), mask)
        if a is None:
            assert b is None
            return
        if a.shape == mask.shape:
            a, b = a * mask, b * mask
        _assert_close(a, b, what="padding changed the active ratios")

    def test_a_token_the_sampler_did_not_score_keeps_the_ratio_finite(self, plugin):
        old, sampling, mask = self.inputs(seed=5)
        sampling[0, 0] = math.nan  # a backend may report NaN for a log-prob it could not compute
        ratio = plugin.ratio(old, sampling, mask)
        assert ratio is None or torch.isfinite(ratio).all(), f"ratio {ratio}"


# ---------------------------------------------------------------------------------------------- advantage ---


class AdvantageContract(PluginContract):
    """An advantage estimator (kinds.py: Advantage): (N,) advantages from the (N, K) rewards, NaN = None."""

    kind = "advantage"
    num_generations: ClassVar[int] = 4

    def rewards(self) -> torch.Tensor:  # (3 groups x num_generations, 2 rewards)
        generator = torch.Generator().manual_seed(0)
        rewards = torch.rand(3 * self.num_generations, 2, generator=generator).round()
        rewards[: self.num_generations, 0] = torch.arange(self.num_generations, dtype=torch.float)  # spread
        rewards[self.num_generations : 2 * self.num_generations] = torch.tensor([0.5, 1.0])  # all equal
        return rewards

    WEIGHTS = torch.tensor([1.0, 0.5])

    def test_one_advantage_per_completion(self, plugin):
        advantages = plugin(self.rewards(), self.WEIGHTS, self.num_generations)
        assert isinstance(advantages, torch.Tensor) and advantages.shape == (3 * self.num_generations,), (
            f"expected shape ({3 * self.num_generations},), got {getattr(advantages, 'shape', type(advantages))}"
        )
        assert advantages.is_floating_point() and torch.isfinite(advantages).all(), f"advantages {advantages}"

    def test_a_group_with_equal_rewards_gets_zero(self, plugin):
        advantages = plugin(self.rewards(), self.WEIGHTS, self.num_generations)
        equal_group = advantages[self.num_generations : 2 * self.num_generations]
        _assert_close(
            equal_group,
            torch.zeros_like(equal_group),
            "a group whose rewards are all equal teaches nothing",
            atol=1e-6,
            rtol=0,
        )

    def test_unscored_completions(self, plugin):
        rewards = self.rewards()
        rewards[1] = math.nan  # every reward said None: NaN or 0 (the core sets it to 0)
        rewards[2 * self.num_generations, 1] = math.nan  # one reward said None: still a number
        advantages = plugin(rewards, self.WEIGHTS, self.num_generations)
        assert advantages[1].isnan() or advantages[1] == 0, f"an unscorable completion got advantage {advantages[1]}"
        others = torch.cat([advantages[:1], advantages[2:]])
        assert torch.isfinite(others).all(), f"an unscorable completion made others non-finite: {advantages}"

    def test_a_higher_reward_never_gets_a_lower_advantage(self, plugin):
        size = self.num_generations
        shuffled = torch.randperm(size, generator=torch.Generator().manual_seed(0)).float()
        rewards = torch.cat([shuffled, -shuffled]).unsqueeze(1)  # two groups of distinct rewards, one reward
        advantages = plugin(rewards, torch.ones(1), size)
        for start in (0, size):
            group = slice(start, start + size)
            ordered = advantages[group][rewards[group, 0].argsort()]  # by increasing reward
            assert (ordered[1:] >= ordered[:-1] - 1e-6).all(), f"rewards {rewards.view(-1)}: advantages {advantages}"
        assert advantages.abs().sum() > 0, "groups with different rewards got no advantage at all"


# ------------------------------------------------------------------------------------------------- reward ---


def _awaited(value):
    if not inspect.isawaitable(value):
        return value

    async def wait():
        return await value

    return asyncio.run(wait())


class RewardContract(PluginContract):
    """A reward (kinds.py, TRL's signature): one finite number or None per completion, text or chat, sync or async.

    `prompts`, `completions` and `columns` (dataset columns, one value per completion) are what it is called
    with; the defaults are the embedded task's "a+b=" prompts and their `solution` column. A reward that samples
    (an LLM judge, say) sets `deterministic = False`, and its values are not compared between two calls.
    """

    kind = "reward"
    deterministic: ClassVar[bool] = True
    prompts: ClassVar[Sequence[str]] = ("1+2=", "3+4=", "12+30=", "5+5=")
    completions: ClassVar[Sequence[str]] = ("3", "8", "42", "")
    columns: ClassVar[dict] = {"solution": ["3", "7", "42", "10"]}

    def arguments(self, chat: bool = False) -> dict:
        from grpo_kit.embedded.sums import build_tokenizer

        tokenizer = build_tokenizer()
        completion_ids = [tokenizer(text, add_special_tokens=False).input_ids for text in self.completions]
        prompts, completions = list(self.prompts), list(self.completions)
        if chat:
            prompts = [[{"role": "user", "content": text}] for text in prompts]
            completions = [[{"role": "assistant", "content": text}] for text in completions]
        return {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **self.columns}

    def checked(self, values) -> list:
        """The values, after checking them as the run's Scorer does."""
        if hasattr(values, "tolist"):  # a numpy array or a tensor
            values = values.tolist()
        count = len(self.completions)
        assert isinstance(values, (list, tuple)), f"a reward returns a list, got {type(values).__name__}"
        assert len(values) == count, f"{len(values)} values for {count} completions"
        for value in values:
            assert value is None or (isinstance(value, numbers.Real) and math.isfinite(value)), (
                f"each value is a finite number or None, got {value!r} in {values}"
            )
        return list(values)

    def test_scores_text_completions(self, plugin):
        self.checked(_awaited(plugin(**self.arguments())))

    def test_scores_chat_completions(self, plugin):
        self.checked(_awaited(plugin(**self.arguments(chat=True))))

    def test_accepts_any_dataset_column(self, plugin):
        """A dataset's other columns all reach every reward: a reward takes **columns and ignores what it does
        not read."""
        arguments = {**self.arguments(), "an_unrelated_column": [0] * len(self.completions)}
        self.checked(_awaited(plugin(**arguments)))

    def test_the_scorer_gets_the_same_values(self, contract_case, plugin):
        """In a run the Scorer calls it (a thread, or the event loop for async rewards): same values, no failure."""
        from grpo_kit.rollout.scoring import Scorer

        direct = self.checked(_awaited(plugin(**self.arguments())))
        arguments = self.arguments()
        prompts, completions = arguments.pop("prompts"), arguments.pop("completions")
        ids = arguments.pop("completion_ids")
        with Scorer({contract_case.name: plugin}, timeout=60.0, workers=0) as scorer:
            scores, metrics = scorer(prompts, completions, ids, arguments)
        assert metrics[f"rewards/{contract_case.name}/failures"] == 0, "the Scorer's call failed (see the log)"
        assert scores.shape == (len(completions), 1)
        if self.deterministic:
            expected = torch.tensor([math.nan if value is None else float(value) for value in direct])
            _assert_close(scores[:, 0], expected, "the Scorer's values differ from a direct call's", equal_nan=True)

    def test_quick_scores_are_those_of_a_full_call(self, plugin):
        """A reward's `quick_scores` ({row: score}, what the Scorer scores without its worker processes) must give
        each completion it settles the score a full call gives it."""
        if not hasattr(plugin, "quick_scores"):
            pytest.skip("no quick_scores: the Scorer calls the reward on every completion")
        for chat in (False, True):
            full = self.checked(_awaited(plugin(**self.arguments(chat))))
            quick = plugin.quick_scores(**self.arguments(chat))
            assert isinstance(quick, dict) and set(quick) <= set(range(len(full))), (
                f"quick_scores returns {{row: score}} for rows of the batch, got {quick!r}"
            )
            assert quick == {row: full[row] for row in quick}, f"quick scores {quick} differ from a full call's {full}"

    def test_a_cpu_heavy_reward_can_reach_a_worker_process(self, plugin):
        if not getattr(plugin, "cpu_heavy", False):
            pytest.skip("not cpu_heavy: it runs in a thread of the training process")
        copy = pickle.loads(pickle.dumps(plugin))  # what the Scorer sends to its worker processes
        values = self.checked(_awaited(copy(**self.arguments())))
        if self.deterministic:
            assert values == self.checked(_awaited(plugin(**self.arguments()))), "the unpickled copy scores differently"


# --------------------------------------------------------------------------------------------- generation ---


class GenerationContract(PluginContract):
    """A generation backend (kinds.py: Generation) on a tiny random model with the embedded tokenizer.

    The default options sample hot and short, so that some completions end with EOS and some are cut off. The
    model's generation config lists a second EOS id besides the tokenizer's, as Qwen2.5/Qwen3 Instruct's do: a
    backend must end a completion at the first of either (`grpo_kit.eos_token_ids`).
    `reports_sampling_logprobs = False` for a backend that cannot report its own log-probs.
    """

    kind = "generation"
    options: ClassVar[dict] = {"max_completion_length": 6, "temperature": 3.0}
    prompts: ClassVar[Sequence[str]] = ("1+2=", "34+5=") * 32
    reports_sampling_logprobs: ClassVar[bool] = True

    @pytest.fixture(scope="class")
    @classmethod
    def model_and_tokenizer(cls, tmp_path_factory):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpo_kit.testing.models import build_tiny_model

        directory = build_tiny_model(tmp_path_factory.mktemp("generation-contract-model"))
        model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("5")]
        return model, tokenizer

    @pytest.fixture(scope="class")
    @classmethod
    def started(cls, plugin, model_and_tokenizer):
        from accelerate import Accelerator

        model, tokenizer = model_and_tokenizer
        plugin.start(model, tokenizer, Accelerator(cpu=True))
        yield plugin
        plugin.close()

    @pytest.fixture(scope="class")
    @classmethod
    def generated(cls, started, model_and_tokenizer) -> Completions:
        _, tokenizer = model_and_tokenizer
        torch.manual_seed(0)
        return started.generate([tokenizer(p, add_special_tokens=False).input_ids for p in cls.prompts])

    def test_one_completion_per_prompt(self, generated, plugin_config):
        n, limit = len(self.prompts), plugin_config.max_completion_length
        ids, mask, truncated = generated.completion_ids, generated.completion_mask, generated.is_truncated
        assert ids.dim() == 2 and ids.shape[0] == n, f"completion_ids: expected ({n}, T), got {tuple(ids.shape)}"
        assert ids.shape[1] <= limit, f"{ids.shape[1]} tokens, more than max_completion_length={limit}"
        assert mask.shape == ids.shape, f"completion_mask {tuple(mask.shape)} differs from ids {tuple(ids.shape)}"
        assert truncated.shape == (n,) and truncated.dtype == torch.bool, "is_truncated: a (N,) bool tensor"

    def test_mask_covers_up_to_and_including_the_first_eos(self, generated, model_and_tokenizer):
        eos = torch.tensor(eos_token_ids(*model_and_tokenizer))
        ends = []
        for row, (ids, mask) in enumerate(zip(generated.completion_ids, generated.completion_mask)):
            eos_positions = torch.isin(ids, eos).nonzero().view(-1)
            end = eos_positions[0].item() + 1 if len(eos_positions) else len(ids)
            assert mask[:end].all() and not mask[end:].any(), f"completion {row}: ids {ids.tolist()}, mask {mask}"
            ends.append(ids[end - 1].item())
        assert set(eos.tolist()) <= set(ends), f"hot sampling should end completions at every EOS id {eos.tolist()}"

    def test_truncation_flags_agree_with_the_tokens(self, generated, model_and_tokenizer, plugin_config):
        # TRL's rule: cut off where the last token is neither an EOS nor the pad token.
        finishing = set(eos_token_ids(*model_and_tokenizer)) | {model_and_tokenizer[1].pad_token_id}
        for row, (ids, mask, truncated) in enumerate(
            zip(generated.completion_ids, generated.completion_mask, generated.is_truncated)
        ):
            last = ids[mask.bool()][-1].item()
            assert bool(truncated) == (last not in finishing), (
                f"completion {row}: is_truncated={bool(truncated)}, last token {last} (EOS or pad: {sorted(finishing)})"
            )
            if truncated:
                assert int(mask.sum()) == plugin_config.max_completion_length, f"completion {row} stopped early"
        assert generated.is_truncated.any() and not generated.is_truncated.all(), (
            "hot sampling from a random model should both end some completions and cut others off"
        )

    def test_reports_the_samplers_log_probs(self, started, model_and_tokenizer):
        if not self.reports_sampling_logprobs:
            pytest.skip("reports_sampling_logprobs = False: rollout corrections cannot be used with this backend")
        tokenizer = model_and_tokenizer[1]
        out = started.generate(
            [tokenizer(p, add_special_tokens=False).input_ids for p in self.prompts[:8]], with_logprobs=True
        )
        logps = out.sampling_per_token_logps
        assert logps is not None and logps.shape == out.completion_ids.shape, "with_logprobs=True: a (N, T) tensor"
        active = logps[out.completion_mask.bool()]
        assert torch.isfinite(active).all() and (active <= 1e-5).all(), f"log-probs of sampled tokens: {active}"

    def test_takes_new_weights(self, contract_case, plugin_config, model_and_tokenizer):
        """After `update_weights(model, step)`, completions come from the model's new weights. An optimizer step changes
        them in place; here every parameter moves. With top_k=1 any backend decodes greedily, so its completions
        must be those the model itself decodes greedily: with the old weights before, with the new ones after."""
        from accelerate import Accelerator

        model = copy.deepcopy(model_and_tokenizer[0])  # changed below: the class's other tests keep the original
        tokenizer = model_and_tokenizer[1]
        prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in dict.fromkeys(self.prompts)]
        limit = plugin_config.max_completion_length
        greedy = contract_case.registry.build(
            contract_case.kind, contract_case.name, dataclasses.replace(plugin_config, top_k=1)
        )
        greedy.start(model, tokenizer, Accelerator(cpu=True))
        try:
            old = _greedy_completions(model, tokenizer, prompt_ids, limit)
            assert _completion_tokens(greedy.generate(prompt_ids)) == old, (
                f"with top_k=1, completions should be the model's greedy ones: {old}"
            )
            with torch.no_grad():
                generator = torch.Generator().manual_seed(0)
                for parameter in model.parameters():
                    parameter.add_(torch.randn(parameter.shape, generator=generator).to(parameter))
            new = _greedy_completions(model, tokenizer, prompt_ids, limit)
            assert new != old, "changing every weight should change the greedy completions of this test's prompts"
            greedy.update_weights(model, step=1)
            assert _completion_tokens(greedy.generate(prompt_ids)) == new, (
                f"after update_weights, completions should follow the new weights ({new}), not the old ({old})"
            )
        finally:
            greedy.close()

    def test_images_reach_the_sampler(self, contract_case, plugin_config, tmp_path_factory):
        """A backend that declares `accepts_images` samples from the prompts' images: with top_k=1 its completions
        are those a tiny Qwen2-VL decodes greedily from the same prompts and pixels, and they change with the
        image (the same prompt with two different images)."""
        plugin = contract_case.registry.build(
            contract_case.kind, contract_case.name, dataclasses.replace(plugin_config, top_k=1)
        )
        if not declared(plugin, "generation", "accepts_images"):
            pytest.skip("the backend does not declare accepts_images: runs with images refuse it")
        from accelerate import Accelerator
        from PIL import Image
        from transformers import AutoModelForImageTextToText

        from grpo_kit.embedded.vision import ImageOnlyQwen2VLProcessor
        from grpo_kit.rollout.images import ImagePrompts
        from grpo_kit.testing.models import build_tiny_vision_model

        directory = build_tiny_vision_model(tmp_path_factory.mktemp("generation-contract-vision-model"))
        model = AutoModelForImageTextToText.from_pretrained(directory).eval()
        processor = ImageOnlyQwen2VLProcessor.from_pretrained(directory)
        question = [{"role": "user", "content": "how many squares?"}]
        noise = torch.Generator().manual_seed(0)
        pictures = [
            Image.fromarray(torch.randint(0, 256, (56, 56, 3), generator=noise, dtype=torch.uint8).numpy())
            for _ in range(6)
        ]
        rows = [{"prompt": question, "image": picture} for picture in pictures]
        prompt_ids, images = ImagePrompts(processor, "a tiny Qwen2-VL").encode(rows)
        plugin.start(model, processor.tokenizer, Accelerator(cpu=True))
        try:
            completions = _completion_tokens(plugin.generate(prompt_ids, images=images))
        finally:
            plugin.close()
        expected = _greedy_completions(
            model, processor.tokenizer, prompt_ids, plugin_config.max_completion_length, images
        )
        assert completions == expected, f"with top_k=1, the model's greedy completions from these images: {expected}"
        assert len({tuple(tokens) for tokens in completions}) > 1, (
            f"one prompt with {len(pictures)} different images gave the same completions {completions}: the images "
            "do not reach the sampler"
        )


def _greedy_completions(model, tokenizer, prompt_ids, max_completion_length, images=None) -> list[list[int]]:
    """The model's own greedy completions (transformers' generate, one prompt at a time), up to the first EOS."""
    eos = eos_token_ids(model, tokenizer)
    completions = []
    for row, ids in enumerate(prompt_ids):
        input_ids = torch.tensor([ids], device=model.device)
        with_images = {} if images is None else _row_images(images, row).forward_kwargs(model, input_ids)
        out = model.generate(
            input_ids,
            do_sample=False,
            max_new_tokens=max_completion_length,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            **with_images,
        )
        completion = out[0, len(ids) :].tolist()
        ends = [position for position, token in enumerate(completion) if token in eos]
        completions.append(completion[: ends[0] + 1] if ends else completion)
    return completions


def _completion_tokens(completions: Completions) -> list[list[int]]:
    """Each completion's active tokens."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(completions.completion_ids, completions.completion_mask)]


# --------------------------------------------------------------------------------------------------- hook ---


class HookContract(PluginContract):
    """A hook plugin (hookspecs.py, `+hook=NAME`): its `on_*` methods are hooks the run calls."""

    kind = "hook"

    def test_joins_a_run_as_a_valid_pluggy_plugin(self, plugin):
        pm = plugin_manager(autoload=False, local_modules=[], disabled=[])
        pm.register(plugin)  # checks each hook's arguments against its spec
        pm.check_pending()  # fails on a misspelt hook name
        assert pm.get_hookcallers(plugin), "it implements no hook, so a run would never call it"

    def test_every_on_method_is_marked(self, plugin):
        pm = plugin_manager(autoload=False, local_modules=[], disabled=[])
        methods = [name for name in dir(plugin) if name.startswith("on_") and callable(getattr(plugin, name))]
        unmarked = [name for name in methods if pm.parse_hookimpl_opts(plugin, name) is None]
        assert not unmarked, f"{unmarked}: not marked @grpo_kit.hookimpl, so the run never calls them"


class EnvironmentContract(PluginContract):
    """An environment (kinds.py: Environment, `+environment=NAME`): reset per generation, tools that describe
    themselves to the chat template and run in the tool loop.

    `rows` are dataset rows to reset with (by default the embedded tool-use task's); `tool_calls` are calls its
    tools should answer without failing, as (name, arguments) pairs; an environment with state lists calls that
    change it, so that the kit checks that `reset` starts afresh.
    """

    kind = "environment"
    rows: ClassVar[Sequence[dict]] = ()
    tool_calls: ClassVar[Sequence[tuple[str, dict]]] = ()

    @classmethod
    def contract_rows(cls) -> list[dict]:
        from grpo_kit.embedded.tool_use import build_task

        return list(cls.rows) or build_task(3)

    def test_reset_takes_a_row_and_returns_an_observation_or_none(self, plugin):
        for row in self.contract_rows():
            observation = plugin.reset(**row)
            assert observation is None or isinstance(observation, str), (
                f"reset(**row) returned {observation!r}: return a string (appended to the prompt) or None"
            )

    def test_every_tool_describes_itself_to_the_chat_template(self, plugin, contract_case):
        from grpo_kit.rollout.tool_use import check_tool, environment_tools

        tools = environment_tools(plugin)
        assert tools, "it has no public method besides reset, so the model has no tool to call"
        for tool in tools:
            check_tool(tool, str(contract_case))

    def test_tools_answer_in_the_tool_loop(self, plugin):
        from grpo_kit.rollout.tool_use import environment_tools, run_tool_calls, toolbox

        if not self.tool_calls:
            pytest.skip("tool_calls = [(name, arguments), ...] names calls its tools should answer")
        plugin.reset(**self.contract_rows()[0])
        [(messages, failed)] = run_tool_calls([(self._calls(), toolbox(environment_tools(plugin)))], timeout=30.0)
        assert failed == 0, f"tool calls failed: {[m['content'] for m in messages]}"

    def test_reset_starts_afresh(self, plugin):
        """The same calls after `reset(**row)` get the same answers, whatever came before."""
        from grpo_kit.rollout.tool_use import environment_tools, run_tool_calls, toolbox

        if not self.tool_calls:
            pytest.skip("tool_calls = [(name, arguments), ...] names calls its tools should answer")
        answers = []
        for _ in range(2):
            plugin.reset(**self.contract_rows()[0])
            [(messages, _)] = run_tool_calls([(self._calls(), toolbox(environment_tools(plugin)))], timeout=30.0)
            answers.append([message["content"] for message in messages])
        assert answers[0] == answers[1], f"answers after reset differ: {answers[0]} then {answers[1]}"

    def _calls(self) -> list[dict]:
        return [
            {"type": "function", "function": {"name": name, "arguments": dict(arguments)}}
            for name, arguments in self.tool_calls
        ]


class RolloutContract(PluginContract):
    """A custom rollout (kinds.py: CustomRollout, `+rollout=NAME`) on the embedded tokenizer and a tiny random model
    behind the transformers backend: one result per row, lists that agree in length, token ids of the vocabulary."""

    kind = "rollout"
    rows: ClassVar[Sequence[dict]] = tuple({"prompt": prompt, "solution": "3"} for prompt in ("1+2=", "0+3=") * 4)

    @pytest.fixture(scope="class")
    @classmethod
    def result(cls, plugin, tmp_path_factory):
        from accelerate import Accelerator
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpo_kit.testing.models import build_tiny_model

        directory = build_tiny_model(tmp_path_factory.mktemp("rollout-contract-model"))
        model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
        generation = Registry().build("generation", "transformers", {"max_completion_length": 6})
        generation.start(model, tokenizer, Accelerator(cpu=True))
        try:
            return plugin(list(cls.rows), tokenizer, generation), tokenizer
        finally:
            generation.close()

    def test_one_result_per_row(self, result):
        result, _ = result
        n = len(self.rows)
        assert len(result.prompt_ids) == n and len(result.completion_ids) == n, (
            f"{len(result.prompt_ids)} prompts and {len(result.completion_ids)} completions for {n} rows"
        )
        for name, values in result.columns.items():
            assert len(values) == n, f"column {name!r} has {len(values)} values for {n} rows"

    def test_per_token_lists_match_the_completions(self, result):
        result, tokenizer = result
        for field_name in ("logprobs", "env_mask"):
            values = getattr(result, field_name)
            if values is not None:
                lengths = [len(v) for v in values], [len(ids) for ids in result.completion_ids]
                assert lengths[0] == lengths[1], f"{field_name}: lengths {lengths[0]} for completions of {lengths[1]}"
        vocabulary = len(tokenizer)
        for ids in [*result.prompt_ids, *result.completion_ids]:
            assert all(isinstance(i, int) and 0 <= i < vocabulary for i in ids), f"not token ids: {ids}"


_CONTRACT_OF_KIND = {
    "loss": LossContract.__name__,
    "importance_sampling": ImportanceSamplingContract.__name__,
    "rollout_correction": RolloutCorrectionContract.__name__,
    "advantage": AdvantageContract.__name__,
    "reward": RewardContract.__name__,
    "generation": GenerationContract.__name__,
    "hook": HookContract.__name__,
    "environment": EnvironmentContract.__name__,
    "rollout": RolloutContract.__name__,
}


def _row_images(images: PromptImages, row: int) -> PromptImages:
    """The images of prompt `row` alone (Qwen2-VL's layout: each image's grid, and its patches in order)."""
    grids = images.model_inputs["image_grid_thw"]  # (images, 3)
    first = sum(len(row_images) for row_images in images.images[:row])
    count = len(images.images[row])
    patches = grids.prod(dim=-1)  # (images,)
    start, stop = int(patches[:first].sum()), int(patches[: first + count].sum())
    return PromptImages(
        [images.images[row]],
        {
            "pixel_values": images.model_inputs["pixel_values"][start:stop],
            "image_grid_thw": grids[first : first + count],
        },
    )

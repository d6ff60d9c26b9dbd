"""Whether a distribution's tests check every plugin it registers."""

from grpo_kit.contract.kinds import KINDS
from grpo_kit.plugins.inventory import split_distribution
from grpo_kit.plugins.registry import Registry
from grpo_kit.testing.contracts.advantage import AdvantageContract
from grpo_kit.testing.contracts.environment import EnvironmentContract
from grpo_kit.testing.contracts.generation import GenerationContract
from grpo_kit.testing.contracts.hook import HookContract
from grpo_kit.testing.contracts.importance_sampling import ImportanceSamplingContract
from grpo_kit.testing.contracts.loss import LossContract
from grpo_kit.testing.contracts.plugin import PluginContract
from grpo_kit.testing.contracts.reward import RewardContract
from grpo_kit.testing.contracts.rollout import RolloutContract
from grpo_kit.testing.contracts.rollout_correction import RolloutCorrectionContract
from grpo_kit.testing.contracts.sampler import SamplerContract


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
    "sampler": SamplerContract.__name__,
}

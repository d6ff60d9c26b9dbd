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

Each kind's suite is a module of this package (loss.py, reward.py, ...), beside what they share (plugin.py,
checks.py); a plugin's tests import them from the package, as above.
"""

from grpo_kit.testing.contracts.advantage import AdvantageContract
from grpo_kit.testing.contracts.coverage import assert_contracts_cover
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
    "SamplerContract",
    "assert_contracts_cover",
]

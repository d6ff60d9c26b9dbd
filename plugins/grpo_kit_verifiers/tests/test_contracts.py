"""The verifiers rollout and reward against the conformance kit (grpo_kit.testing.contracts)."""

from grpo_kit.testing.contracts import RewardContract, RolloutContract, assert_contracts_cover
from grpo_kit_verifiers.tasks import load_taskset, rows


class TestVerifiersRollout(RolloutContract):
    """Episodes of the offline sums taskset, in its own harness (one request each), on the contract's tiny model."""

    plugin_name = "verifiers"
    options = {"harness": "", "max_completion_length": 6}
    rows = tuple(rows(load_taskset("grpo-kit-vf-sums"), 4) * 2)


class TestVerifiersReward(RewardContract):
    plugin_name = "verifiers"
    columns = {
        "verifiers_reward": [1.0, 0.0, 0.5, 0.0],
        "verifiers_scores": [{"correct": 1.0}, {"correct": 0.0}, {"correct": 0.5}, {"correct": None}],
    }


def test_every_plugin_is_checked():
    assert_contracts_cover("grpo-kit-verifiers", globals())

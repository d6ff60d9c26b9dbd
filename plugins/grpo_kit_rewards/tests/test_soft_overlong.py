import pytest

from grpo_kit_rewards.configs import SoftOverlongConfig
from grpo_kit_rewards.soft_overlong import SoftOverlong


def punishment(lengths, max_completion_len=100, soft_punish_cache=20):
    config = SoftOverlongConfig(max_completion_len=max_completion_len, soft_punish_cache=soft_punish_cache)
    reward = SoftOverlong(config)
    return reward(["q"] * len(lengths), ["c"] * len(lengths), [[1] * n for n in lengths])


def test_trl_documented_example():
    assert punishment([90]) == [-0.5]


def test_ramp():
    assert punishment([0, 80, 81, 95, 100, 101]) == pytest.approx([0.0, 0.0, -0.05, -0.75, -1.0, -1.0])


def test_no_cache_punishes_only_past_the_limit():
    assert punishment([100, 101], soft_punish_cache=0) == [0.0, -1.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"soft_punish_cache": None}, "soft_punish_cache must be set"),
        ({"soft_punish_cache": 200}, "between 0 and max_completion_len=100"),
        ({"max_completion_len": 0, "soft_punish_cache": 0}, "max_completion_len must be a positive"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        SoftOverlong(SoftOverlongConfig(**{"max_completion_len": 100, **options}))

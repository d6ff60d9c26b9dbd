"""What each built-in sampler draws, with worked cases."""

import math

import datasets
import pytest
import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.plugins.registry import Registry
from grpo_kit.rollout.prompts import PromptSampler


def prompts(size: int, **columns) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"prompt": [f"{index}+1=" for index in range(size)], **columns})


def started(name: str, size: int, seed: int = 0, shuffle: bool = True, dataset=None, **options):
    sampler = Registry().build("sampler", name, options)
    sampler.start(dataset if dataset is not None else prompts(size), seed, shuffle)
    return sampler


def groups(*pass_counts: int, size: int = 4) -> torch.Tensor:  # (G, size): that many 1s in each group
    return torch.tensor([[1.0] * passed + [0.0] * (size - passed) for passed in pass_counts])


def test_uniform_draws_what_grpo_kit_drew_before_samplers_were_plugins():
    """The order the former built-in PromptSampler drew (recorded from it at 9e946e5), two processes' shares."""
    dataset = prompts(7)
    shares = [PromptSampler(dataset, Registry().build("sampler", "uniform", {}), 3, True, rank, 2) for rank in (0, 1)]
    drawn = [[[int(row["prompt"].split("+")[0]) for row in share.draw(3)] for _ in range(4)] for share in shares]
    assert drawn == [
        [[1, 5, 3], [0, 4, 6], [2, 4, 5], [2, 0, 5]],
        [[4, 6, 2], [5, 0, 1], [3, 1, 3], [6, 3, 1]],
    ]
    in_order = PromptSampler(dataset, Registry().build("sampler", "uniform", {}), 3, False)
    assert [[int(row["prompt"][0]) for row in in_order.draw(3)] for _ in range(4)] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 0, 1],
        [2, 3, 4],
    ]


def test_difficulty_pools_follow_the_pass_rate_and_draw_their_shares():
    sampler = started("difficulty_pool", 30, set_aside_passes=0, easy_share=0.5, medium_share=0.0, hard_share=0.5)
    easy, hard = list(range(10)), list(range(10, 20))  # 20..29 are never scored: medium
    sampler.observe(easy + hard, groups(*[4] * 10, *[0] * 10))
    metrics = sampler.metrics()
    assert (metrics["pool/easy"], metrics["pool/medium"], metrics["pool/hard"]) == (10, 10, 10)
    drawn = sampler.draw(8)
    assert sorted(drawn[:4]) == sorted(set(drawn[:4])) and set(drawn[:4]) <= set(easy)
    assert set(drawn[4:]) <= set(hard)
    assert sampler.metrics()["drawn/easy"] == 4


def test_a_pool_too_small_for_its_share_leaves_it_to_the_others():
    sampler = started("difficulty_pool", 10, set_aside_passes=0)
    sampler.observe([0], groups(0))  # one hard prompt; the hard share of 10 is 1, easy's 1 finds none
    drawn = sampler.draw(10)
    assert sorted(drawn) == list(range(10))


def test_solved_and_unsolvable_prompts_sit_out_a_pass():
    sampler = started("difficulty_pool", 8, set_aside_passes=1)
    sampler.observe([0, 1, 2], groups(4, 0, 2))  # solved, unsolvable, spread
    assert sampler.metrics()["set_aside"] == 2
    first_pass = [index for _ in range(4) for index in sampler.draw(2)]  # 8 prompts drawn: one pass
    assert 0 not in first_pass and 1 not in first_pass and 2 in first_pass
    assert sampler.metrics()["set_aside"] == 0  # back after the pass


def test_the_curriculum_starts_easy_and_widens_at_its_pace():
    dataset = prompts(20, difficulty=[19 - index for index in range(20)])  # index 19 is the easiest
    sampler = started("curriculum", 20, dataset=dataset, column="difficulty", start_share=0.25, full_after=40)
    assert set(sampler.draw(5)) == {15, 16, 17, 18, 19}  # the easiest quarter, all of it
    assert sampler.metrics()["pool_size"] == pytest.approx(math.ceil((0.25 + 0.75 * 5 / 40) * 20))
    for _ in range(7):
        sampler.draw(5)
    assert sampler.metrics()["pool_share"] == 1.0
    hardest_first = started("curriculum", 20, dataset=dataset, column="difficulty", descending=True)
    assert set(hardest_first.draw(5)) == {0, 1, 2, 3, 4}


def test_skip_flat_groups_skips_prompts_whose_last_groups_had_no_spread():
    sampler = started("skip_flat_groups", 6, groups=2)
    sampler.observe([0, 1, 2], groups(4, 0, 2))
    sampler.observe([0, 1, 2], groups(4, 2, 0))  # 0 flat twice; 1 flat then spread; 2 spread then flat
    drawn = [index for _ in range(5) for index in sampler.draw(6)]
    assert 0 not in drawn and {1, 2, 3, 4, 5} <= set(drawn)
    metrics = sampler.metrics()
    assert metrics["flat_group_share"] == pytest.approx(4 / 6) and metrics["flagged"] == 1
    assert metrics["skipped"] > 0


def test_when_every_prompt_is_skipped_the_run_still_draws():
    sampler = started("skip_flat_groups", 3, groups=1)
    sampler.observe([0, 1, 2], groups(4, 4, 0))
    assert len(sampler.draw(5)) == 5


@pytest.mark.parametrize(
    "name, options, start, message",
    [
        ("curriculum", {}, {}, "sampler.column=NAME"),
        ("curriculum", {"column": "nope"}, {}, "no such column"),
        ("curriculum", {"column": "difficulty"}, {"shuffle": False}, "data.shuffle=false"),
        ("difficulty_pool", {"easy_share": 0.5}, {}, "add up to 1"),
        ("difficulty_pool", {"hard_below": 0.8}, {}, "hard_below <= easy_above"),
        ("difficulty_pool", {}, {"shuffle": False}, "data.shuffle=false"),
        ("skip_flat_groups", {"groups": 0}, {}, "at least 1"),
    ],
)
def test_bad_sampler_settings_are_refused(name, options, start, message):
    with pytest.raises(ConfigError, match=message):
        sampler = Registry().build("sampler", name, options)
        sampler.start(prompts(5, difficulty=[1, 2, 3, 4, 5]), 0, start.get("shuffle", True))

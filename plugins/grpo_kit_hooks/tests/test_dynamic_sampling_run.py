"""Dynamic sampling in real runs on a tiny model: the batches trained on have no flat groups with the hook, and
some without it."""

import json

import grpo_kit
from grpo_kit.testing import tiny_run


def logged(run_dir, name: str) -> list[float]:
    return [json.loads(line)[name] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_hook_leaves_no_group_without_spread(digits_registry, tiny_model, tmp_path):
    # One-token completions and pairs: `digits` scores each 0 or 1, so about half the groups are flat.
    overrides = tiny_run(
        tiny_model, "+reward=digits", "generation.num_generations=2", "generation.max_completion_length=1"
    )
    grpo_kit.train(grpo_kit.compose(overrides, digits_registry), tmp_path / "without", digits_registry)
    grpo_kit.train(
        grpo_kit.compose([*overrides, "+hook=dynamic_sampling", "hook.dynamic_sampling.max_draws=10"], digits_registry),
        tmp_path / "with",
        digits_registry,
    )

    assert max(logged(tmp_path / "without", "frac_reward_zero_std")) > 0
    assert max(logged(tmp_path / "with", "dynamic_sampling/zero_std_before")) > 0  # the hook had groups to replace
    assert logged(tmp_path / "with", "frac_reward_zero_std") == [0.0, 0.0, 0.0]

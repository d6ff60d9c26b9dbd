"""The batch plan: TRL's batch arithmetic, computed once from the config, the process count and the dataset size."""

import pytest
from omegaconf import OmegaConf

from grpo_kit.contract.errors import ConfigError
from grpo_kit.training.plan import BatchPlan


def config(per_device=4, accumulation=2, steps_per_generation=None, num_iterations=1, num_generations=4, **trainer):
    return OmegaConf.create(
        {
            "trainer": {
                "per_device_train_batch_size": per_device,
                "gradient_accumulation_steps": accumulation,
                "max_steps": trainer.get("max_steps", 10),
                "num_train_epochs": trainer.get("num_train_epochs", 1.0),
            },
            "algorithm": {"steps_per_generation": steps_per_generation, "num_iterations": num_iterations},
            "generation": {"num_generations": num_generations},
        }
    )


def test_a_generation_batch_is_one_step_by_default_and_trained_on_num_iterations_times():
    plan = BatchPlan.of(config(num_iterations=2), num_processes=2, num_prompts=100)
    assert plan.steps_per_generation == 2 and plan.generation_batch_size == 8 and plan.prompts_per_generation == 2
    assert plan.micro_steps_per_batch == 4 and plan.off_policy  # the second pass comes after an optimizer step
    assert [plan.generation_due(micro_step) for micro_step in range(6)] == [True, False, False, False, True, False]
    assert plan.prompts_per_step == 2 * 2 * 2 / 4


def test_one_pass_over_a_batch_of_one_step_is_on_policy():
    assert not BatchPlan.of(config(), num_processes=1, num_prompts=100).off_policy
    assert BatchPlan.of(config(steps_per_generation=4), num_processes=1, num_prompts=100).off_policy


def test_a_generation_batch_of_partial_groups_is_refused():
    with pytest.raises(ConfigError, match="not a multiple of generation.num_generations=3"):
        BatchPlan.of(config(num_generations=3), num_processes=1, num_prompts=100)


def test_max_steps_minus_one_counts_the_steps_of_the_epochs():
    # 100 prompts over 2 processes of 2 prompts each: 25 generation batches of one step each, an epoch and a half.
    plan = BatchPlan.of(config(max_steps=-1, num_train_epochs=1.5), num_processes=2, num_prompts=100)
    assert plan.max_steps == 38


def test_the_plan_is_one_log_line():
    line = BatchPlan.of(config(num_iterations=2), num_processes=2, num_prompts=100).describe()
    assert "\n" not in line
    assert line.startswith("Batches: 2 prompts x 4 completions per generation batch on each of 2 processes")
    assert "old log-probs computed" in line

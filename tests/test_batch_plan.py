"""The batch plan: TRL's batch arithmetic, computed once from the config, the process count and the dataset size."""

import pytest
import trl
from omegaconf import OmegaConf

from grpo_kit.contract.errors import ConfigError
from grpo_kit.training.plan import BatchPlan


def config(
    per_device=4,
    accumulation=2,
    steps_per_generation=None,
    num_iterations=1,
    num_generations=4,
    batch_size=None,
    **trainer,
):
    return OmegaConf.create(
        {
            "trainer": {
                "per_device_train_batch_size": per_device,
                "gradient_accumulation_steps": accumulation,
                "max_steps": trainer.get("max_steps", 10),
                "num_train_epochs": trainer.get("num_train_epochs", 1.0),
            },
            "algorithm": {"steps_per_generation": steps_per_generation, "num_iterations": num_iterations},
            "generation": {"num_generations": num_generations, "batch_size": batch_size},
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


@pytest.mark.parametrize(
    ("per_device", "accumulation", "batch_size", "num_generations"), [(4, 2, 24, 4), (2, 1, 16, 8), (3, 4, 6, 2)]
)
def test_generation_batch_size_sets_steps_per_generation_as_trl_does(
    per_device, accumulation, batch_size, num_generations
):
    trl_config = trl_grpo_config(
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        generation_batch_size=batch_size,
        num_generations=num_generations,
    )
    ours = config(per_device, accumulation, num_generations=num_generations, batch_size=batch_size)
    plan = BatchPlan.of(ours, num_processes=1, num_prompts=100)
    assert plan.steps_per_generation == trl_config.steps_per_generation
    assert plan.generation_batch_size == trl_config.generation_batch_size == batch_size


def test_generation_batch_size_counts_the_completions_of_every_process():
    plan = BatchPlan.of(config(per_device=4, batch_size=32), num_processes=2, num_prompts=100)
    assert plan.steps_per_generation == 4 and plan.generation_batch_size == 16  # each process's half


@pytest.mark.parametrize(
    ("settings", "trl_settings", "trl_message", "message"),
    [
        (
            {"batch_size": 16, "steps_per_generation": 2},
            {"generation_batch_size": 16, "steps_per_generation": 2},
            "can not be both configured",
            "generation.batch_size=16 and algorithm.steps_per_generation=2 both set",
        ),
        (
            {"batch_size": 10},
            {"generation_batch_size": 10},
            "must be divisible by the global batch size",
            "multiple of trainer.per_device_train_batch_size=4",
        ),
        (
            {"batch_size": 12, "num_generations": 8},
            {"generation_batch_size": 12, "num_generations": 8},
            r"must be divisible by num_generations \(8\)",
            "generation.batch_size=12 is not a multiple of generation.num_generations=8",
        ),
    ],
)
def test_generation_batch_sizes_trl_refuses_are_refused(settings, trl_settings, trl_message, message):
    with pytest.raises(ValueError, match=trl_message):
        trl_grpo_config(per_device_train_batch_size=4, **trl_settings)
    with pytest.raises(ConfigError, match=message):
        BatchPlan.of(config(**settings), num_processes=1, num_prompts=100)


def trl_grpo_config(**fields) -> trl.GRPOConfig:
    """TRL's own GRPOConfig, as it validates and derives its batch sizes on one CPU process."""
    return trl.GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **fields)

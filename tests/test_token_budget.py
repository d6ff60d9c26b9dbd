"""Micro-batches by token budget (trainer.max_tokens_per_micro_batch): the step's gradient of fixed micro-batches,
for each way a loss reduces; the optimizer steps of a run unchanged."""

import json

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.packing import use_packing
from grpo_kit.objective.policy_loss import build_policy_loss
from grpo_kit.testing import tiny_run
from grpo_kit.training.batches import split, token_budget
from grpo_kit.training.optimization import Optimization
from grpo_kit.training.token_budget import TokenBudget

from .test_batching import generation_batch

TOLERANCE = 1e-6  # relative to each parameter's largest gradient: only the order of float sums changes
STEPS, ACCUMULATION = 4, 4  # micro-steps in the generation batch, and in an optimizer step


def accumulated_gradient(policy_loss, model, budget: TokenBudget, batch, max_completion_length: int):
    """One optimizer step's accumulated gradient through Optimization.train_on (the step itself left out), and
    the number of forward passes each micro-step took."""
    rows_per_micro_batch = None if budget.max_tokens is None else len(batch.advantages) / STEPS
    reduction = grpo_kit.Reduction(
        float(batch.completion_mask.sum()), ACCUMULATION, STEPS, 1, max_completion_length, rows_per_micro_batch
    )
    optimization = Optimization(model, None, None, Accelerator(cpu=True), policy_loss, 1.0, budget=budget)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    micro_steps = split(batch, STEPS, ACCUMULATION, by_length=False, budget=budget)
    for micro_batch in micro_steps:
        optimization.train_on(micro_batch, reduction, finite=True, ends_step=False)
    gradient = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    return gradient, [len(budget.parts(micro_batch)) for micro_batch in micro_steps]


def assert_same_gradient(actual, expected, tolerance=TOLERANCE):
    for name, gradient in expected.items():
        difference = (actual[name] - gradient).abs().max() / gradient.abs().max().clamp(min=1e-8)
        assert difference <= tolerance, f"{name}: the gradient differs by {difference:.2e} (relative)"


@pytest.mark.parametrize(
    ("loss", "packing"),
    [("dapo", False), ("grpo", False), ("dr_grpo", False), ("luspo", False), ("grpo", True), ("dr_grpo", True)],
)
def test_a_token_budget_gives_the_gradient_of_fixed_micro_batches(registry, tiny_model, loss, packing):
    """dapo divides by the step's tokens, grpo averages sequences, dr_grpo divides by a constant per sequence, luspo
    weighs sequences by length: each reduction's step gradient stays that of fixed micro-batches."""
    cfg = grpo_kit.compose(tiny_run(tiny_model, f"+loss={loss}", "algorithm.beta=0.0"), registry)
    objective = grpo_kit.build_objective(cfg, registry)
    policy_loss = build_policy_loss(cfg, objective)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = generation_batch(model.config.vocab_size, size=16)
    fixed, passes = accumulated_gradient(policy_loss, model, TokenBudget(None, False), batch, cfg_length(cfg))
    assert passes == [1] * STEPS
    if packing:
        use_packing(model)
    budget = TokenBudget(max_tokens=20 if packing else 30, packing=packing)
    budgeted, passes = accumulated_gradient(policy_loss, model, budget, batch, cfg_length(cfg))
    assert len(passes) == STEPS and sum(passes) > STEPS, f"the budget cut nothing: {passes}"
    assert_same_gradient(budgeted, fixed, 1e-5 if packing else TOLERANCE)


def cfg_length(cfg) -> int:
    return cfg.generation.max_completion_length


def test_micro_batches_fit_the_budget_shortest_first_and_a_long_row_goes_alone():
    batch = generation_batch(vocab_size=20, size=16, prompt_length=3, length=12)
    budget = TokenBudget(max_tokens=40, packing=False)
    torch.manual_seed(0)
    micro_steps = split(batch, STEPS, ACCUMULATION, by_length=False, budget=budget)
    rows = sorted(row for micro_batch in micro_steps for row in micro_batch.advantages.tolist())
    assert rows == sorted(batch.advantages.tolist())  # every completion once
    sizes = []
    for micro_batch in micro_steps:
        for part in budget.parts(micro_batch):
            width = part.completion_ids.shape[1]
            assert width == int(part.completion_mask.sum(1).max())  # cut to its own longest
            assert len(part.advantages) * (3 + width) <= 40 or len(part.advantages) == 1
            sizes.append(len(part.advantages))
    assert max(sizes) > 4 > min(sizes), "short completions share a micro-batch, long ones get few rows"
    lone = TokenBudget(max_tokens=5, packing=False)  # every row is over it
    assert all(len(group) == 1 for group in lone.groups(micro_steps[0]))


def test_a_budget_larger_than_the_step_still_gives_each_micro_step_completions():
    batch = generation_batch(vocab_size=20, size=16)
    torch.manual_seed(0)
    micro_steps = split(batch, STEPS, ACCUMULATION, by_length=False, budget=TokenBudget(10**6, False))
    assert [len(micro_batch.advantages) for micro_batch in micro_steps] == [4, 4, 4, 4]


def test_a_budget_that_would_change_the_gradient_is_refused(registry):
    cfg = grpo_kit.compose(["+reward=accuracy", "+loss=bnpo", "trainer.max_tokens_per_micro_batch=512"], registry)
    objective = grpo_kit.build_objective(cfg, registry)
    with pytest.raises(ConfigError, match="does not declare accumulation_invariant"):
        token_budget(cfg, objective.loss, 1)
    cfg.trainer.max_tokens_per_micro_batch = 0
    with pytest.raises(ConfigError, match="at least 1"):
        token_budget(cfg, objective.loss, 1)


@pytest.mark.slow
def test_a_run_with_a_budget_and_packing_takes_the_same_optimizer_steps(registry, tiny_model, tmp_path):
    def logged(directory, *overrides):
        common = ("+reward=accuracy", "trainer.gradient_accumulation_steps=2", "trainer.save_model=false")
        grpo_kit.train(grpo_kit.compose(tiny_run(tiny_model, *common, *overrides), registry), directory, registry)
        lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
        return [(line["step"], line["learning_rate"]) for line in lines if "loss" in line]

    plain = logged(tmp_path / "plain")
    budgeted = logged(tmp_path / "budget", "trainer.max_tokens_per_micro_batch=64", "trainer.packing=true")
    assert budgeted == plain and [step for step, _ in plain] == [1, 2, 3]

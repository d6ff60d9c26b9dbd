"""Adaptive entropy control (Skywork-OR1, arXiv 2505.22312) as TRL 1.16 runs it: grpo_kit's optimizer steps against
TRL's own `_compute_loss`, fed the entropies and log-probs of grpo_kit's training passes; and its exact resume.

TRL updates the coefficient inside `_compute_loss`, on the micro-batch that ends an accumulation window; grpo_kit
updates it in `Optimization.train_on`. The model's learning rate is 0, so that each step's entropies are those of
its batches alone and the target can be placed among them: below every step, above every step, and between.
"""

import json
import math
import types
from collections import defaultdict

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.objective.objective import build_objective, high_entropy_mask
from grpo_kit.objective.policy_loss import build_policy_loss
from grpo_kit.testing import tiny_run
from grpo_kit.testing.micro_batches import half_a_generation_batch, random_micro_batch, trl_inputs
from grpo_kit.training.optimization import Optimization

STEPS, ACCUMULATION, LENGTH = 6, 2, 6
CONTROL = [  # the coefficient starts at 0.03 and is clamped to [0.01, 0.06] within a few steps
    "algorithm.use_adaptive_entropy=true",
    "algorithm.entropy_coef=0.03",
    "algorithm.entropy_coef_delta=0.02",
    "algorithm.entropy_coef_min=0.01",
    "algorithm.entropy_coef_max=0.06",
]


def trl_stand_in(trl, cfg, accelerator):
    """The trainer state TRL's `_compute_loss` reads and its adaptive controller keeps, for our config."""
    algo, loss = cfg.algorithm, cfg.loss
    epsilon = loss.get("epsilon", 0.2)
    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(
            entropy_target=algo.entropy_target,
            entropy_coef_delta=algo.entropy_coef_delta,
            entropy_coef_min=algo.entropy_coef_min,
            entropy_coef_max=algo.entropy_coef_max,
            steps_per_generation=ACCUMULATION,
            delta=None,
            use_bias_correction_kl=True,
        ),
        loss_type=loss.name,
        epsilon_low=epsilon,
        epsilon_high=loss.get("epsilon_high") or epsilon,
        beta=0.0,
        importance_sampling_level="token",
        top_entropy_quantile=algo.top_entropy_quantile,
        off_policy_mask_threshold=None,
        entropy_coef=algo.entropy_coef,
        use_adaptive_entropy=True,
        _entropy_bonus_enabled=True,
        _last_world_entropy=math.inf,
        _entropy_window_stats=None,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        aux_loss_enabled=False,
        current_gradient_accumulation_steps=ACCUMULATION,
        max_completion_length=LENGTH,
        model=types.SimpleNamespace(training=True),
        accelerator=accelerator,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    trainer.get_high_entropy_mask = types.MethodType(trl.GRPOTrainer.get_high_entropy_mask, trainer)
    return trainer


def step_entropies(policy_loss, model, batches, quantile):
    """Each step's mean entropy over the tokens the bonus acts on, as the controller measures it."""
    means = []
    for step in range(STEPS):
        totals = torch.zeros(2)
        for batch in batches[step * ACCUMULATION : (step + 1) * ACCUMULATION]:
            _, entropies = policy_loss.logps(model, batch)
            mask = batch.loss_mask().float()
            if quantile < 1.0:
                mask = mask * high_entropy_mask(entropies, mask, 1 - quantile)
            totals += torch.stack([(entropies * mask).sum(), mask.sum()])
        means.append((totals[0] / totals[1]).item())
    return sorted(means)


@pytest.mark.parametrize("quantile", [1.0, 0.5])
@pytest.mark.parametrize("loss", ["grpo", "dapo"])
def test_coefficient_losses_and_logs_equal_trl_step_by_step(registry, trl, tiny_model, loss, quantile):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batches = [random_micro_batch(model.config.vocab_size, length=LENGTH, seed=seed) for seed in range(STEPS * 2)]
    overrides = [
        f"+loss={loss}",
        f"algorithm.top_entropy_quantile={quantile}",
        *CONTROL,
        f"trainer.gradient_accumulation_steps={ACCUMULATION}",
        f"generation.max_completion_length={LENGTH}",
    ]
    plain = grpo_kit.compose(overrides, registry)
    measured = step_entropies(build_policy_loss(plain, build_objective(plain, registry)), model, batches, quantile)
    middle = len(measured) // 2
    targets = [measured[0] - 0.1, (measured[middle - 1] + measured[middle]) / 2, measured[-1] + 0.1]
    reached = []
    for target in targets:
        cfg = grpo_kit.compose([*overrides, f"algorithm.entropy_target={target}"], registry)
        policy_loss = build_policy_loss(cfg, build_objective(cfg, registry))
        accelerator = Accelerator(cpu=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        ours = Optimization(model, optimizer, scheduler, accelerator, policy_loss, 1.0)
        theirs = trl_stand_in(trl, cfg, accelerator)
        coefficients, logged = [], []
        for index, batch in enumerate(batches):
            ends_step = index % ACCUMULATION == ACCUMULATION - 1
            reduction = half_a_generation_batch(batch, LENGTH, ACCUMULATION, ACCUMULATION)
            out, finite, _ = ours.train_on(batch, reduction, True, ends_step)
            assert finite
            with torch.no_grad():
                logps, entropies = policy_loss.logps(model, batch)
            theirs._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, entropies, None)
            accelerator.sync_gradients = ends_step
            # TRL reads the generation batch's token count from its inputs
            trl_batch = trl_inputs(batch) | {"num_items_in_batch": torch.tensor(reduction.num_items_in_batch)}
            expected = trl.GRPOTrainer._compute_loss(theirs, None, trl_batch)
            where = f"{loss}, quantile {quantile}, target {target:.4f}, micro-batch {index}"
            torch.testing.assert_close(out.loss.detach(), expected, atol=1e-6, rtol=1e-6, msg=where)
            torch.testing.assert_close(
                out.metrics["policy_loss"].item() / (1 if loss == "grpo" else ACCUMULATION),
                theirs._metrics["train"]["policy_loss"][-1],
                atol=1e-6,
                rtol=1e-6,
                msg=where,
            )
            if ends_step:
                assert policy_loss.objective.entropy_control.coef == pytest.approx(theirs.entropy_coef, abs=1e-12), (
                    where
                )
                assert policy_loss.objective.entropy_control.last_entropy == pytest.approx(
                    theirs._last_world_entropy, rel=1e-6
                ), where
                coefficients.append(policy_loss.objective.entropy_control.coef)
                logged.append(out.metrics["entropy_coef"].item())
            else:
                assert "entropy_coef" not in out.metrics
        assert logged == pytest.approx(theirs._metrics["train"]["entropy_coef"])
        assert logged == pytest.approx(coefficients)
        reached.append((min(coefficients), max(coefficients)))
    # The targets drove the coefficient to its floor, to its ceiling, and both ways in between.
    assert reached[0] == pytest.approx((0.01, 0.01)) and reached[2] == pytest.approx((0.05, 0.06))
    assert reached[1][0] < reached[1][1]


def test_every_step_applies_the_coefficient_the_last_step_left(registry, tiny_model):
    """Below the target the bonus is off on the first step (no measurement yet), then on at the raised coefficient;
    above it, the coefficient falls to its floor and the bonus stays off."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = random_micro_batch(model.config.vocab_size, length=LENGTH)
    for target, applied, final in [(100.0, [0.0, 0.05, 0.06], 0.06), (0.0, [0.0, 0.0, 0.0], 0.01)]:
        cfg = grpo_kit.compose([*CONTROL, f"algorithm.entropy_target={target}"], registry)
        objective = build_objective(cfg, registry)
        seen = []
        for _ in range(3):
            seen.append(objective.entropy_control.applied_coef())
            out = objective(torch.zeros(4, LENGTH), torch.ones(4, LENGTH), batch)
            objective.entropy_control.update((out.entropy_totals[0] / out.entropy_totals[1]).item())
        assert seen == pytest.approx(applied)
        assert objective.entropy_control.coef == pytest.approx(final)


def test_resumed_run_goes_on_with_the_saved_coefficient(registry, tiny_model, tmp_path):
    """The coefficient and the last step's entropy are in the checkpoint: a run resumed from step 2 logs steps 3 and
    4 as the unbroken run did (loss and coefficient), where a fresh controller would apply no bonus at step 3."""
    overrides = tiny_run(
        tiny_model,
        "+reward=accuracy",
        *CONTROL,
        "algorithm.entropy_target=100",
        "trainer.max_steps=4",
        "trainer.save_steps=1",
        "trainer.save_total_limit=4",
        "trainer.sample_every=0",
    )
    unbroken = grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "unbroken", registry)
    checkpoint = unbroken / "checkpoints" / "step-000002"
    resumed = grpo_kit.train(
        grpo_kit.compose([*overrides, f"trainer.resume={checkpoint}"], registry), tmp_path / "resumed", registry
    )
    lines = [
        {line["step"]: line for line in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
        for run in (unbroken, resumed)
    ]
    assert [lines[0][step]["entropy_coef"] for step in (1, 2, 3, 4)] == pytest.approx([0.05, 0.06, 0.06, 0.06])
    for step in (3, 4):
        for name in ("loss", "entropy_coef", "policy_loss", "entropy"):
            assert lines[1][step][name] == lines[0][step][name], (step, name)


def test_bounds_the_wrong_way_round_are_refused(registry):
    with pytest.raises(grpo_kit.ConfigError, match="entropy_coef_min=0.5 is above algorithm.entropy_coef_max=0.1"):
        grpo_kit.compose(
            ["algorithm.use_adaptive_entropy=true", "algorithm.entropy_coef_min=0.5", "algorithm.entropy_coef_max=0.1"],
            registry,
        )

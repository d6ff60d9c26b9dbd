"""The instruments (docs/instruments.md): shadow objectives and gradient diagnostics see the trained tensors and
gradients, and never change what is trained."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.config.schema import GradientDiagnosticsConfig
from grpo_kit.contract.errors import ConfigError, PluginError
from grpo_kit.objective.objective import ObjectiveInputs, build_objective
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.report import write_report
from grpo_kit.testing import tiny_run
from grpo_kit.testing.micro_batches import half_a_generation_batch, random_micro_batch
from grpo_kit.training.diagnostics import GradientDiagnostics, completion_groups
from grpo_kit.training.gradients import CountSketch, NoiseScale, Trainable, compared, split_gradients

INSTRUMENTED = ("+shadow=[cispo,grpo]", "shadow.gradient_every=1", "+diagnostics=gradient")


@pytest.fixture
def registry(digits_registry):
    return digits_registry  # `digits`: a reward an untrained model earns, so that the gradients are not zero


def train(tiny_model, run_dir, registry, *extra):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=digits", "+loss=grpo", *extra), registry)
    grpo_kit.train(cfg, run_dir, registry)
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return model.state_dict(), [line for line in lines if line["step"] > 0]


def test_instruments_leave_the_trained_weights_bit_for_bit(tiny_model, tmp_path, registry):
    accumulation = "trainer.gradient_accumulation_steps=2"
    plain, _ = train(tiny_model, tmp_path / "plain", registry, accumulation)
    instrumented, logged = train(
        tiny_model, tmp_path / "instrumented", registry, accumulation, *INSTRUMENTED, "diagnostics.groups_every=2"
    )
    assert plain.keys() == instrumented.keys()
    assert all(torch.equal(plain[name], instrumented[name]) for name in plain)
    every_step = {"shadow/cispo/loss", "shadow/grpo/loss", "shadow/cispo/grad_cosine", "grad/noise_scale"}
    assert all(every_step <= line.keys() for line in logged)
    assert "grad/group/advantage_positive/share" in logged[1] and "grad/group/advantage_positive/share" not in logged[0]


def test_a_shadow_of_the_trained_loss_is_the_trained_loss(tiny_model, tmp_path, registry):
    """Same tensors, same loss: the shadow's value and gradient are the trained ones exactly."""
    _, logged = train(tiny_model, tmp_path, registry, "+shadow=[grpo]", "shadow.gradient_every=1")
    for line in logged:
        assert line["shadow/grpo/loss"] == pytest.approx(line["loss"], abs=1e-7)
        assert line["shadow/grpo/grad_cosine"] == pytest.approx(1.0, abs=1e-6)
        assert line["shadow/grpo/grad_norm_ratio"] == pytest.approx(1.0, abs=1e-6)
        assert line["shadow/grpo/grad_sign_agreement/all"] == 1.0


def test_a_shadow_options_reach_its_loss(tiny_model):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "+shadow=[cispo]", "shadow.cispo.epsilon_high=5"))
    assert cfg.shadow.cispo.epsilon_high == 5
    assert cfg.shadow.gradient_every == 10


def test_compared_gradients():
    trained = [torch.tensor([1.0, -2.0, 0.0]), torch.tensor([[3.0, 4.0]])]
    shadow = [torch.tensor([2.0, 2.0, 5.0]), torch.tensor([[3.0, -1.0]])]
    metrics = compared(shadow, trained, ["mlp", "head"])
    dot, shadow_norm, trained_norm = 2 - 4 + 9 - 4, math.sqrt(4 + 4 + 25 + 9 + 1), math.sqrt(1 + 4 + 9 + 16)
    assert metrics["grad_cosine"] == pytest.approx(dot / (shadow_norm * trained_norm))
    assert metrics["grad_norm_ratio"] == pytest.approx(shadow_norm / trained_norm)
    assert metrics["grad_sign_agreement/mlp"] == 0.5  # the 0 is left out: signs of 1 vs 2 agree, -2 vs 2 do not
    assert metrics["grad_sign_agreement/head"] == 0.5
    assert metrics["grad_sign_agreement/all"] == 0.5


def test_a_count_sketch_is_linear_and_keeps_norms():
    generator = torch.Generator().manual_seed(0)
    first = [torch.randn(3000, generator=generator), torch.randn(40, 50, generator=generator)]
    second = [torch.randn(3000, generator=generator), torch.randn(40, 50, generator=generator)]
    sketch = CountSketch(4096, seed=3, chunk=1000)  # several chunks per tensor
    together = sketch([a + b for a, b in zip(first, second)])
    torch.testing.assert_close(together, sketch(first) + sketch(second), atol=1e-5, rtol=0)
    norm_sq = sum(float(t.square().sum()) for t in first)
    assert float(sketch(first).square().sum()) == pytest.approx(norm_sq, rel=0.1)
    assert not torch.equal(sketch(first), CountSketch(4096, seed=4, chunk=1000)(first))


class LinearProblem(torch.nn.Module):
    """Each row's loss is -<theta, x_row>, x_row ~ N(mu, sigma^2 I): its gradient is -x_row, so the mean gradient
    is -mu and the per-row covariance sigma^2 I. The noise scale is then d sigma^2 / |mu|^2, known exactly."""

    def __init__(self, dim: int):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(dim))

    def loss(self, rows: torch.Tensor, scale: float) -> torch.Tensor:  # rows (B, d)
        return -(rows @ self.theta).mean() * scale


@pytest.mark.parametrize("accumulation", [2, 4])
def test_the_noise_scale_of_a_problem_with_a_known_answer(accumulation):
    dim, sigma, rows_per_step, steps = 64, 0.5, 32, 400
    mu = torch.full((dim,), 1 / math.sqrt(dim))  # |mu|^2 = 1
    known = dim * sigma**2 / 1.0  # 16 completions
    problem = LinearProblem(dim)
    config = GradientDiagnosticsConfig(sketch_size=8192, seed=1)
    diagnostics = GradientDiagnostics(config, Trainable.of(problem), correct_threshold=1.0)
    generator = torch.Generator().manual_seed(0)
    true_sq, trace = [], []
    for _ in range(steps):
        for _ in range(accumulation):  # each micro-batch's loss divided by the accumulation, as the losses are
            rows = mu + sigma * torch.randn(rows_per_step // accumulation, dim, generator=generator)
            problem.loss(rows, 1 / accumulation).backward()
            diagnostics.after_micro_step(len(rows))
        metrics = diagnostics.end_step()
        problem.theta.grad = None
        true_sq.append(float(metrics["grad/true_norm_sq"]))
        trace.append(float(metrics["grad/trace_sigma"]))
    assert sum(true_sq) / steps == pytest.approx(1.0, rel=0.1)
    assert sum(trace) / steps == pytest.approx(dim * sigma**2, rel=0.1)
    assert sum(trace) / sum(true_sq) == pytest.approx(known, rel=0.1)


def test_the_noise_scale_estimator_itself():
    """E|G_B|^2 = |G|^2 + tr(Sigma)/B, solved from two batch sizes."""
    true_sq, trace = 2.0, 30.0
    small, big = 8, 32
    estimated = NoiseScale.estimate([true_sq + trace / small] * 4, small, true_sq + trace / big, big)
    assert estimated == pytest.approx((true_sq, trace))


@pytest.fixture
def policy_and_inputs(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "+loss=dr_grpo", "algorithm.beta=0.1"))
    objective = build_objective(cfg)
    micro_batch = random_micro_batch(model.config.vocab_size, batch_size=8, seed=2)
    with torch.no_grad():
        logps = PolicyLoss(objective, 1.0, False).logps(model, micro_batch)[0]
    micro_batch = micro_batch.with_references(
        ref_per_token_logps=logps - 0.1, rewards=torch.tensor([1.0, 0, 0.5, 1, float("nan"), 0, 1, 0])
    )
    return model, objective, micro_batch


def test_the_groups_of_each_split_add_up_to_the_whole_gradient(policy_and_inputs):
    model, objective, micro_batch = policy_and_inputs
    policy_loss = PolicyLoss(objective, 1.0, False)
    policy_loss.keep_inputs = True
    out = policy_loss(model, micro_batch, half_a_generation_batch(micro_batch, 6))
    inputs: ObjectiveInputs = out.inputs
    trainable = Trainable.of(model)
    whole = trainable.gradient(out.loss)

    def loss_of(row_weights):
        return objective(inputs.per_token_logps, inputs.entropies, micro_batch, inputs.reduction, row_weights).loss

    lengths = torch.tensor([1, 2, 2, 3, 4, 5, 6, 6, 6])
    groups = completion_groups(micro_batch, lengths, correct_threshold=1.0)
    gradients = dict(split_gradients(loss_of, trainable, groups))
    splits = [[f"length_q{q}" for q in range(1, 5)], ["advantage_positive", "advantage_negative", "advantage_zero"]]
    splits.append(["correct", "incorrect"])
    for split in splits:
        assert torch.stack([groups[name] for name in split]).sum(dim=0).eq(1).all()  # each row in one group
        for index, part in enumerate(whole):
            added = sum(gradients[name][index] for name in split)
            torch.testing.assert_close(added, part, atol=1e-5, rtol=0)
    assert groups["correct"].tolist() == [True, False, False, True, False, False, True, False]


def test_diagnostics_split_a_single_micro_batch_into_halves(tiny_model, tmp_path, registry):
    _, logged = train(tiny_model, tmp_path, registry, "+diagnostics=gradient", "diagnostics.groups_every=0")
    for line in logged:
        assert math.isfinite(line["grad/noise_scale"]) and math.isfinite(line["grad/trace_sigma"])
        assert not any(name.startswith("grad/group/") for name in line)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["+shadow=[cispo]", "shadow.cispo.epsilon_hgh=5"], "shadow.cispo.epsilon_high"),
        (["+shadow=[nonesuch]"], "No loss plugin named 'nonesuch'"),
        (["+diagnostics=gradient", "diagnostics.sketchsize=5"], "diagnostics.sketch_size"),
        (["+diagnostics=gradient", "diagnostics.sketch_size=0"], "diagnostics.sketch_size=0"),
        (["+diagnostics=gradient", "diagnostics.ema=1"], "diagnostics.ema=1"),
        (["+shadow=[cispo]", "shadow.gradient_every=-1"], "shadow.gradient_every=-1"),
        (["+shadow=[cispo]", "model.logits=liger"], "model.logits=liger"),
        (["+diagnostics=gradient", "model.logits=liger"], "model.logits=liger"),
    ],
)
def test_bad_instrument_settings_are_refused(tiny_model, overrides, message):
    with pytest.raises((ConfigError, PluginError), match=message.replace("[", r"\[")):
        grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", *overrides))


def test_the_report_draws_the_instruments(tiny_model, tmp_path, registry):
    run_dir = tmp_path / "run"
    instruments = ("+shadow=[cispo]", "shadow.gradient_every=1", "+diagnostics=gradient", "diagnostics.groups_every=1")
    train(tiny_model, run_dir, registry, *instruments)
    written = {path.name for path in write_report(run_dir)}
    assert {"shadow_loss.png", "shadow_grad_cosine.png", "gradient_noise_scale.png", "gradient_groups.png"} <= written
    report = (run_dir / "report.md").read_text()
    assert "![Trained and shadow losses](shadow_loss.png)" in report

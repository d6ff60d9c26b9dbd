"""The router load-balancing loss of mixture-of-experts models (`algorithm.router_aux_loss_coef`), against TRL 1.16's
own forward pass (its fused LM head, which returns the model's aux loss) and `_compute_loss` on the same model."""

import copy
import importlib.util
import json
import types
from collections import defaultdict

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.fast.length_groups import length_groups
from grpo_kit.objective.policy_loss import PolicyLoss, build_policy_loss
from grpo_kit.testing import tiny_run
from grpo_kit.testing.micro_batches import (
    half_a_generation_batch,
    loss_and_gradients,
    random_micro_batch,
    trl_inputs,
)
from grpo_kit.testing.models import MIXTURES_OF_EXPERTS, build_tiny_moe_model

ACCUMULATION, LENGTH, TEMPERATURE = 2, 12, 0.9


@pytest.fixture(scope="module", params=sorted(MIXTURES_OF_EXPERTS))
def moe_model(request, tmp_path_factory):
    return build_tiny_moe_model(tmp_path_factory.mktemp(request.param), family=request.param)


def micro_batch(model):
    """Rows of very different lengths, so that the policy's pass runs as two (grpo_kit/model/fast/length_groups.py),
    and a left-padded prompt, so that rows are moved: the loss must still be one masked pass's."""
    batch = random_micro_batch(model.config.vocab_size, batch_size=8, length=LENGTH, seed=3)
    batch.completion_mask[4:, 3:] = 0
    assert len(length_groups(batch.completion_mask, batch.prompt_ids.shape[1])) == 2
    return batch


def trl_loss_and_gradients(trl, model, batch, reduction, coef):
    """TRL's `_compute_loss` with its own forward pass (`add_fused_lm_head`) on a copy of `model`; TRL reads the
    generation batch's token count from the batch."""
    batch = trl_inputs(batch) | {"num_items_in_batch": torch.tensor(reduction.num_items_in_batch)}
    model = copy.deepcopy(model)
    trl.trainer.utils.add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    dapo = dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, beta=0.0, importance_sampling_level="token")
    nothing_else = dict(top_entropy_quantile=1.0, off_policy_mask_threshold=None, _entropy_bonus_enabled=False)
    router = dict(aux_loss_enabled=True, router_aux_loss_coef=coef, current_gradient_accumulation_steps=ACCUMULATION)
    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(steps_per_generation=ACCUMULATION, delta=None, use_bias_correction_kl=True),
        **dapo | nothing_else | router,
        use_vllm=False,
        model=types.SimpleNamespace(training=True),
        accelerator=Accelerator(cpu=True),
        temperature=TEMPERATURE,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    trainer._get_per_token_logps_and_entropies = types.MethodType(
        trl.GRPOTrainer._get_per_token_logps_and_entropies, trainer
    )
    loss = trl.GRPOTrainer._compute_loss(trainer, model, batch)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, trainer._metrics["train"]["aux_loss"]


def policy_loss_for(registry, model, coef, **options):
    cfg = grpo_kit.compose(["+loss=dapo", f"generation.temperature={TEMPERATURE}"], registry)
    policy_loss = PolicyLoss(grpo_kit.build_objective(cfg, registry), TEMPERATURE, False, **options)
    policy_loss.use_router_aux_loss(model, coef)
    return policy_loss


def test_loss_gradient_and_logged_aux_loss_equal_trl(registry, trl, moe_model):
    model = AutoModelForCausalLM.from_pretrained(moe_model)
    batch = micro_batch(model)
    coef = 0.3  # large, so that a wrong aux loss shows in the loss and the gradient
    policy_loss = policy_loss_for(registry, model, coef)
    reduction = half_a_generation_batch(batch, policy_loss.objective.max_completion_length, ACCUMULATION, ACCUMULATION)
    loss, grads, metrics = loss_and_gradients(policy_loss, model, batch, reduction)
    expected, expected_grads, logged = trl_loss_and_gradients(trl, model, batch, reduction, coef)
    torch.testing.assert_close(metrics["aux_loss"].item(), logged[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-6, rtol=1e-5, msg=name)
    routers = [name for name in grads if name.endswith("mlp.gate.weight")]
    assert routers
    without, no_aux_grads, _ = loss_and_gradients(policy_loss_for(registry, model, 0.0), model, batch, reduction)
    assert abs(loss - without - coef * metrics["aux_loss"] / ACCUMULATION) < 1e-6
    assert all((grads[name] - no_aux_grads[name]).abs().max() > 1e-4 for name in routers)  # they learn from it


@pytest.mark.parametrize("logits", ["chunked", "liger"])
def test_chunked_and_liger_paths_add_the_same_aux_loss(registry, tmp_path, logits):
    if logits == "liger" and importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger-kernel is not installed (the liger extra)")
    model = AutoModelForCausalLM.from_pretrained(build_tiny_moe_model(tmp_path))
    batch = micro_batch(model)
    plain = policy_loss_for(registry, model, 0.3)
    other = policy_loss_for(registry, model, 0.3, logits=logits, chunk_size=7)
    reduction = half_a_generation_batch(batch, plain.objective.max_completion_length, ACCUMULATION, ACCUMULATION)
    expected, expected_grads, expected_metrics = loss_and_gradients(plain, model, batch, reduction)
    loss, grads, metrics = loss_and_gradients(other, model, batch, reduction)
    assert other.last_path == logits
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(metrics["aux_loss"], expected_metrics["aux_loss"], atol=1e-6, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=0, msg=name)


def test_the_coefficient_is_the_model_configs_unless_given(registry, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(build_tiny_moe_model(tmp_path, router_aux_loss_coef=0.02))
    cfg = grpo_kit.compose([], registry)
    policy_loss = build_policy_loss(cfg, grpo_kit.build_objective(cfg, registry))
    for coef, used in [(None, 0.02), (0.5, 0.5), (0.0, 0.0)]:
        policy_loss.use_router_aux_loss(model, coef)
        assert policy_loss.router_aux_loss_coef == used


def test_a_model_without_experts_is_refused_before_training(registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "algorithm.router_aux_loss_coef=0.01"), registry)
    with pytest.raises(ConfigError, match="router_aux_loss_coef=0.01 .* mixture-of-experts .* Qwen2ForCausalLM"):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    # 0, like null, means no aux loss, and a plain model trains with it.
    overrides = tiny_run(tiny_model, "+reward=accuracy", "algorithm.router_aux_loss_coef=0", "trainer.max_steps=1")
    cfg = grpo_kit.compose(overrides, registry)
    grpo_kit.train(cfg, tmp_path / "zero", registry)


def test_a_mixture_of_experts_run_logs_its_aux_loss(registry, tmp_path):
    model_dir = build_tiny_moe_model(tmp_path / "model")
    cfg = grpo_kit.compose(tiny_run(model_dir, "+reward=accuracy", "trainer.max_steps=2"), registry)
    run_dir = grpo_kit.train(cfg, tmp_path / "run", registry)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(line["aux_loss"] > 0 for line in lines if "loss" in line)


def test_grouping_by_length_is_refused_with_the_aux_loss(registry, tmp_path):
    """The loss is over each micro-batch's tokens, so grouping completions by length would change it."""
    model_dir = build_tiny_moe_model(tmp_path / "model")
    cfg = grpo_kit.compose(tiny_run(model_dir, "+reward=accuracy", "trainer.group_by_length=true"), registry)
    with pytest.raises(ConfigError, match="router load-balancing loss of this mixture-of-experts model"):
        grpo_kit.train(cfg, tmp_path / "run", registry)

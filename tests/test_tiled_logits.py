"""model.logits=tiled: log-probs and entropies a tile of positions x vocabulary columns at a time, forward and backward,
with the plain path's values and gradients within 1e-5 in float32, and no tensor larger than a tile of logits."""

import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.fast.chunked_logits import chunked_logps_and_entropies
from grpo_kit.model.fast.tiled_logits import tiled_logps_and_entropies, why_not_tiled
from grpo_kit.model.loading import cast_lm_head_to_fp32, load_reference_model
from grpo_kit.model.logprobs import OutputHead, per_token_logps_and_entropies
from grpo_kit.objective.policy_loss import PolicyLoss, build_policy_loss
from grpo_kit.testing import build_tiny_model, tiny_run
from grpo_kit.testing.micro_batches import (
    add_reference_quantities,
    half_a_generation_batch,
    loss_and_gradients,
    random_micro_batch,
)

TOLERANCE = 1e-5


class Head(torch.nn.Module):
    """A bare LM head for the function itself: an OutputHead's attributes around a linear layer."""

    def __init__(self, vocab: int, width: int, bias: bool):
        super().__init__()
        self.module = torch.nn.Linear(width, vocab, bias=bias)
        self.softcap = None

    def precision(self):
        return torch.autocast("cpu", enabled=False)

    def __call__(self, hidden):
        return self.module(hidden)


class LargestOutput(TorchDispatchMode):
    """The most elements of any tensor an op outputs inside it (`numel`), but tensors of `ignored_shape`."""

    def __init__(self, ignored_shape):
        super().__init__()
        self.ignored_shape, self.numel = ignored_shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.shape != self.ignored_shape:
                self.numel = max(self.numel, tensor.numel())
        return out


def plain(head, hidden, ids, temperature):  # (B, T), (B, T): the full path's operations
    log_probs = (head(hidden).float() / temperature).log_softmax(-1)
    return log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("chunk_size, vocab_tile", [(1, 1), (5, 37), (7, 500), (1000, 64)])
def test_values_and_gradients_are_the_full_paths(bias, entropy_grad, chunk_size, vocab_tile):
    torch.manual_seed(0)
    head = Head(vocab=300, width=24, bias=bias)
    hidden = torch.randn(3, 11, 24, requires_grad=True)
    ids = torch.randint(300, (3, 11))
    upstream = torch.randn(2, 3, 11)

    def values_and_gradients(compute):
        hidden.grad = None
        head.module.zero_grad()
        logps, entropies = compute()
        loss = (upstream[0] * logps).sum() + (upstream[1] * entropies).sum() * entropy_grad
        loss.backward()
        return [logps, entropies, hidden.grad] + [p.grad for p in head.module.parameters()]

    expected = values_and_gradients(lambda: plain(head, hidden, ids, 0.7))
    actual = values_and_gradients(
        lambda: tiled_logps_and_entropies(hidden, head, ids, 0.7, entropy_grad, chunk_size, vocab_tile)
    )
    for name, got, want in zip(["logps", "entropies", "hidden", "weight", "bias"], actual, expected):
        torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0, msg=name)


def test_no_tensor_holds_more_than_a_tile_of_logits():
    torch.manual_seed(0)
    vocab, width, chunk_size, vocab_tile = 1000, 8, 16, 64
    head = Head(vocab, width, bias=True)
    hidden = torch.randn(2, 40, width, requires_grad=True)
    ids = torch.randint(vocab, (2, 40))
    tile = chunk_size * vocab_tile
    assert hidden.numel() < tile < vocab * width  # what the tiles must stay under, and the weight's own gradient

    def largest_created(compute) -> int:
        """The most elements of any tensor an op made, forward and backward, but the weight's gradient."""
        with LargestOutput(ignored_shape=head.module.weight.shape) as largest:
            logps, entropies = compute()
            (logps.sum() + entropies.sum()).backward()
        return largest.numel

    tiled = largest_created(lambda: tiled_logps_and_entropies(hidden, head, ids, 1.0, True, chunk_size, vocab_tile))
    assert tiled <= tile, tiled
    chunked = largest_created(lambda: chunked_logps_and_entropies(hidden, head, ids, 1.0, True, chunk_size))
    assert chunked >= chunk_size * vocab  # the measure sees a chunk's whole rows of logits


LOSSES = ["grpo", "dapo", "dr_grpo", "cispo", "luspo", "vespo"]


def policy_losses(registry, overrides):
    cfg = grpo_kit.compose(overrides, registry)
    objective = grpo_kit.build_objective(cfg, registry)
    temperature, entropy_grad = cfg.generation.temperature, cfg.algorithm.entropy_coef != 0.0
    full = PolicyLoss(objective, temperature, entropy_grad)
    tiled = PolicyLoss(objective, temperature, entropy_grad, logits="tiled", chunk_size=5, vocab_tile=4)
    return full, tiled


@pytest.mark.parametrize("loss", LOSSES)
def test_a_policy_losss_value_gradients_and_metrics_are_the_full_paths(registry, tiny_model, loss):
    overrides = [f"+loss={loss}", "algorithm.beta=0.1", "generation.temperature=0.7", "algorithm.entropy_coef=0.01"]
    full, tiled = policy_losses(registry, overrides)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = random_micro_batch(model.config.vocab_size)
    with torch.no_grad():
        logps, _ = full.logps(model, batch)
    batch = add_reference_quantities(batch, logps, old=True, ref=True)
    (loss_value, grads, metrics), (other_loss, other_grads, other_metrics) = (
        loss_and_gradients(policy_loss, model, batch) for policy_loss in (full, tiled)
    )
    assert tiled.last_path == "tiled"
    torch.testing.assert_close(other_loss, loss_value, atol=TOLERANCE, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(other_grads[name], grad, atol=TOLERANCE, rtol=0, msg=name)
    for name, value in metrics.items():
        torch.testing.assert_close(other_metrics[name], value, atol=TOLERANCE, rtol=0, equal_nan=True, msg=name)


def test_old_and_reference_log_probs_take_the_tiles(registry, tiny_model, monkeypatch):
    import grpo_kit.model.logprobs

    full, tiled = policy_losses(registry, ["+loss=dapo", "algorithm.beta=0.1"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    reference = load_reference_model(model, torch.device("cpu"))
    batch = random_micro_batch(model.config.vocab_size)
    calls = []
    monkeypatch.setattr(
        grpo_kit.model.logprobs,
        "tiled_logps_and_entropies",
        lambda *a, **k: calls.append(1) or tiled_logps_and_entropies(*a, **k),
    )
    with torch.no_grad():
        for module in (model, reference):
            for expected, actual in zip(full.logps(module, batch), tiled.logps(module, batch)):
                torch.testing.assert_close(actual, expected, atol=TOLERANCE, rtol=0)
    assert len(calls) == 2


def test_under_bf16_autocast_the_tiles_run_in_bf16_with_a_float32_log_sum_exp(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)  # as accelerate's mixed precision
    batch = random_micro_batch(model.config.vocab_size)
    products = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: products.append(out.dtype))
    full = per_token_logps_and_entropies(model, batch, 1.0)
    hook.remove()
    tiled = per_token_logps_and_entropies(model, batch, 1.0, chunk_size=5, vocab_tile=4)
    assert products == [torch.bfloat16] and tiled[0].dtype == torch.float32
    for expected, actual in zip(full, tiled):
        torch.testing.assert_close(actual, expected, atol=2e-2, rtol=0)  # bf16 products, summed in another order


def test_a_head_it_cannot_tile_falls_back_to_chunked_with_one_warning(registry, tmp_path, caplog):
    untied = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, tie_word_embeddings=False))
    cast_lm_head_to_fp32(untied)
    assert "forward has been replaced" in why_not_tiled(OutputHead(untied))
    full, tiled = policy_losses(registry, ["+loss=dapo"])
    batch = random_micro_batch(untied.config.vocab_size)
    reduction = half_a_generation_batch(batch, tiled.objective.max_completion_length, 1, 1)
    with caplog.at_level(logging.WARNING, logger="grpo_kit.objective.policy_loss"):
        for _ in range(2):
            tiled(untied, batch, reduction)
    assert tiled.last_path == "chunked"
    assert caplog.text.count("model.logits=tiled: the chunked path computes this loss instead") == 1


def test_a_soft_capped_head_is_not_tiled(soft_capped_model):
    assert "soft-caps" in why_not_tiled(OutputHead(soft_capped_model))


def test_the_options_compose_and_a_wrong_tile_is_refused(registry, tiny_model):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "model.logits=tiled", "model.logits_vocab_tile=8"), registry)
    policy_loss = build_policy_loss(cfg, grpo_kit.build_objective(cfg, registry))
    assert (policy_loss.logits, policy_loss.vocab_tile) == ("tiled", 8)
    cfg = grpo_kit.compose(tiny_run(tiny_model, "model.logits_vocab_tile=0"), registry)
    with pytest.raises(ConfigError, match="model.logits_vocab_tile=0 must be at least 1"):
        build_policy_loss(cfg, grpo_kit.build_objective(cfg, registry))

"""Padding-free passes (trainer.packing): several sequences per row, position ids restarting at 0 for each; the
log-probs, entropies and gradients of the padded pass, on every logits path; models that would give other values
refused."""

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

import grpo_kit
from grpo_kit.model.fast.switches import SpeedUps, use_speed_ups
from grpo_kit.model.logprobs import per_token_logps_and_entropies
from grpo_kit.model.packing import PackingRefused, first_fit, pack, use_packing
from grpo_kit.objective.policy_loss import build_policy_loss
from grpo_kit.testing import tiny_run
from grpo_kit.testing.micro_batches import loss_and_gradients

from .test_batching import generation_batch

TOLERANCE = 1e-5


def mixed_batch(vocab_size: int):
    """Prompts of 2 to 6 tokens (left-padded), completions of 1 to 12: rows that pack together."""
    batch = generation_batch(vocab_size, size=8, prompt_length=6, length=12, seed=3)
    batch.prompt_mask[:, :4] = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]).repeat(2, 1)
    return dataclasses.replace(batch, prompt_ids=batch.prompt_ids * batch.prompt_mask)


def test_sequences_share_rows_and_positions_restart_for_each():
    batch = mixed_batch(vocab_size=20)
    packed = pack(batch)
    lengths = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1).sum(1)
    rows, capacity = packed.inputs["input_ids"].shape
    assert capacity == lengths.max() and rows < len(lengths), "nothing was packed: the test would mean nothing"
    assert int(packed.real.sum()) == int(lengths.sum())  # every real token once, no padding inside
    restarts = (packed.inputs["position_ids"] == 0) & packed.real.bool()
    assert int(restarts.sum()) == len(lengths)  # one sequence starts at each 0
    assert first_fit([5, 3, 4, 2], capacity=6) == [[0], [2, 3], [1]]


@pytest.mark.parametrize("logits", ["full", "chunked"])
def test_packed_passes_give_the_padded_log_probs_and_gradients(registry, tiny_model, logits):
    cfg = grpo_kit.compose(
        tiny_run(
            tiny_model, "+loss=dapo", "algorithm.beta=0.04", f"model.logits={logits}", "model.logits_chunk_size=7"
        ),
        registry,
    )
    objective = grpo_kit.build_objective(cfg, registry)
    policy_loss = build_policy_loss(cfg, objective)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = mixed_batch(model.config.vocab_size)
    mask = batch.completion_mask
    with torch.no_grad():
        padded_logps, padded_entropies = policy_loss.logps(model, batch)
    batch = batch.with_references(
        old_per_token_logps=padded_logps + 0.1 * torch.randn(padded_logps.shape),
        ref_per_token_logps=padded_logps - 0.1 * torch.randn(padded_logps.shape),
    )
    padded = loss_and_gradients(policy_loss, model, batch)
    use_packing(model)
    with torch.no_grad():
        packed_logps, packed_entropies = policy_loss.logps(model, batch)
    packed = loss_and_gradients(policy_loss, model, batch)
    torch.testing.assert_close(packed_logps * mask, padded_logps * mask, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(packed_entropies * mask, padded_entropies * mask, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(packed[0], padded[0], atol=TOLERANCE, rtol=0)
    for name, gradient in padded[1].items():
        difference = (packed[1][name] - gradient).abs().max() / gradient.abs().max().clamp(min=1e-8)
        assert difference <= TOLERANCE, f"{name}: the packed gradient differs by {difference:.2e} (relative)"


def test_a_model_with_absolute_positions_is_refused_at_its_first_packed_pass():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
    use_speed_ups(model, SpeedUps(packing=True))
    with pytest.raises(PackingRefused, match="trainer.packing=false"):
        per_token_logps_and_entropies(model, mixed_batch(vocab_size=20), temperature=1.0)


def test_a_row_with_padding_inside_runs_padded():
    batch = mixed_batch(vocab_size=20)
    batch.completion_mask[0, 1] = 0
    assert pack(batch) is None

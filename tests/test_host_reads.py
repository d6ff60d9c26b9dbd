"""The log-prob passes read no value back from the device: on a GPU each such read (`.item()`, `bool(t)`,
`torch.equal`, a boolean index, `.tolist()`) waits for every kernel queued before it.

Counted on the CPU with grpo_kit.testing.dispatch, under the GPU's defaults asked for explicitly
(model.pad_to_multiple_of=64, no length groups, mask-free passes), over micro-batches as GenerationBatches.make hands
them out: their RowSpans read with one read for the whole generation batch (fast/mask_free.py).
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.micro_batch import MicroBatch, RowSpans
from grpo_kit.model.fast.mask_free import with_row_spans
from grpo_kit.model.fast.switches import SpeedUps, use_speed_ups
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.testing.dispatch import DispatchCounter, forward_input_shapes
from grpo_kit.testing.micro_batches import add_reference_quantities, half_a_generation_batch, random_micro_batch

GPU_DEFAULTS = SpeedUps(pad_to_multiple_of=64, passes_by_length=False)  # what auto gives on a CUDA GPU


@pytest.fixture
def model(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.config.max_position_embeddings = 512  # RoPE's positions go on past the tiny model's 128
    use_speed_ups(model, GPU_DEFAULTS)
    return model


def generation_batch(vocab_size: int) -> list[MicroBatch]:
    """Two micro-batches of left-padded prompts (a row of each moves) and completions of mixed lengths."""
    return [random_micro_batch(vocab_size, batch_size=6, prompt_length=5, length=19, seed=seed) for seed in (0, 1)]


def test_a_generation_batch_s_row_spans_take_one_read(model):
    micro_batches = generation_batch(model.config.vocab_size)
    micro_batches[1].completion_mask[0, 3] = 0  # padding inside a row: its passes keep the mask
    with DispatchCounter() as counter:
        micro_batches = with_row_spans(micro_batches)
    assert counter.host_reads == 1
    assert [batch.row_spans for batch in micro_batches] == [RowSpans(True, 1), RowSpans(False, 1)]


@pytest.mark.parametrize("logits", ["full", "chunked", "tiled"])
def test_a_training_pass_and_an_old_log_prob_pass_read_nothing_back(registry, model, logits):
    objective = grpo_kit.build_objective(grpo_kit.compose(["algorithm.beta=0.04"], registry), registry)
    policy_loss = PolicyLoss(objective, 0.9, False, logits=logits, chunk_size=32, vocab_tile=16)
    [batch] = with_row_spans(generation_batch(model.config.vocab_size)[:1])
    with torch.no_grad():
        policy_loss.logps(model, batch)  # the chunked and tiled paths check a model's head at its first pass
    with forward_input_shapes(model) as calls, DispatchCounter() as old, torch.no_grad():
        logps, _ = policy_loss.logps(model, batch)
    batch = add_reference_quantities(batch, logps, old=True, ref=True)
    reduction = half_a_generation_batch(batch, objective.max_completion_length)  # made once per generation batch
    with DispatchCounter() as training:
        policy_loss(model, batch, reduction).loss.backward()
    assert (old.host_reads, training.host_reads) == (0, 0)
    call = dict(calls[0])  # the pass the counts cover is the fast one: rows moved, no mask, a width of 64
    assert "attention_mask" not in call and call["position_ids"] == call["input_ids"] == (6, 64)


def test_a_micro_batch_made_elsewhere_reads_its_row_spans_at_each_pass(model):
    policy_loss = PolicyLoss(grpo_kit.build_objective(grpo_kit.compose([])), 1.0, False)
    batch = generation_batch(model.config.vocab_size)[0]
    with DispatchCounter() as counter, torch.no_grad():
        unrecorded, _ = policy_loss.logps(model, batch)
    assert counter.host_reads == 1
    [batch] = with_row_spans([batch])
    recorded, _ = policy_loss.logps(model, batch)
    torch.testing.assert_close(recorded, unrecorded, atol=0, rtol=0)


def test_a_masked_pass_reads_nothing_back_either(model):
    """Where rows cannot move (here padding inside a row), the pass keeps its mask, which transformers would read
    to see whether it can leave it out (fast/unread_masks.py)."""
    policy_loss = PolicyLoss(grpo_kit.build_objective(grpo_kit.compose([])), 1.0, False)
    batch = generation_batch(model.config.vocab_size)[0]
    batch.completion_mask[0, 3] = 0
    [batch] = with_row_spans([batch])
    with forward_input_shapes(model) as calls, DispatchCounter() as counter, torch.no_grad():
        policy_loss.logps(model, batch)
    assert "attention_mask" in dict(calls[0]) and counter.host_reads == 0

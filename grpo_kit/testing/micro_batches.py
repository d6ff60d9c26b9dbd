"""Micro-batches of random tokens for a policy loss, and its loss and gradients, for tests of the logits paths."""

import torch

from grpo_kit.contract.kinds import Reduction
from grpo_kit.contract.micro_batch import MicroBatch


def random_micro_batch(
    vocab_size: int, batch_size: int = 4, prompt_length: int = 3, length: int = 6, seed: int = 0
) -> MicroBatch:
    """A micro-batch as the trainer hands it to PolicyLoss: left-padded prompts, right-padded completions (one of
    them padded from its second token), advantages of both signs."""
    generator = torch.Generator().manual_seed(seed)
    prompt_mask = torch.ones(batch_size, prompt_length, dtype=torch.long)
    prompt_mask[-1, 0] = 0
    lengths = torch.randint(1, length + 1, (batch_size,), generator=generator)
    lengths[0], lengths[-1] = length, min(2, length)
    completion_mask = (torch.arange(length) < lengths.unsqueeze(1)).long()
    return MicroBatch(
        prompt_ids=torch.randint(vocab_size, (batch_size, prompt_length), generator=generator),
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(vocab_size, (batch_size, length), generator=generator),
        completion_mask=completion_mask,
        advantages=torch.randn(batch_size, generator=generator),
    )


def objective_batch(completion_mask: torch.Tensor, advantages: torch.Tensor, **fields) -> MicroBatch:
    """A micro-batch for the objective alone, which reads no token ids: `completion_mask` (B, T), `advantages`
    (B,), and any other field (old and reference log-probs, a ratio, a tool mask); the ids are zeros."""
    no_prompt = torch.zeros(len(completion_mask), 0, dtype=torch.long)
    ids = torch.zeros_like(completion_mask, dtype=torch.long)
    return MicroBatch(no_prompt, no_prompt, ids, completion_mask, advantages, **fields)


def trl_inputs(micro_batch: MicroBatch) -> dict[str, torch.Tensor]:
    """The micro-batch as the dict of tensors TRL's trainer reads (`_compute_loss(model, inputs)`)."""
    return micro_batch.state_dict()


def half_a_generation_batch(
    micro_batch: MicroBatch,
    max_completion_length: int,
    gradient_accumulation_steps: int = 2,
    steps_per_generation: int = 2,
    num_processes: int = 1,
) -> Reduction:
    """The divisors of a micro-batch that is half its generation batch (twice its active tokens), by default one of
    the two micro-batches of an optimizer step on one process."""
    num_items_in_batch = float(micro_batch.completion_mask.sum()) * 2
    return Reduction(
        num_items_in_batch, gradient_accumulation_steps, steps_per_generation, num_processes, max_completion_length
    )


def add_reference_quantities(
    micro_batch: MicroBatch,
    per_token_logps: torch.Tensor,  # (B, T): the policy's log-probs, which the quantities stray from
    old: bool = False,
    ref: bool = False,
    ratio_level: str | None = None,  # "token" or "sequence": a rollout-correction ratio of that shape
    seed: int = 1,
) -> MicroBatch:
    """The micro-batch with off-policy old log-probs, reference log-probs, a rollout-correction ratio."""
    generator = torch.Generator().manual_seed(seed)
    shape = per_token_logps.shape
    added = {}
    if old:
        added["old_per_token_logps"] = per_token_logps + 0.2 * torch.randn(shape, generator=generator)
    if ref:
        added["ref_per_token_logps"] = per_token_logps + 0.2 * torch.randn(shape, generator=generator)
    if ratio_level is not None:
        ratio_shape = shape if ratio_level == "token" else (shape[0], 1)
        added["importance_sampling_ratio"] = torch.rand(ratio_shape, generator=generator) * 1.5 + 0.5
    return micro_batch.with_references(**added)


def loss_and_gradients(policy_loss, model: torch.nn.Module, micro_batch, reduction: Reduction | None = None):
    """policy_loss's loss, every trainable parameter's gradient (by name) and the metrics, on a zeroed model; the
    micro-batch is half its generation batch (`half_a_generation_batch`) unless `reduction` says otherwise."""
    model.zero_grad(set_to_none=True)
    if reduction is None:
        reduction = half_a_generation_batch(micro_batch, policy_loss.objective.max_completion_length)
    out = policy_loss(model, micro_batch, reduction)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads, out.metrics

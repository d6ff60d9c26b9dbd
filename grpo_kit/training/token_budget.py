"""Micro-batches by token budget (trainer.max_tokens_per_micro_batch), as verl's dynamic batch size.

An optimizer step's completions are sorted by length and cut, shortest first, into micro-batches that each fit the
budget: rows x (the batch's prompt columns + the longest completion) padded tokens, or with trainer.packing the
sequences' own tokens. Short completions then share a micro-batch and long ones get one of few rows, instead of
every micro-batch holding per_device_train_batch_size of them. A single completion over the budget gets a
micro-batch of its own (the budget is a target for the memory of a pass, and a rare long completion should not stop
the run); size the budget to prompt + max_completion_length tokens to avoid that.

The loop still counts gradient_accumulation_steps micro-steps per optimizer step (the scheduler, steps_per_generation
and checkpoints keep their meaning): the step's micro-batches are spread over its micro-steps, at least one each,
and a micro-step trains on each of its own in turn. The gradient is the fixed micro-batches' up to float rounding:
the losses' divisors are the generation batch's (`Reduction.rows_per_micro_batch` stands for the fixed row count
that sequence means divide by), and the settings under which regrouping would change it are refused
(`grouping_changes_gradient`).
"""

from dataclasses import dataclass

import torch
from torch import nn

from grpo_kit.contract.micro_batch import MicroBatch


@dataclass(frozen=True)
class TokenBudget:
    max_tokens: int | None  # per micro-batch; None: fixed row counts, one micro-batch per micro-step
    packing: bool  # whether the passes are packed, so that a micro-batch costs its sequences' tokens

    def costs(self, batch: MicroBatch) -> torch.Tensor:  # (N,)
        """What each row adds to a micro-batch: its real tokens when packed; its completion length otherwise (the
        padded count is rows x (prompt columns + the longest completion))."""
        completion_lengths = batch.completion_mask.sum(dim=1)
        return completion_lengths + batch.prompt_mask.sum(dim=1) if self.packing else completion_lengths

    def groups(self, batch: MicroBatch) -> list[torch.Tensor]:
        """`batch`'s rows, in their order, as runs that each fit the budget (a row over it alone)."""
        costs = self.costs(batch).tolist()
        prompt_columns = batch.prompt_ids.shape[1]
        groups, start, total, longest = [], 0, 0, 0
        for row, cost in enumerate(costs):
            total, longest = total + cost, max(longest, cost)
            size = row + 1 - start
            tokens = total if self.packing else size * (prompt_columns + longest)
            if tokens > self.max_tokens and size > 1:
                groups.append(torch.arange(start, row))
                start, total, longest = row, cost, cost
        groups.append(torch.arange(start, len(costs)))
        return groups

    def spread(self, share: MicroBatch, order: torch.Tensor, micro_steps: int) -> list[torch.Tensor]:
        """One optimizer step's rows (`order` into `share`), sorted by cost and cut into budget groups, spread over
        its `micro_steps`: each micro-step's rows, whole groups where there are enough, at least one row each."""
        costs = self.costs(share)[order]
        order = order[costs.argsort(stable=True)]
        groups = self.groups(share.rows(order))
        while len(groups) < micro_steps:  # a budget larger than the step: halve its largest group until each has one
            largest = max(range(len(groups)), key=lambda index: len(groups[index]))
            groups[largest : largest + 1] = list(groups[largest].tensor_split(2))
        per_step = torch.arange(len(groups)).tensor_split(micro_steps)
        return [order[torch.cat([groups[int(index)] for index in indices])] for indices in per_step]

    def parts(self, micro_batch: MicroBatch) -> list[MicroBatch]:
        """A micro-step's micro-batches, each cut to its own longest completion: its budget groups again (its rows
        are sorted and start a group, so they fall as `spread` cut them), or the whole of it without a budget."""
        if self.max_tokens is None:
            return [micro_batch]
        groups = self.groups(micro_batch)
        return [micro_batch] if len(groups) == 1 else [rows_of(micro_batch, rows) for rows in groups]


def rows_of(batch: MicroBatch, rows: torch.Tensor) -> MicroBatch:
    """The micro-batch of `batch`'s `rows`, its completion columns cut to its longest completion."""
    part = batch.rows(rows)
    return part.cut(max(int(part.completion_mask.sum(dim=1).max()), 1))


def in_parts(forward, micro_batch: MicroBatch, budget: TokenBudget):
    """`forward(micro_batch)`'s (B, T) outputs (one tensor or a tuple), computed part by part; zeros where a part is
    narrower than the micro-batch."""
    parts = budget.parts(micro_batch)
    if len(parts) == 1:
        return forward(micro_batch)
    outputs = [forward(part) for part in parts]
    return joined(outputs, micro_batch.width)


def joined(outputs: list, width: int):
    """The parts' (B_i, T_i) outputs (tensors or tuples of them) as one (B, width) micro-batch's, rows in order."""
    if isinstance(outputs[0], tuple):
        return tuple(joined(list(parts), width) for parts in zip(*outputs))
    return torch.cat([nn.functional.pad(part, [0, width - part.shape[1]]) for part in outputs])

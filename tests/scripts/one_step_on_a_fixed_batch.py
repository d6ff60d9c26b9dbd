"""One optimizer step of every loss on a fixed generation batch, taken by however many processes run this.

    python one_step_on_a_fixed_batch.py MODEL_DIR OUT_DIR              # one process: the whole batch
    torchrun --nproc_per_node 2 one_step_on_a_fixed_batch.py MODEL OUT  # two processes: half the batch each

Every process builds the same batch of 16 completions from a fixed seed and trains on its own share, through the
trainer's own pieces (PolicyLoss, GenerationBatches, Optimization); the main process saves the parameters
after the step as OUT_DIR/LOSS.pt. tests/test_processes.py compares one process's with two processes'.
"""

import dataclasses
import sys
from pathlib import Path

import torch

import grpo_kit
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.model.loading import load_model, load_reference_model
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.objective.sampler_correction import SamplerCorrection
from grpo_kit.testing import tiny_run
from grpo_kit.training.batches import GenerationBatches
from grpo_kit.training.optimization import Optimization
from grpo_kit.training.plan import BatchPlan
from grpo_kit.training.setup import build_accelerator

LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
COMPLETIONS, PROMPT_LENGTH, COMPLETION_LENGTH = 16, 5, 7
# beta > 0 (a reference model), two passes over each batch (old log-probs), and a rollout correction.
SETTINGS = [
    "algorithm.beta=0.04",
    "algorithm.num_iterations=2",
    "rollout_correction=token_truncate",
    "trainer.learning_rate=1e-3",
]


def fixed_batch(vocab_size: int) -> tuple[MicroBatch, torch.Tensor]:
    """The batch, and how far the sampler's log-probs are from the trainer's (N, T): the rollout correction has
    something to correct."""
    rng = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, COMPLETION_LENGTH + 1, (COMPLETIONS,), generator=rng)
    completion_mask = (torch.arange(COMPLETION_LENGTH) < lengths.unsqueeze(1)).int()  # (N, T)
    batch = MicroBatch(
        prompt_ids=torch.randint(2, vocab_size, (COMPLETIONS, PROMPT_LENGTH), generator=rng),  # (N, P)
        prompt_mask=torch.ones(COMPLETIONS, PROMPT_LENGTH, dtype=torch.int),
        completion_ids=torch.randint(2, vocab_size, (COMPLETIONS, COMPLETION_LENGTH), generator=rng),  # (N, T)
        completion_mask=completion_mask,
        advantages=torch.randn(COMPLETIONS, generator=rng),  # (N,)
    )
    sampling_noise = 0.3 * torch.randn(COMPLETIONS, COMPLETION_LENGTH, generator=rng)  # (N, T)
    return batch, sampling_noise


def one_step(model_dir: Path, out_dir: Path, loss: str) -> None:
    registry = grpo_kit.Registry()
    cfg = grpo_kit.compose(tiny_run(model_dir, "+reward=accuracy", f"+loss={loss}", *SETTINGS), registry)
    accelerator = build_accelerator(cfg.trainer, out_dir, [])
    # One process trains 16 completions as 2 accumulated micro-batches of 8; two processes 8 each in one.
    accumulation = 2 // accelerator.num_processes
    torch.manual_seed(0)
    model, tokenizer = load_model(cfg.model)
    reference = load_reference_model(model, accelerator.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.learning_rate)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    objective = grpo_kit.build_objective(cfg, registry)
    policy_loss = PolicyLoss(objective, cfg.generation.temperature, entropy_grad=False)
    plan = BatchPlan(  # two iterations over each batch: old log-probs at generation
        completions_per_micro_batch=8,
        accumulation=accumulation,
        steps_per_generation=accumulation,
        num_iterations=cfg.algorithm.num_iterations,
        num_generations=cfg.generation.num_generations,
        num_processes=accelerator.num_processes,
        max_steps=1,
    )
    # The tiny run samples with the trained model, which needs no correction: this batch's sampler is another.
    correction = dataclasses.replace(SamplerCorrection.of(cfg, registry), applies=True)
    batches = GenerationBatches(
        None,
        policy_loss,
        model,
        reference,
        accelerator,
        plan,
        max_completion_length=cfg.generation.max_completion_length,
        correction=correction,
    )
    optimization = Optimization(model, optimizer, scheduler, accelerator, policy_loss, cfg.trainer.max_grad_norm)

    batch, sampling_noise = fixed_batch(accelerator.unwrap_model(model).config.vocab_size)
    share = COMPLETIONS // accelerator.num_processes
    mine = torch.arange(accelerator.process_index * share, (accelerator.process_index + 1) * share)
    reduction = grpo_kit.Reduction(  # the active tokens of every process's share
        float(batch.completion_mask.sum()),
        accumulation,
        accumulation,
        accelerator.num_processes,
        cfg.generation.max_completion_length,
    )
    finite = True
    for start in range(0, share, 8):
        rows = mine[start : start + 8]
        micro_batch = batch.rows(rows)
        with torch.no_grad():
            logps, _ = policy_loss.logps(model, micro_batch)
        micro_batch = micro_batch.with_references(sampling_per_token_logps=logps + sampling_noise[rows])
        micro_batch = batches.with_references(micro_batch)
        _, finite, _ = optimization.train_on(micro_batch, reduction, finite, ends_step=start + 8 == share)
    assert finite
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), out_dir / f"{loss}.pt")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    for loss in LOSSES:
        one_step(Path(sys.argv[1]), Path(sys.argv[2]), loss)

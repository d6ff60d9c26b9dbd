"""grpo_kit against TRL's GRPOTrainer on the same workloads: seconds per step and per generated token, peak memory,
and the floor.

    python benchmarks/race.py                                  # W1, W2, W3, two rounds (about 25 min on 2 CPU cores)
    python benchmarks/race.py --workloads W4                   # W4a and W4b, a real vocabulary and mixed lengths
    python benchmarks/race.py --workloads W1 --rounds 1 --steps 6-20
    python benchmarks/race.py --quick                          # a smoke run: every workload, a few steps
    python benchmarks/race.py --profile --workloads W1,W2      # where a step's time goes, phase by phase
    python benchmarks/race.py --profile --sides grpo_kit,bare  # the same, for some of the sides only
    python benchmarks/race.py --quick --workloads W4 --sides grpo_kit,bare  # a race of some sides (no ratio to TRL)
    python benchmarks/race.py --threads default                # each side with its own default torch threads
    python benchmarks/race.py --resume /tmp/grpo_kit-race-XXXX  # go on with a race that was killed

What is measured. Each workload trains, from the same saved model, with the same settings, in three kinds of fresh
process, interleaved round by round (grpo_kit, TRL, bare, grpo_kit, TRL, bare, ...):

- grpo_kit: `python -m grpo_kit ...` with command-line overrides;
- TRL: `GRPOTrainer` of TRL 1.16 with the matching `GRPOConfig`, in a child of this script (`--child TRL`);
- bare: the floor, the compute that any implementation has to do, with the fastest kernels grpo_kit has for it,
  and nothing else (`--child bare`): sampling the same batch, the no-gradient reference log-probs where the
  workload needs them, and the forward, backward, gradient clipping and AdamW step of every micro-batch, in a plain
  loop with no trainer, no hooks, no metrics and no logging. It scores with the same reward and group-normalised
  advantages (a few milliseconds), so that its policy learns as the others' do and its completions keep comparable
  lengths. It borrows grpo_kit's kernels, the same kernels without the framework (`bare_child` says which): it
  samples with grpo_kit's lean loop on a CPU and its static loop on a GPU, each the loop measured fastest there
  (generation.loop=auto's choice), computes log-probs with grpo_kit's log-prob function (its forward passes'
  speed-ups, and W4's tiled LM head), and takes the shortcuts that leave a step's gradient unchanged (micro-batches
  by length, each cut to its own width; old log-probs from the first training pass), so that "grpo_kit within 1.2x
  of bare" measures what grpo_kit's framework costs over its own kernels.

A step's time is the wall time between the ends of two consecutive optimizer steps (grpo_kit's `on_step_end` hook,
a TRL `TrainerCallback.on_step_end`, a clock in the bare loop), so it counts everything a step costs: generation,
scoring, the objective, the optimizer, metrics and logging. Where a generation batch is trained on for several
steps (num_iterations 2 in W2), the unit is a whole generation cycle (the steps from one generation to the next),
divided by its steps: a median over single steps would pick either a step with generation or one without. The
table shows the median over the measured steps' cycles (steps 6-30 by default; W3 3-8) of every round.
"peak MiB" is the peak resident memory of the run's process (its `ru_maxrss` from wait4), model loading included.
Every run gets one torch thread by default (`--threads 1`, OMP_NUM_THREADS=1), so that other work on the machine
slows it in proportion rather than stalling OpenMP's threads at every barrier. `--threads default` sets no
OMP_NUM_THREADS and runs each side with its own default instead: grpo_kit's trainer.torch_threads=null choice
(grpo_kit/model/threads.py: one thread for a hidden size up to 512, and its OMP_WAIT_POLICY=PASSIVE), torch's own
default (a thread per core) for TRL and bare. The header says which setting the race ran with, and the table the
threads each side's process computed with.

The workloads share a Qwen2 of hidden 128 x 4 layers (intermediate 256, 4 heads, 2 KV heads; about 0.6M
parameters with the 17-token character vocabulary of `grpo_kit.embedded.sums`), built untrained from a fixed seed;
"a+b=" prompts; 8 prompts x 8 completions per generation batch; the dapo loss; learning rate 1e-4; float32;
temperature 1, top-p 1, no top-k; no gradient checkpointing, evaluation or checkpoints during training; the reward
is the exact match of the completion with the sum (`sum_accuracy` below, the same function on both sides):

    W1  completions of at most 32 tokens, num_iterations 1, beta 0,    1 micro-batch of 64 per step
    W2  completions of at most 128 tokens, num_iterations 2, beta 0.04, 4 micro-batches of 16 per step
    W3  completions of exactly 512 tokens (EOS suppressed), num_iterations 1, beta 0, 1 micro-batch of 64

W4 is a real shape instead, with each side's shipped defaults for a hub model (grpo_kit: `model=hf data=hf`; TRL:
GRPOConfig's defaults), the memory-saving log-probs included (grpo_kit's model=hf: model.logits=chunked; TRL 1.16:
its fused LM head, always on), and float32 on a CPU on both sides (TRL's bf16 default turned off: grpo_kit's
mixed_precision=auto is float32 on a CPU). An untrained Qwen2 of Qwen2's vocabulary (151,936) and a small width
(hidden 64 x 2 layers; `build_real_model`), prompts of 20-200 tokens, completions of up to 256 tokens that end at
EOS after ~85 tokens on average (geometrically: the model's EOS logit is raised, see `build_real_model`), the
reward is the completion's length (`length_reward`), 4 prompts x 8 completions per step in 4 micro-batches of 8
(TRL's default micro-batch; 4 accumulation steps so that a step mixes prompt lengths), learning rate 1e-6, gradient
checkpointing, fused AdamW, top-k off (TRL's default top_k=0; top_k=None would become transformers 5's 50):

    W4a  num_iterations 1, beta 0       W4b  num_iterations 2, beta 0.04

Its figure is seconds per generated token (the measured steps' wall time over the tokens generated in them,
EOS included), since completion lengths vary. W4gpu is W4a on a Qwen2.5-0.5B-shaped model, for a GPU (--device
cuda: bf16 autocast on every side, TRL's default; peak = allocated CUDA memory): benchmarks/gpu/.

Before the table, the script checks what makes the two sides comparable, from what each run logged, and stops
with an error where one fails: 64 completions per generation batch on both sides and as many generation batches
(so W2 trains on each for 2 steps on both), the same completion cap and no completion above it, every W3
completion exactly 512 tokens long, KL logged at every W2 step on both sides; the same learning rate, loss
(dapo), completions per prompt and number of optimizer steps, a finite loss at every step, float32 weights; the
same logits processors on every side (recorded from transformers' own `_get_logits_processor`, with which
grpo_kit's lean and static loops build theirs, in grpo_kit's runs and in bare's alike) and none that filters
(temperature, top-k, top-p, min-p); and mean completion lengths within 25% (or 4 standard errors) of grpo_kit's on
TRL's and bare's sides (of the first side's, in a race of some sides without grpo_kit).

This file is also the local plugin module of the grpo_kit runs (GRPO_KIT_PLUGINS=race, with benchmarks/ on
PYTHONPATH): grpo_kit's `python` reward imports `race:sum_accuracy`, and always-on hooks record the step ends, the
completion lengths, the sampling processors and the torch threads. Its top level imports only the standard library
and pluggy, so that neither the TRL process nor grpo_kit's plugin loading pays for torch or grpo_kit here.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pluggy

sys.path.insert(0, str(Path(__file__).resolve().parent))  # phases.py, beside this file, in every child
from phases import PhaseTimer  # noqa: E402

# grpo_kit's own hook marker (grpo_kit.hookimpl is this): importing grpo_kit here would load hydra into the TRL child.
hookimpl = pluggy.HookimplMarker("grpo_kit")

BENCHMARKS = Path(__file__).resolve().parent
REPOSITORY = BENCHMARKS.parent
PROBE_ENV = "RACE_PROBE_FILE"  # where the grpo_kit run's hooks write what they recorded

NUM_GENERATIONS = 8
LEARNING_RATE = 1e-4
# Round r runs every side with seed FIRST_SEED + r - 1 (42: TRL's default seed, and grpo_kit's). Samplers that draw
# differently (grpo_kit's lean loop, `generate`) send the policies down different paths, whose completion lengths,
# and so costs, differ by luck: a seed per round spreads that luck over the rounds instead of repeating it.
FIRST_SEED = 42
MODEL_SEED = 0
NUM_PROMPTS = 2000
SIDES = ("grpo_kit", "TRL", "bare")

# W4's model: Qwen2's vocabulary and special tokens, a width this machine can train (the LM head is most of the cost).
REAL_VOCAB = 151_936
REAL_PAD, REAL_EOS = "<|endoftext|>", "<|im_end|>"  # ids 151643 and 151645, as in Qwen2's tokenizer
REAL_SPECIAL_IDS = {151643: REAL_PAD, 151644: "<|im_start|>", 151645: REAL_EOS}
REAL_PROMPT_LENGTHS = (20, 200)  # tokens, uniformly
# EOS's logit sits about 7.5 above the others', so that a completion ends after ~85 tokens on average
# (geometrically: many short ones, ~5% reach the 256-token cap); build_real_model says how.
EOS_LOGIT_GAP = 7.5  # ln(151,936 / 84)
# Qwen2 shapes of W4's models: a width this machine can train (the LM head is most of the cost), and Qwen2.5-0.5B's
# (benchmarks/gpu/, bf16 on a GPU).
REAL_SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
}


@dataclass(frozen=True)
class Workload:
    name: str
    max_completion_length: int
    num_iterations: int
    beta: float
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    forced_length: bool  # EOS suppressed: every completion is exactly max_completion_length tokens
    steps: tuple[int, int]  # the measured steps by default, first and last (the run stops at the last)
    # W4: Qwen2's vocabulary, prompts of 20-200 tokens, each side's shipped defaults for a hub model (learning rate
    # 1e-6, gradient checkpointing, fused AdamW, the chunked LM head) instead of the settings above.
    real_shape: bool = False
    size: str = "tiny"  # W4's model, a key of REAL_SHAPES

    @property
    def learning_rate(self) -> float:
        return 1e-6 if self.real_shape else LEARNING_RATE  # 1e-6: TRL's GRPOConfig default, and grpo_kit's

    @property
    def completions_per_step(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def generation_kwargs(self) -> dict | None:
        # Token 1 is the character tokenizer's EOS (grpo_kit.embedded.sums: <pad>=0, <eos>=1); main() checks it.
        return {"suppress_tokens": [1]} if self.forced_length else None


WORKLOADS = {
    "W1": Workload("W1", 32, 1, 0.0, 64, 1, False, (6, 30)),
    "W2": Workload("W2", 128, 2, 0.04, 16, 4, False, (6, 30)),
    "W3": Workload("W3", 512, 1, 0.0, 64, 1, True, (3, 8)),
    "W4a": Workload("W4a", 256, 1, 0.0, 8, 4, False, (3, 8), real_shape=True),
    "W4b": Workload("W4b", 256, 2, 0.04, 8, 4, False, (3, 8), real_shape=True),
    # W4a with Qwen2.5-0.5B's shape, for a GPU (benchmarks/gpu/run.sh: --device cuda)
    "W4gpu": Workload("W4gpu", 256, 1, 0.0, 8, 4, False, (2, 6), real_shape=True, size="0.5b"),
}
WORKLOAD_GROUPS = {"W4": ("W4a", "W4b")}  # --workloads W4: both variants
QUICK_STEPS = {"W1": (2, 4), "W2": (3, 6), "W3": (2, 3), "W4a": (2, 3), "W4b": (3, 4), "W4gpu": (2, 3)}
# Sampling settings every workload asks for on every side: temperature 1, no top-k, top-p or min-p. A side whose
# generate built one of these processors sampled otherwise (transformers 5 turns top_k=None into 50).
TOKEN_TIME_GOAL, PEAK_GOAL, BARE_GOAL = 0.4, 0.7, 1.2  # W4's goals (issue 32): ratios to TRL's and to bare's
FILTERING_PROCESSORS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper")


def sum_accuracy(completions, solution, **_) -> list[float]:
    """1.0 where the completion is exactly the sum ("7+5=" -> "12"), else 0.0: TRL's reward signature."""
    return [1.0 if completion.strip() == answer else 0.0 for completion, answer in zip(completions, solution)]


def length_reward(completions, **_) -> list[float]:
    """W4's reward: the completion's characters over 2,048 (~256 tokens), so that a group's advantages differ."""
    return [len(completion) / 2048 for completion in completions]


def reward_function(workload: Workload):
    return length_reward if workload.real_shape else sum_accuracy


def cuda_peak_mib() -> float | None:
    """The process's peak allocated CUDA memory, where it used CUDA (ru_maxrss counts host memory only)."""
    return PHASES.overall_peak_mib()


def torch_threads() -> int:
    """The torch threads this process computes with (grpo_kit's trainer.torch_threads or OMP_NUM_THREADS, or torch's
    default)."""
    import torch

    return torch.get_num_threads()


def describe_processors(processors) -> list:
    """The logits processors generate built, as [name, {setting: value}] (scalars and short token lists)."""
    described = []
    for processor in processors:
        settings = {}
        for name, value in vars(processor).items():
            if hasattr(value, "tolist") and getattr(value, "numel", lambda: 99)() <= 16:
                value = value.tolist()
            if isinstance(value, (int, float, bool, str, list)):
                settings[name] = value
        described.append([type(processor).__name__, settings])
    return described


def record_sampling(into: list) -> None:
    """Append the description of every distinct set of logits processors that generation builds from now on
    (grpo_kit's lean and static loops build them with generate's own method, so this sees every side's sampling)."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin._get_logits_processor

    def recorded(self, *args, **kwargs):
        processors = original(self, *args, **kwargs)
        described = describe_processors(processors)
        if described not in into:
            into.append(described)
        return processors

    GenerationMixin._get_logits_processor = recorded


# ---------------------------------------------------------------------------------------------------------------
# What the grpo_kit run records, through its hooks (this module is its GRPO_KIT_PLUGINS module).

_probe: dict = {"step_ends": {}, "generations": [], "sampling": []}


@hookimpl
def on_train_start(run):
    _probe["dtype"] = str(next(run.model.parameters()).dtype)
    record_sampling(_probe["sampling"])


@hookimpl
def on_rollout_scored(scored):
    _probe["generations"].append(scored.generated.completion_mask.sum(dim=1).tolist())  # None: the batch unchanged


@hookimpl
def on_step_end(step):
    _probe["step_ends"][step] = time.perf_counter()


@hookimpl
def on_train_end():
    if os.environ.get(PROBE_ENV):
        _probe["threads"] = torch_threads()
        _probe["phases"] = PHASES.intervals
        _probe["cuda_peak_mib"] = cuda_peak_mib()
        Path(os.environ[PROBE_ENV]).write_text(json.dumps(_probe))


# ---------------------------------------------------------------------------------------------------------------
# Phase timers for --profile (phases.py): every side's step, cut into the same rows.

PHASES = PhaseTimer()

# The profile's rows. "rollout" holds generate, score and the old/ref log-probs; "rollout other" is the rest of it
# (tokenising, decoding, advantages, batching). "other" is what a step spends outside all the timed phases.
PROFILE_ROWS = [
    "generate",
    "score",
    "old/ref log-probs",
    "rollout other",
    "forward+loss",
    "backward",
    "clip grad norm",
    "optimizer step",
    "other",
    "step",
]


def time_common_phases(timer: PhaseTimer) -> None:
    """The phases grpo_kit and TRL run through the same libraries: accelerate's backward and clipping, AdamW."""
    import accelerate
    import torch

    timer.wrap(accelerate.Accelerator, "backward", "backward")
    timer.wrap(accelerate.Accelerator, "clip_grad_norm_", "clip grad norm")
    timer.wrap(torch.optim.AdamW, "step", "optimizer step")


def time_grpo_kit_phases(timer: PhaseTimer) -> None:
    import grpo_kit.objective.policy_loss
    import grpo_kit.rollout.scoring
    import grpo_kit.training.batches
    import grpo_kit_transformers.generation

    time_common_phases(timer)
    timer.wrap(grpo_kit.training.batches.GenerationBatches, "make", "rollout")
    timer.wrap(grpo_kit_transformers.generation.TransformersGeneration, "generate", "generate")
    timer.wrap(grpo_kit.rollout.scoring.Scorer, "__call__", "score")
    timer.wrap(grpo_kit.training.batches.GenerationBatches, "with_references", "old/ref log-probs")
    timer.wrap(grpo_kit.objective.policy_loss.PolicyLoss, "__call__", "forward+loss")


def time_trl_phases(timer: PhaseTimer, trainer_class) -> None:
    import torch

    time_common_phases(timer)
    timer.wrap(trainer_class, "_generate_and_score_completions", "rollout")
    timer.wrap(trainer_class, "_generate_single_turn", "generate")
    timer.wrap(trainer_class, "_calculate_rewards", "score")
    # The no-gradient passes (old and reference log-probs) run inside the rollout; the one with a gradient inside
    # compute_loss, which is timed whole.
    timer.wrap(
        trainer_class,
        "_get_per_token_logps_and_entropies",
        lambda *_, **__: "policy log-probs" if torch.is_grad_enabled() else "old/ref log-probs",
    )
    timer.wrap(trainer_class, "compute_loss", "forward+loss")


def phase_profile(intervals, step_ends: dict[int, float], first: int, last: int, cycle: int) -> dict[str, float]:
    """Mean seconds per step of each phase over the whole generation cycles within steps first..last (the
    intervals that start in them)."""
    first, last = whole_cycles(first, last, cycle)
    window_start, window_end = step_ends[first - 1], step_ends[last]
    steps = last - first + 1
    totals: dict[str, float] = {}
    for phase, started, ended, _ in intervals:
        if window_start <= started < window_end:
            totals[phase] = totals.get(phase, 0.0) + (ended - started) / steps
    profile = {row: totals.get(row, 0.0) for row in PROFILE_ROWS}
    bare_rollout = profile["generate"] + profile["score"] + profile["old/ref log-probs"]
    rollout = totals.get("rollout", bare_rollout)  # the bare loop has no rollout function to time
    profile["rollout other"] = rollout - profile["generate"] - profile["score"] - profile["old/ref log-probs"]
    profile["step"] = (window_end - window_start) / steps
    timed = rollout + sum(profile[row] for row in ("forward+loss", "backward", "clip grad norm", "optimizer step"))
    profile["other"] = profile["step"] - timed
    return profile


def phase_peaks(intervals, step_ends: dict[int, float], first: int, last: int, cycle: int) -> dict[str, float | None]:
    """The peak allocated CUDA MiB within each phase over the same steps as `phase_profile` (None on a CPU, or for a
    row that is no timed phase of its own); "step": the highest of them."""
    first, last = whole_cycles(first, last, cycle)
    window_start, window_end = step_ends[first - 1], step_ends[last]
    peaks: dict[str, float] = {}
    for phase, started, _, peak in intervals:
        if peak is not None and window_start <= started < window_end:
            peaks[phase] = max(peaks.get(phase, 0.0), peak)
    rows = {row: peaks.get(row) for row in PROFILE_ROWS}
    rows["step"] = max(peaks.values(), default=None)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The children: TRL's trainer, and the bare loop. Each writes its record as JSON to `out`.


def trl_child(
    workload: Workload, max_steps: int, workdir: Path, out: Path, profile: bool, seed: int, device: str
) -> None:
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepClock(TrainerCallback):
        def __init__(self):
            self.step_ends: dict[int, float] = {}

        def on_step_end(self, args, state, control, **kwargs):
            self.step_ends[state.global_step] = time.perf_counter()

    class RecordingTrainer(GRPOTrainer):
        """GRPOTrainer, recording each generation batch's completion lengths."""

        generations: list[list[int]] = []

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.generations.append(output["completion_mask"].sum(dim=1).tolist())
            return output

    if profile:
        PHASES.synchronize = True
        time_trl_phases(PHASES, RecordingTrainer)
    sampling = []
    record_sampling(sampling)
    common = dict(
        output_dir=str(workdir / "trl-output"),
        max_steps=max_steps,
        per_device_train_batch_size=workload.per_device_train_batch_size,
        gradient_accumulation_steps=workload.gradient_accumulation_steps,
        max_completion_length=workload.max_completion_length,
        num_iterations=workload.num_iterations,
        beta=workload.beta,
        # bf16 autocast is TRL's default; grpo_kit's (trainer.mixed_precision=auto) is float32 on a CPU, whose bf16
        # matrix products are slow, and bf16 on a GPU: both sides run float32 on a CPU and bf16 on a GPU.
        bf16=device == "cuda",
        use_cpu=device == "cpu",
        seed=seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    if workload.real_shape:  # everything else is GRPOConfig's default: the fused (chunked) LM head is always on
        config = GRPOConfig(**common)
    else:
        config = GRPOConfig(
            **common,
            num_generations=NUM_GENERATIONS,
            loss_type="dapo",
            learning_rate=LEARNING_RATE,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            generation_kwargs=workload.generation_kwargs,
            model_init_kwargs={"dtype": "float32"},
            # TRL's defaults that differ from grpo_kit's here: gradient checkpointing and fused AdamW.
            gradient_checkpointing=False,
            optim="adamw_torch",  # unfused torch.optim.AdamW on both sides
        )
    prompts = datasets.load_dataset("json", data_files=str(prompts_path(workload, workdir)), split="train")
    clock = StepClock()
    trainer = RecordingTrainer(
        model=str(model_path(workload, workdir)),
        reward_funcs=reward_function(workload),
        args=config,
        train_dataset=prompts,
        callbacks=[clock],
    )
    trainer.train()
    record = {
        "step_ends": clock.step_ends,
        "generations": RecordingTrainer.generations,
        "metrics": [entry for entry in trainer.state.log_history if "step" in entry and "loss" in entry],
        "settings": {
            "max_completion_length": config.max_completion_length,
            "num_iterations": config.num_iterations,
            "beta": config.beta,
            "completions_per_step": config.per_device_train_batch_size * config.gradient_accumulation_steps,
            "generation_kwargs": config.generation_kwargs,
            "dtype": str(trainer.model.dtype),
            "learning_rate": config.learning_rate,
            "loss_type": config.loss_type,
            "num_generations": config.num_generations,
            "optimizer_steps": trainer.state.global_step,
        },
        "sampling": sampling,
        "cuda_peak_mib": cuda_peak_mib(),
        "phases": PHASES.intervals,
        "threads": torch_threads(),
    }
    out.write_text(json.dumps(record))


def bare_child(
    workload: Workload, max_steps: int, workdir: Path, out: Path, profile: bool, seed: int, device: str
) -> None:
    """The floor: sample, score, old/reference log-probs, forward/backward/clip/AdamW, in a plain loop with
    grpo_kit's fastest kernels for each and nothing around them (no trainer, hooks, metrics or logging).

    The kernels are grpo_kit's own, called directly: the same kernels without the framework, so that grpo_kit's
    distance to this loop is what its framework costs, not what a slower kernel would.
    - Sampling: on a CPU grpo_kit's lean loop (grpo_kit_transformers/sampling.py: one preallocated KV cache, finished
      rows leave the batch), on a GPU its static loop (static.py: fixed shapes, no host sync inside a decode step,
      a CUDA graph replayed), which is generation.loop=auto's choice on each. At W4a's shape on one CPU thread the
      lean loop took 5.4 ms per generated token, `generate` 16.5 and the static loop, run eagerly, 19.5. Both loops
      build `generate`'s own logits processors (so the race's processor check sees them) and draw from its
      distribution. Under bf16 autocast (a GPU), the linear layers' weights are cast once per generation batch
      (cast_once.py), not at every token.
    - Log-probs: grpo_kit's `per_token_logps_and_entropies` (grpo_kit/model/logprobs.py), which takes its forward
      passes' speed-ups on a model it did not load (mask-free passes, length groups, the CPU's chunked causal
      attention, widths at a multiple on a GPU; docs/training.md, "Speed-ups"). W1-W3: the full logits of the
      completion positions. W4 (a real vocabulary, where both trainers' defaults save memory): the tiled LM head
      (grpo_kit/model/fast/tiled_logits.py), never more than 1,024 positions x 32,768 vocabulary columns of logits
      in the forward or the backward pass (measured on one CPU thread at W4's shape: a training pass as fast as
      the checkpointed 1,024-position chunks this loop had before, and faster than grpo_kit's chunked head), with
      gradient checkpointing and fused AdamW as both trainers' defaults.
    - The loop's own shortcuts, none of which changes a step's gradient (the dapo loss divides by the generation
      batch's tokens, whichever micro-batch they are in): micro-batches of rows sorted by length, each cut to its
      own longest prompt and completion; the old log-probs of a micro-batch trained on before the policy's next
      step (W2, W4b's first iteration) are its own training pass's, detached, and only the reference's (beta > 0)
      take a pass without gradient."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from grpo_kit.contract.micro_batch import MicroBatch
    from grpo_kit.model.fast.tiled_logits import why_not_tiled
    from grpo_kit.model.logprobs import OutputHead, per_token_logps_and_entropies
    from grpo_kit_transformers.cast_once import weights_cast_once
    from grpo_kit_transformers.sampling import sample, why_not_lean
    from grpo_kit_transformers.static import StaticDecoder, why_not_static

    PHASES.synchronize = profile
    torch.manual_seed(seed)
    sampling = []
    record_sampling(sampling)
    tokenizer = AutoTokenizer.from_pretrained(model_path(workload, workdir))
    model = AutoModelForCausalLM.from_pretrained(model_path(workload, workdir), dtype=torch.float32).to(device)
    # the trainers' mixed precision: bf16 autocast on a GPU, none on a CPU
    mixed = torch.bfloat16 if device == "cuda" else None
    autocast = torch.autocast(device, dtype=mixed) if mixed else contextlib.nullcontext()
    reference = copy.deepcopy(model).eval().requires_grad_(False) if workload.beta else None
    if workload.real_shape and hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif workload.real_shape:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.learning_rate, fused=workload.real_shape)
    rows = [json.loads(line) for line in prompts_path(workload, workdir).read_text().splitlines()]
    random.Random(seed).shuffle(rows)
    generation_config = GenerationConfig(
        max_new_tokens=workload.max_completion_length,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        disable_compile=True,
        **(workload.generation_kwargs or {}),
    )
    static = StaticDecoder() if device == "cuda" else None
    loop = "static" if static is not None else "lean"
    reason = (why_not_static if static is not None else why_not_lean)(model, generation_config)
    if reason is not None:  # never fall back to a slower sampler silently: the floor would move
        raise SystemExit(f"bare: the {loop} loop cannot sample {workload.name}: {reason}")
    # W4: the tiled head, 1,024 positions x 32,768 vocabulary columns at a time (grpo_kit's model.logits=tiled)
    chunk_size, vocab_tile = (1024, 32768) if workload.real_shape else (None, None)
    reason = why_not_tiled(OutputHead(model)) if workload.real_shape else None
    if reason is not None:
        raise SystemExit(f"bare: the tiled LM head cannot score {workload.name}: {reason}")
    prompts_per_generation = workload.completions_per_step // NUM_GENERATIONS
    micro_batches_per_generation = workload.gradient_accumulation_steps * workload.num_iterations
    off_policy = workload.num_iterations > 1  # the policy moves before the batch's later micro-batches

    def sample_completions(prompts):  # (N, T), the pad token after each row's first EOS
        with weights_cast_once(model, device, mixed):
            if static is not None:
                ids, _ = static.sample(model, prompts.input_ids, prompts.attention_mask, generation_config)
            else:
                ids, _ = sample(model, prompts.input_ids, prompts.attention_mask, generation_config)
        return ids

    def log_probs(policy, batch):  # (B, T): the completion tokens' log-probs at temperature 1
        return per_token_logps_and_entropies(policy, batch, 1.0, chunk_size=chunk_size, vocab_tile=vocab_tile)[0]

    def cut(batch, rows):  # the micro-batch of these rows, cut to its own longest prompt and completion
        part = batch.rows(rows)
        prompt_width = int(part.prompt_mask.sum(1).max())  # prompts are padded on the left, completions right
        prompts = {"prompt_ids": part.prompt_ids[:, -prompt_width:], "prompt_mask": part.prompt_mask[:, -prompt_width:]}
        return dataclasses.replace(part, **prompts).cut(int(part.completion_mask.sum(1).max()))

    step_ends, generations, micro_step, micro_batches, cursor = {}, [], 0, [], 0
    step_ends[0] = time.perf_counter()
    for step in range(1, max_steps + 1):
        for _ in range(workload.gradient_accumulation_steps):
            if micro_step % micro_batches_per_generation == 0:
                chosen = rows[cursor : cursor + prompts_per_generation]
                cursor += prompts_per_generation
                texts = [row["prompt"] for row in chosen for _ in range(NUM_GENERATIONS)]
                prompts = tokenizer(
                    texts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt"
                ).to(device)
                model.eval()
                with PHASES.time("generate"):
                    completions = sample_completions(prompts)
                    is_eos = completions == tokenizer.eos_token_id
                    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), completions.shape[1])
                    positions = torch.arange(completions.shape[1], device=device)
                    completion_mask = (positions <= first_eos[:, None]).long()
                    completions = completions.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
                generations.append(completion_mask.sum(1).tolist())
                # The same reward and group-normalised advantages as the others (TRL's scale_rewards="group"), so
                # that this policy learns as theirs do and its completions keep comparable lengths.
                with PHASES.time("score"):
                    answers = tokenizer.batch_decode(completions, skip_special_tokens=True)
                    columns = {
                        name: [row[name] for row in chosen for _ in range(NUM_GENERATIONS)] for name in chosen[0]
                    }
                    rewards = torch.tensor(reward_function(workload)(answers, **columns), device=device)
                    groups = rewards.view(-1, NUM_GENERATIONS)
                    advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)
                prompt_ids, prompt_mask = prompts.input_ids, prompts.attention_mask
                batch = MicroBatch(prompt_ids, prompt_mask, completions, completion_mask, advantages.view(-1))
                active_tokens = completion_mask.sum()
                # rows by length, so that a micro-batch pads little (a step is a whole generation batch here)
                order = (prompts.attention_mask.sum(1) + completion_mask.sum(1)).argsort()
                micro_batches = [cut(batch, rows) for rows in order.chunk(workload.gradient_accumulation_steps)]
                if reference is not None:
                    with PHASES.time("old/ref log-probs"), torch.no_grad(), autocast:
                        micro_batches = [
                            micro_batch.with_references(ref_per_token_logps=log_probs(reference, micro_batch))
                            for micro_batch in micro_batches
                        ]
                model.train()
            position = micro_step % workload.gradient_accumulation_steps
            micro_batch = micro_batches[position]
            micro_step += 1
            with PHASES.time("forward+loss"), autocast:  # dapo: clipped ratio times advantage, over the batch's tokens
                logps = log_probs(model, micro_batch)
                old = micro_batch.old_per_token_logps
                ratio = torch.exp(logps - (logps.detach() if old is None else old))
                advantages = micro_batch.advantages[:, None]
                per_token = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
                if reference is not None:
                    difference = micro_batch.ref_per_token_logps - logps
                    per_token = per_token + workload.beta * (torch.exp(difference) - difference - 1) * ratio
                loss = (per_token * micro_batch.completion_mask).sum() / active_tokens
                if off_policy and old is None:  # the policy has not moved since it sampled them
                    micro_batches[position] = micro_batch.with_references(old_per_token_logps=logps.detach())
            with PHASES.time("backward"):
                loss.backward()
        with PHASES.time("clip grad norm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with PHASES.time("optimizer step"):
            optimizer.step()
            optimizer.zero_grad()
        step_ends[step] = time.perf_counter()
    record = {"step_ends": step_ends, "generations": generations, "sampling": sampling, "phases": PHASES.intervals}
    record |= {"cuda_peak_mib": cuda_peak_mib(), "threads": torch_threads(), "loop": loop}
    out.write_text(json.dumps(record))


def grpo_kit_profile_child() -> None:
    """`python -m grpo_kit ARGS` in this process, with its phases timed (--profile)."""
    sys.modules["race"] = sys.modules[__name__]  # GRPO_KIT_PLUGINS=race then finds these hooks and PHASES
    PHASES.synchronize = True
    time_grpo_kit_phases(PHASES)
    from grpo_kit.cli.main import main as grpo_kit_main

    sys.argv = ["grpo_kit", *sys.argv[sys.argv.index("--") + 1 :]]
    grpo_kit_main()


# ---------------------------------------------------------------------------------------------------------------
# The parent: build the model and prompts, run the children, check, tabulate.


def build_model(directory: Path) -> None:
    """The untrained Qwen2 every run starts from, with the embedded character tokenizer."""
    from grpo_kit.embedded.sums import build_tokenizer
    from grpo_kit.testing import build_tiny_model

    tokenizer = build_tokenizer()
    if tokenizer.convert_tokens_to_ids(tokenizer.eos_token) != 1:
        raise SystemExit("The character tokenizer's EOS is no longer token 1: update Workload.generation_kwargs.")
    build_tiny_model(
        directory,
        seed=MODEL_SEED,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,  # prompt (4 tokens) + 512 completion tokens fit
    )


def write_prompts(path: Path) -> None:
    from grpo_kit.embedded.sums import build_task

    path.write_text("".join(json.dumps(row) + "\n" for row in build_task(NUM_PROMPTS)))


def model_path(workload: Workload, workdir: Path) -> Path:
    if not workload.real_shape:
        return workdir / "model"
    return workdir / ("model-qwen2" if workload.size == "tiny" else f"model-qwen2-{workload.size}")


def prompts_path(workload: Workload, workdir: Path) -> Path:
    return workdir / ("prompts-qwen2.jsonl" if workload.real_shape else "prompts.jsonl")


def build_real_model(directory: Path, size: str) -> None:
    """W4's untrained Qwen2: Qwen2's vocabulary (151,936) and special tokens, the shape REAL_SHAPES[size] (tiny:
    hidden 64 x 2 layers, intermediate 256, 4 heads; 0.5b: Qwen2.5-0.5B's), 2 KV heads and tied embeddings as in
    Qwen2.5-0.5B.

    The tokenizer is Qwen2's kind (AutoTokenizer loads a qwen2 model's as Qwen2Tokenizer: byte-level BPE): its first
    256 tokens are the byte-level characters, so a prompt of n letters and digits is n tokens, and every other id
    decodes to a word of its own ("w4000"). It has no merges: Qwen2's would need its vocabulary files.

    An untrained model's next-token distribution is nearly uniform, so it would almost never sample EOS among 151,936
    tokens. Every token's embedding is shifted by 10 along hidden dimension 0, so that the residual stream is
    positive there whatever the layers add, and the final norm's output holds a positive value along it (measured
    on random prompts); EOS's embedding (the head's row, tied) is shifted further along it by EOS_LOGIT_GAP over that
    value, so EOS's logit is about EOS_LOGIT_GAP above the others' (all of which share the first shift) and each
    token is EOS with probability ~1/85, more or less with the position. The other logits keep their random spread;
    the compute is a Qwen2's."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    words = list(bytes_to_unicode().values())
    words += [f"w{token_id}" for token_id in range(len(words), REAL_VOCAB)]
    for token_id, special in REAL_SPECIAL_IDS.items():
        words[token_id] = special
    backend = Tokenizer(models.BPE(vocab={word: token_id for token_id, word in enumerate(words)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=REAL_EOS, pad_token=REAL_PAD)
    eos_id = tokenizer.convert_tokens_to_ids(REAL_EOS)
    config = Qwen2Config(
        vocab_size=REAL_VOCAB,
        **REAL_SHAPES[size],
        num_key_value_heads=2,
        max_position_embeddings=512,  # prompts of up to 200 tokens + 256 completion tokens
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    torch.manual_seed(MODEL_SEED)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        embeddings = model.model.embed_tokens.weight
        embeddings[:, 0] += 10.0
        probe = torch.randint(min(REAL_SPECIAL_IDS), (4, 128), generator=torch.Generator().manual_seed(MODEL_SEED))
        along = model.model(probe).last_hidden_state[..., 0].mean()  # the final norm's output along dimension 0
        embeddings[eos_id, 0] += EOS_LOGIT_GAP / along
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = eos_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def write_real_prompts(path: Path) -> None:
    """W4's prompts: random letters and digits, one token each, 20 to 200 long (uniformly)."""
    rng = random.Random(MODEL_SEED)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    rows = [{"prompt": "".join(rng.choices(alphabet, k=rng.randint(*REAL_PROMPT_LENGTHS)))} for _ in range(NUM_PROMPTS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def grpo_kit_overrides(workload: Workload, max_steps: int, workdir: Path, run_dir: Path, seed: int) -> list[str]:
    if workload.real_shape:  # the presets for a hub model, TRL's defaults: their chunked LM head included
        return [
            "model=hf",
            "data=hf",
            f"model.name_or_path={model_path(workload, workdir)}",
            f"data.path={prompts_path(workload, workdir)}",
            "+reward=python",
            "reward.python.function=race:length_reward",
            f"seed={seed}",
            f"generation.max_completion_length={workload.max_completion_length}",
            f"algorithm.num_iterations={workload.num_iterations}",
            f"algorithm.beta={workload.beta}",
            f"trainer.max_steps={max_steps}",
            f"trainer.per_device_train_batch_size={workload.per_device_train_batch_size}",
            f"trainer.gradient_accumulation_steps={workload.gradient_accumulation_steps}",
            "trainer.logging_steps=1",
            "trainer.save_model=false",
            "trainer.progress_bar=false",
            "trainer.sample_every=0",  # TRL's log_completions is off too
            f"hydra.run.dir={run_dir}",
        ]
    overrides = [
        f"model.name_or_path={workdir / 'model'}",
        "model.model_init_kwargs={dtype:float32}",
        f"data.path={workdir / 'prompts.jsonl'}",
        "+loss=dapo",
        "+reward=python",
        "reward.python.function=race:sum_accuracy",
        f"seed={seed}",
        f"generation.num_generations={NUM_GENERATIONS}",
        f"generation.max_completion_length={workload.max_completion_length}",
        "generation.temperature=1.0",
        "generation.top_p=1.0",
        "generation.top_k=null",
        f"algorithm.num_iterations={workload.num_iterations}",
        f"algorithm.beta={workload.beta}",
        f"trainer.max_steps={max_steps}",
        f"trainer.per_device_train_batch_size={workload.per_device_train_batch_size}",
        f"trainer.gradient_accumulation_steps={workload.gradient_accumulation_steps}",
        f"trainer.learning_rate={LEARNING_RATE}",
        "trainer.logging_steps=1",
        "trainer.save_model=false",
        "trainer.progress_bar=false",
        "trainer.sample_every=0",  # TRL's log_completions is off too
        # model=hf's TRL defaults that the TRL side turns off, and the full head the published figures were taken with
        "model.gradient_checkpointing=false",
        "trainer.optim=adamw_torch",
        "model.logits=full",
        f"hydra.run.dir={run_dir}",
    ]
    if workload.generation_kwargs:
        tokens = ",".join(str(token) for token in workload.generation_kwargs["suppress_tokens"])
        overrides.append(f"generation.generation_kwargs={{suppress_tokens:[{tokens}]}}")
    return overrides


def run_child(command: list[str], env: dict, log_path: Path) -> tuple[float, float, float]:
    """Run `command` to its end; its peak resident MiB (from wait4, this child alone), and when it started and
    ended on the clock its step ends are recorded with (perf_counter: CLOCK_MONOTONIC, one clock for every process
    of the machine)."""
    started = time.perf_counter()
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPOSITORY)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-40:])
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({process.returncode}); its log {log_path} ends:\n{tail}")
    return usage.ru_maxrss / 1024, started, time.perf_counter()  # Linux reports KiB


def run_side(
    side: str,
    workload: Workload,
    max_steps: int,
    workdir: Path,
    label: str,
    profile: bool,
    threads: int | None,
    seed: int,
    device: str = "cpu",
) -> dict:
    """One run of `side` on `workload` in a fresh process: its record (step ends, generations, metrics, settings).
    `threads`: the torch threads of every side (OpenMP's, which torch's CPU kernels use), or None for each side's
    own default (no OMP_NUM_THREADS, not even this process's)."""
    out = workdir / f"{label}.json"
    log_path = workdir / "logs" / f"{label}.log"
    env = dict(os.environ)
    if threads is None:
        env.pop("OMP_NUM_THREADS", None)
    else:
        env["OMP_NUM_THREADS"] = str(threads)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # grpo_kit, like accelerate, takes a GPU wherever it sees one
    if side == "grpo_kit":
        run_dir = workdir / "runs" / label
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCHMARKS), env.get("PYTHONPATH")]))
        env["GRPO_KIT_PLUGINS"] = "race"
        env[PROBE_ENV] = str(out)
        overrides = grpo_kit_overrides(workload, max_steps, workdir, run_dir, seed)
        if profile:
            command = [sys.executable, __file__, "--child", "grpo_kit-profile", "--", *overrides]
        else:
            command = [sys.executable, "-m", "grpo_kit", *overrides]
    else:
        command = [
            sys.executable,
            __file__,
            "--child",
            side,
            "--workload",
            workload.name,
            "--max-steps",
            str(max_steps),
            "--workdir",
            str(workdir),
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--device",
            device,
            *(["--profile"] if profile else []),
        ]
    peak_mib, started, ended = run_child(command, env, log_path)
    record = json.loads(out.read_text())
    record["step_ends"] = {int(step): seconds for step, seconds in record["step_ends"].items()}
    record |= {"peak_mib": peak_mib, "wall": ended - started}
    # Apart from the steps: the process's start to its first step's end (imports, loading, the first step), and
    # its last step's end to its exit (the final save, if any, and the teardown).
    record["to_first_step"] = record["step_ends"][1] - started
    record["after_last_step"] = ended - record["step_ends"][max(record["step_ends"])]
    if device == "cuda":  # the GPU's memory is what runs out there
        record["peak_mib"] = record["cuda_peak_mib"]
    if side == "grpo_kit":
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        trainer = config["trainer"]
        record["settings"] = {
            "max_completion_length": config["generation"]["max_completion_length"],
            "num_iterations": config["algorithm"]["num_iterations"],
            "beta": config["algorithm"]["beta"],
            "completions_per_step": trainer["per_device_train_batch_size"] * trainer["gradient_accumulation_steps"],
            "generation_kwargs": config["generation"]["generation_kwargs"],
            "dtype": record["dtype"],
            "learning_rate": trainer["learning_rate"],
            "loss_type": config["loss"]["name"],
            "num_generations": config["generation"]["num_generations"],
            "optimizer_steps": len(record["step_ends"]),  # on_step_end calls
        }
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        record["metrics"] = [json.loads(line) for line in lines]
    return record


def whole_cycles(first: int, last: int, cycle: int) -> tuple[int, int]:
    """The first and last step of the whole generation cycles (`cycle` steps, the first one generating; cycles
    start at steps 1, 1 + cycle, ...) within steps first..last."""
    aligned_first = first + (1 - first) % cycle
    aligned_last = aligned_first + (last - aligned_first + 1) // cycle * cycle - 1
    return aligned_first, aligned_last


def seconds_per_step(step_ends: dict[int, float], first: int, last: int, cycle: int) -> list[float]:
    """Seconds per step of each whole generation cycle within steps first..last."""
    first, last = whole_cycles(first, last, cycle)
    return [(step_ends[start + cycle - 1] - step_ends[start - 1]) / cycle for start in range(first, last + 1, cycle)]


def check(workload: Workload, records: dict[str, list[dict]], max_steps: int) -> list[str]:
    """What must hold for the comparison to be fair; each failure as a sentence."""
    failures = []
    expected_generations = -(-max_steps // workload.num_iterations)
    for side, runs in records.items():
        for index, record in enumerate(runs, start=1):
            where = f"{workload.name} {side} round {index}"
            counts = [len(lengths) for lengths in record["generations"]]
            if set(counts) != {workload.completions_per_step}:
                failures.append(
                    f"{where}: completions per generation batch {sorted(set(counts))}, "
                    f"expected {workload.completions_per_step}"
                )
            if len(counts) != expected_generations:
                failures.append(
                    f"{where}: {len(counts)} generation batches in {max_steps} steps, expected "
                    f"{expected_generations} (num_iterations {workload.num_iterations})"
                )
            lengths = [length for batch in record["generations"] for length in batch]
            if max(lengths) > workload.max_completion_length:
                failures.append(f"{where}: a completion of {max(lengths)} tokens, above the cap")
            if workload.forced_length and set(lengths) != {workload.max_completion_length}:
                failures.append(
                    f"{where}: completion lengths {sorted(set(lengths))[:5]}..., expected all "
                    f"{workload.max_completion_length}"
                )
            if side == "bare":
                continue
            settings = record["settings"]
            wanted = {
                "max_completion_length": workload.max_completion_length,
                "num_iterations": workload.num_iterations,
                "beta": workload.beta,
                "completions_per_step": workload.completions_per_step,
                "generation_kwargs": workload.generation_kwargs,
                "learning_rate": workload.learning_rate,
                "loss_type": "dapo",
                "num_generations": NUM_GENERATIONS,
                "optimizer_steps": max_steps,
            }
            for name, value in wanted.items():
                if settings[name] != value:
                    failures.append(f"{where}: {name} is {settings[name]!r}, expected {value!r}")
            if "float32" not in settings["dtype"]:
                failures.append(f"{where}: the model is {settings['dtype']}, not float32")
            logged_steps = [entry["step"] for entry in record["metrics"] if "step" in entry]
            if sorted(logged_steps) != list(range(1, max_steps + 1)):
                failures.append(f"{where}: logged steps {logged_steps}, expected 1..{max_steps}")
            if workload.beta:
                without_kl = [entry["step"] for entry in record["metrics"] if entry.get("kl") is None]
                if without_kl:
                    failures.append(f"{where}: no kl logged at steps {without_kl}")
            losses = [entry.get("loss") for entry in record["metrics"] if "step" in entry]
            if not all(isinstance(loss, float) and math.isfinite(loss) for loss in losses):
                failures.append(f"{where}: logged losses {losses}, not all finite")
    failures += check_sampling(workload, records)
    failures += check_lengths(workload, records)
    return failures


def check_sampling(workload: Workload, records: dict[str, list[dict]]) -> list[str]:
    """Every run sampled with one set of logits processors, the same on every side, and none that filters."""
    failures, seen = [], {}
    for side, runs in records.items():
        for index, record in enumerate(runs, start=1):
            where = f"{workload.name} {side} round {index}"
            if len(record["sampling"]) != 1:
                failures.append(
                    f"{where}: sampled with {len(record['sampling'])} sets of processors: {record['sampling']}"
                )
                continue
            processors = record["sampling"][0]
            filtering = [name for name, _ in processors if name in FILTERING_PROCESSORS]
            if filtering:
                failures.append(f"{where}: sampled through {processors}, expected no {', '.join(filtering)}")
            seen.setdefault(json.dumps(processors, sort_keys=True), []).append(where)
    if len(seen) > 1:
        failures.append(
            f"{workload.name}: the sides sampled differently: "
            + "; ".join(f"{', '.join(wheres)}: {processors}" for processors, wheres in seen.items())
        )
    return failures


def check_lengths(workload: Workload, records: dict[str, list[dict]]) -> list[str]:
    """The sides' mean completion lengths agree: within 25% of each other, or 4 standard errors of their difference
    where few completions were drawn (the same model sampled the same way draws the same length distribution; a
    policy trained at W1-W3's learning rate drifts a little)."""
    if workload.forced_length:
        return []  # every length is the cap, checked above
    summaries = {}
    for side, runs in records.items():
        lengths = [length for record in runs for batch in record["generations"] for length in batch]
        summaries[side] = (statistics.mean(lengths), statistics.variance(lengths) / len(lengths))
    failures = []
    (first_side, (ours, our_variance)), *others = summaries.items()  # grpo_kit's, where it ran
    for side, (theirs, their_variance) in others:
        tolerance = max(0.25 * max(ours, theirs), 4 * math.sqrt(our_variance + their_variance))
        if abs(ours - theirs) > tolerance:
            failures.append(
                f"{workload.name}: mean completion length {ours:.1f} tokens ({first_side}) against {theirs:.1f} "
                f"({side}), more than {tolerance:.1f} apart"
            )
    return failures


def seconds_per_token(record: dict, first: int, last: int, cycle: int) -> tuple[float, int]:
    """The wall seconds of the whole generation cycles within steps first..last, over the tokens generated in
    them (EOS included), and that number of tokens. Generation batch g (from 0) is drawn at step g * cycle + 1."""
    first, last = whole_cycles(first, last, cycle)
    seconds = record["step_ends"][last] - record["step_ends"][first - 1]
    batches = record["generations"][(first - 1) // cycle : last // cycle]
    tokens = sum(sum(batch) for batch in batches)
    return seconds / tokens, tokens


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(workload: Workload, records: dict[str, list[dict]], first: int, last: int) -> dict:
    row = {}
    for side, runs in records.items():
        values = [
            v for record in runs for v in seconds_per_step(record["step_ends"], first, last, workload.num_iterations)
        ]
        lengths = [length for record in runs for batch in record["generations"] for length in batch]
        per_token = [seconds_per_token(record, first, last, workload.num_iterations) for record in runs]
        tokens = sum(count for _, count in per_token)
        row[side] = {
            # all rounds' seconds over all their tokens
            "seconds_per_token": sum(seconds * count for seconds, count in per_token) / tokens,
            "tokens": tokens,
            "seconds": median(values),
            "peak_mib": max(record["peak_mib"] for record in runs),
            "mean_length": sum(lengths) / len(lengths),
            "round_medians": [
                median(seconds_per_step(record["step_ends"], first, last, workload.num_iterations)) for record in runs
            ],
            "to_first_step": statistics.mean(record["to_first_step"] for record in runs),
            "after_last_step": statistics.mean(record["after_last_step"] for record in runs),
            # the torch threads each run computed with (absent from records written before they were recorded)
            "threads": sorted({record["threads"] for record in runs if "threads" in record}),
        }
    return row


def print_table(rows: dict[str, dict], ranges: dict[str, tuple[int, int]]) -> None:
    header = (
        f"{'workload':10} {'steps':>6} {'grpo_kit s/step':>16} {'TRL s/step':>11} {'ratio':>6} "
        f"{'grpo_kit peak MiB':>18} {'TRL peak MiB':>13} {'bare s/step':>12} {'grpo_kit/bare':>14} {'TRL/bare':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        ours, theirs, bare = row["grpo_kit"], row["TRL"], row["bare"]
        first, last = whole_cycles(*ranges[name], WORKLOADS[name].num_iterations)
        print(
            f"{name:10} {f'{first}-{last}':>6} {ours['seconds']:16.3f} {theirs['seconds']:11.3f} "
            f"{ours['seconds'] / theirs['seconds']:6.2f} {ours['peak_mib']:18.0f} {theirs['peak_mib']:13.0f} "
            f"{bare['seconds']:12.3f} {ours['seconds'] / bare['seconds']:14.2f} "
            f"{theirs['seconds'] / bare['seconds']:9.2f}"
        )
    print()
    header = (
        f"{'workload':10} {'tokens grpo_kit/TRL/bare':>25} {'grpo_kit ms/token':>18} {'TRL ms/token':>13} "
        f"{'ratio':>6} {'bare ms/token':>14} {'grpo_kit/bare':>14} {'peak ratio':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        tokens = "/".join(str(row[side]["tokens"]) for side in SIDES)
        mine, trl, floor = (1000 * row[side]["seconds_per_token"] for side in SIDES)
        peak_ratio = row["grpo_kit"]["peak_mib"] / row["TRL"]["peak_mib"]
        print(
            f"{name:10} {tokens:>25} {mine:18.3f} {trl:13.3f} {mine / trl:6.2f} {floor:14.3f} {mine / floor:14.2f} "
            f"{peak_ratio:11.2f}"
        )
    real = [name for name in rows if WORKLOADS[name].real_shape]
    if real:
        print(
            f"\nW4 goals: time per generated token <= {TOKEN_TIME_GOAL}x TRL's, peak <= {PEAK_GOAL}x TRL's, "
            f"<= {BARE_GOAL}x bare's:"
        )
        for name in real:
            ours, theirs, bare = rows[name]["grpo_kit"], rows[name]["TRL"], rows[name]["bare"]
            verdicts = [
                ("time vs TRL", ours["seconds_per_token"] / theirs["seconds_per_token"], TOKEN_TIME_GOAL),
                ("peak vs TRL", ours["peak_mib"] / theirs["peak_mib"], PEAK_GOAL),
                ("time vs bare", ours["seconds_per_token"] / bare["seconds_per_token"], BARE_GOAL),
            ]
            print(
                f"  {name}: "
                + ", ".join(
                    f"{label} {value:.2f} ({'met' if value <= goal else 'NOT met'})" for label, value, goal in verdicts
                )
            )
    print()
    print("per round (median s/step), mean completion length, bare peak MiB:")
    for name, row in rows.items():
        rounds = "  ".join(
            f"{side} {' '.join(f'{value:.3f}' for value in row[side]['round_medians'])}" for side in SIDES
        )
        lengths = " / ".join(f"{row[side]['mean_length']:.1f}" for side in SIDES)
        print(f"  {name}: {rounds};  length grpo_kit/TRL/bare {lengths};  bare {row['bare']['peak_mib']:.0f} MiB")
    print("apart from the steps, seconds from the process's start to its first step's end, and from its last step's")
    print("end to its exit (the final save, if any, and the teardown):")
    for name, row in rows.items():
        print(
            f"  {name}: "
            + ",  ".join(
                f"{side} {row[side]['to_first_step']:.1f} / {row[side]['after_last_step']:.1f}" for side in SIDES
            )
        )


def print_sides_table(rows: dict[str, dict], ranges: dict[str, tuple[int, int]]) -> None:
    """The figures of a race of some sides (--sides): each side's own, and grpo_kit's ratio to the others'."""
    header = (
        f"{'workload':10} {'side':9} {'steps':>6} {'s/step':>8} {'tokens':>7} {'ms/token':>9} {'peak MiB':>9} "
        f"{'mean length':>12}"
    )
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        first, last = whole_cycles(*ranges[name], WORKLOADS[name].num_iterations)
        for side, figures in row.items():
            print(
                f"{name:10} {side:9} {f'{first}-{last}':>6} {figures['seconds']:8.3f} {figures['tokens']:7} "
                f"{1000 * figures['seconds_per_token']:9.3f} {figures['peak_mib']:9.0f} {figures['mean_length']:12.1f}"
            )
    for name, row in rows.items():
        if "grpo_kit" not in row or len(row) < 2:
            continue
        ours = row["grpo_kit"]
        ratios = [
            f"{ours['seconds_per_token'] / theirs['seconds_per_token']:.2f}x {side}'s time per token, "
            f"{ours['peak_mib'] / theirs['peak_mib']:.2f}x its peak"
            for side, theirs in row.items()
            if side != "grpo_kit"
        ]
        goal = f" (goal <= {BARE_GOAL}x bare's time)" if WORKLOADS[name].real_shape and "bare" in row else ""
        print(f"  {name}: grpo_kit {'; '.join(ratios)}{goal}")


def print_threads(rows: dict[str, dict], threads: int | None) -> None:
    """The torch threads every side's runs computed with, under the race's setting."""
    setting = "each side's own default" if threads is None else f"OMP_NUM_THREADS={threads}"
    print(f"\ntorch threads each side computed with ({setting}):")
    for name, row in rows.items():
        counts = ",  ".join(
            f"{side} {'/'.join(str(count) for count in figures['threads']) or '?'}" for side, figures in row.items()
        )
        print(f"  {name}: {counts}")


def print_profiles(profiles: dict[str, dict[str, dict]], ranges: dict[str, tuple[int, int]]) -> None:
    """Each workload's phase table: seconds per step, share of the step, and on CUDA the peak allocated MiB within
    the phase, side by side."""
    for name, by_side in profiles.items():
        first, last = whole_cycles(*ranges[name], WORKLOADS[name].num_iterations)
        with_peaks = any(peak is not None for side in by_side.values() for peak in side["peak_mib"].values())
        print(f"\n{name}: mean seconds per step by phase, steps {first}-{last}" + (", peak MiB" if with_peaks else ""))
        peak_header = f" {'peak MiB':>9}" if with_peaks else ""
        print(f"{'phase':20} " + " ".join(f"{side:>9} {'share':>6}{peak_header}" for side in by_side))
        for row in PROFILE_ROWS:
            cells = []
            for profile in by_side.values():
                seconds, peak = profile["seconds"], profile["peak_mib"][row]
                cell = f"{seconds[row]:9.3f} {seconds[row] / seconds['step']:6.1%}"
                if with_peaks:
                    cell += f" {peak:9,.0f}" if peak is not None else f" {'':>9}"
                cells.append(cell)
            print(f"{row:20} " + " ".join(cells))


def parse_threads(text: str) -> int | None:
    """--threads: a number of torch threads for every run, or "default" (None): each side's own."""
    if text == "default":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text}: write a number of threads (1 or more) or 'default'")
    return int(text)


def describe_threads(threads: int | None) -> str:
    """The thread setting of a race, in words, for its header."""
    if threads is not None:
        return f"{threads} torch thread(s) per run on every side (OMP_NUM_THREADS={threads})"
    return (
        "each side's own default threads (no OMP_NUM_THREADS): grpo_kit trainer.torch_threads=null (1 thread for a "
        "hidden size up to 512, else its share of the cores; OMP_WAIT_POLICY=PASSIVE), TRL and bare torch's default"
    )


def parse_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    first, last = int(first), int(last)
    if not 2 <= first <= last:
        raise argparse.ArgumentTypeError(f"{text}: write FIRST-LAST with 2 <= FIRST <= LAST (step 1 has no start)")
    return first, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads", default="W1,W2,W3", help="comma-separated: W1,W2,W3,W4a,W4b (W4: both W4 variants)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side per workload, interleaved")
    parser.add_argument("--steps", type=parse_range, help="measured steps of W1 and W2, FIRST-LAST (default 6-30)")
    parser.add_argument("--w3-steps", type=parse_range, help="measured steps of W3, FIRST-LAST (default 3-8)")
    parser.add_argument(
        "--w4-steps", type=parse_range, help="measured steps of W4a, W4b and W4gpu, FIRST-LAST (default 3-8, W4gpu 2-6)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round of a few steps")
    parser.add_argument("--profile", action="store_true", help="one run per side with per-phase timings instead")
    parser.add_argument(
        "--sides",
        default=",".join(SIDES),
        help=f"comma-separated, some of {', '.join(SIDES)} (without TRL, the table has no ratio to TRL's)",
    )
    parser.add_argument(
        "--threads",
        type=parse_threads,
        default=1,
        help="torch threads of every run, through OMP_NUM_THREADS (default 1: on a shared machine, OpenMP threads "
        "that wait for a busy core at every barrier made steps 25 times slower); 'default': no OMP_NUM_THREADS, "
        "each side with its own default (grpo_kit's trainer.torch_threads=null choice, torch's for TRL and bare)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where every side runs (cuda: bf16 autocast on every side, TRL's default; peak = allocated CUDA memory)",
    )
    parser.add_argument("--json", type=Path, help="also write the table's figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (runs, logs, records)")
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="WORK_FOLDER",
        help="go on with a race that was stopped (the work folder it printed), with the same options: the runs it "
        "finished are not run again",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: TRL, bare or grpo_kit-profile
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--max-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    if "--child" in sys.argv and "grpo_kit-profile" in sys.argv:
        return grpo_kit_profile_child()  # the rest of the command line is grpo_kit's
    args = parser.parse_args()
    if args.child == "TRL":
        return trl_child(
            WORKLOADS[args.workload], args.max_steps, args.workdir, args.out, args.profile, args.seed, args.device
        )
    if args.child == "bare":
        return bare_child(
            WORKLOADS[args.workload], args.max_steps, args.workdir, args.out, args.profile, args.seed, args.device
        )
    if args.child is not None:  # never start a whole race from a child
        parser.error(f"unknown --child {args.child}")

    names = [
        member for name in args.workloads.split(",") for member in WORKLOAD_GROUPS.get(name.strip(), [name.strip()])
    ]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}: choose from {', '.join(WORKLOADS)}")
    asked = {side.strip() for side in args.sides.split(",")}
    if asked - set(SIDES) or not asked:
        parser.error(f"--sides {args.sides}: choose from {', '.join(SIDES)}")
    sides = [side for side in SIDES if side in asked]  # grpo_kit first: the lengths check compares with it
    rounds = 1 if args.quick or args.profile else args.rounds
    ranges = {}
    for name in names:
        chosen = {"W3": args.w3_steps}.get(name, args.w4_steps if WORKLOADS[name].real_shape else args.steps)
        ranges[name] = chosen or (QUICK_STEPS[name] if args.quick else WORKLOADS[name].steps)

    workdir = args.resume or Path(tempfile.mkdtemp(prefix="grpo_kit-race-"))
    (workdir / "logs").mkdir(exist_ok=True)
    started = time.perf_counter()
    print(
        f"race.py: {', '.join(names)}, {rounds} round(s), sides {', '.join(sides)}; {describe_threads(args.threads)}; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; work folder {workdir}",
        flush=True,
    )
    for name in names:
        workload = WORKLOADS[name]
        if workload.real_shape and not model_path(workload, workdir).exists():
            build_real_model(model_path(workload, workdir), workload.size)
        elif not workload.real_shape and not model_path(workload, workdir).exists():
            build_model(model_path(workload, workdir))
        if not prompts_path(workload, workdir).exists():
            (write_real_prompts if workload.real_shape else write_prompts)(prompts_path(workload, workdir))
    records = {name: {side: [] for side in sides} for name in names}
    for round_number in range(1, rounds + 1):
        for name in names:
            workload, (_, last) = WORKLOADS[name], ranges[name]
            for side in sides:
                label = f"{name}-{side}-{round_number}"
                # A finished run's record is kept, so that --resume goes on from the first run not finished.
                finished = workdir / f"{label}.finished.json"
                resumed = args.resume is not None and finished.exists()
                if resumed:
                    record = json.loads(finished.read_text())
                    record["step_ends"] = {int(step): seconds for step, seconds in record["step_ends"].items()}
                else:
                    seed = FIRST_SEED + round_number - 1
                    record = run_side(
                        side, workload, last, workdir, label, args.profile, args.threads, seed, args.device
                    )
                    finished.write_text(json.dumps(record))
                records[name][side].append(record)
                first = ranges[name][0]
                per_step = median(seconds_per_step(record["step_ends"], first, last, workload.num_iterations))
                print(
                    f"  round {round_number} {name} {side:8}: {per_step:7.3f} s/step, peak {record['peak_mib']:5.0f} "
                    f"MiB, process {record['wall']:6.1f} s, {record.get('threads', '?')} torch thread(s)"
                    f"{' (finished earlier)' if resumed else ''}",
                    flush=True,
                )

    failures = [failure for name in names for failure in check(WORKLOADS[name], records[name], ranges[name][1])]
    print(
        f"\nchecks: {'all passed' if not failures else f'{len(failures)} FAILED'} (completions per batch, "
        "generation batches, cap, W3 lengths, settings, learning rate, loss, optimizer steps, float32, kl, "
        "sampling processors, completion lengths)"
    )
    figures = {"device": args.device, "failures": failures}
    if args.profile:
        cycles = {name: (*ranges[name], WORKLOADS[name].num_iterations) for name in names}
        figures["profiles"] = {
            name: {
                side: {
                    "seconds": phase_profile(runs[0]["phases"], runs[0]["step_ends"], *cycles[name]),
                    "peak_mib": phase_peaks(runs[0]["phases"], runs[0]["step_ends"], *cycles[name]),
                }
                for side, runs in records[name].items()
            }
            for name in names
        }
        print_profiles(figures["profiles"], ranges)
    figures["rows"] = {name: summarise(WORKLOADS[name], records[name], *ranges[name]) for name in names}
    figures["threads"] = "default" if args.threads is None else args.threads
    print()
    if sides == list(SIDES):
        print_table(figures["rows"], ranges)
    else:
        print_sides_table(figures["rows"], ranges)
    print_threads(figures["rows"], args.threads)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    minutes = (time.perf_counter() - started) / 60
    print(f"\n{minutes:.1f} minutes; load average at the end {os.getloadavg()[0]:.2f}")
    if args.keep:
        print(f"kept {workdir}")
    else:
        shutil.rmtree(workdir)
    if failures:
        raise SystemExit("CHECK FAILED: the two sides did not run the same workload:\n  " + "\n  ".join(failures))


if __name__ == "__main__":
    main()

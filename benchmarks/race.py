"""grpo_kit against TRL's GRPOTrainer on the same three workloads: seconds per step, peak memory, and the floor.

    python benchmarks/race.py                                  # W1, W2, W3, two rounds (about 25 min on 2 CPU cores)
    python benchmarks/race.py --workloads W1 --rounds 1 --steps 6-20
    python benchmarks/race.py --quick                          # a smoke run: every workload, a few steps
    python benchmarks/race.py --profile --workloads W1,W2      # where a step's time goes, phase by phase
    python benchmarks/race.py --resume /tmp/grpo_kit-race-XXXX  # go on with a race that was killed

What is measured. Each workload trains, from the same saved model, with the same settings, in three kinds of fresh
process, interleaved round by round (grpo_kit, TRL, bare, grpo_kit, TRL, bare, ...):

- grpo_kit: `python -m grpo_kit ...` with command-line overrides;
- TRL: `GRPOTrainer` of TRL 1.16 with the matching `GRPOConfig`, in a child of this script (`--child TRL`);
- bare: the compute that any implementation has to do, and nothing else (`--child bare`): `model.generate` of
  the same batch, the no-gradient old and reference log-probs where the workload needs them, and the forward,
  backward, gradient clipping and AdamW step of every micro-batch, in a plain loop of torch and transformers calls.
  It scores with the same reward and group-normalised advantages (a few milliseconds), so that its policy learns
  as the others' do and its completions keep comparable lengths; it logs nothing and computes no metrics.

A step's time is the wall time between the ends of two consecutive optimizer steps (grpo_kit's `on_step_end` hook,
a TRL `TrainerCallback.on_step_end`, a clock in the bare loop), so it counts everything a step costs: generation,
scoring, the objective, the optimizer, metrics and logging. Where a generation batch is trained on for several
steps (num_iterations 2 in W2), the unit is a whole generation cycle (the steps from one generation to the next),
divided by its steps: a median over single steps would pick either a step with generation or one without. The
table shows the median over the measured steps' cycles (steps 6-30 by default; W3 3-8) of every round.
"peak MiB" is the peak resident memory of the run's process (its `ru_maxrss` from wait4), model loading included.
Every run gets one torch thread by default (`--threads`), so that other work on the machine slows it in proportion
rather than stalling OpenMP's threads at every barrier.

The workloads share a Qwen2 of hidden 128 x 4 layers (intermediate 256, 4 heads, 2 KV heads; about 0.6M
parameters with the 17-token character vocabulary of `grpo_kit.embedded.sums`), built untrained from a fixed seed;
"a+b=" prompts; 8 prompts x 8 completions per generation batch; the dapo loss; learning rate 1e-4; float32;
temperature 1, top-p 1, no top-k; no gradient checkpointing, evaluation or checkpoints during training; the reward
is the exact match of the completion with the sum (`sum_accuracy` below, the same function on both sides):

    W1  completions of at most 32 tokens, num_iterations 1, beta 0,    1 micro-batch of 64 per step
    W2  completions of at most 128 tokens, num_iterations 2, beta 0.04, 4 micro-batches of 16 per step
    W3  completions of exactly 512 tokens (EOS suppressed), num_iterations 1, beta 0, 1 micro-batch of 64

Before the table, the script checks what makes the two sides comparable, from what each run logged, and stops
with an error where one fails: 64 completions per generation batch on both sides and as many generation batches
(so W2 trains on each for 2 steps on both), the same completion cap and no completion above it, every W3
completion exactly 512 tokens long, KL logged at every W2 step on both sides.

This file is also the local plugin module of the grpo_kit runs (GRPO_KIT_PLUGINS=race, with benchmarks/ on
PYTHONPATH): grpo_kit's `python` reward imports `race:sum_accuracy`, and three always-on hooks record the step ends
and the completion lengths. Its top level imports only the standard library and pluggy, so that neither the TRL
process nor grpo_kit's plugin loading pays for torch or grpo_kit here.
"""

import argparse
import copy
import json
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
}
QUICK_STEPS = {"W1": (2, 4), "W2": (3, 6), "W3": (2, 3)}


def sum_accuracy(completions, solution, **_) -> list[float]:
    """1.0 where the completion is exactly the sum ("7+5=" -> "12"), else 0.0: TRL's reward signature."""
    return [1.0 if completion.strip() == answer else 0.0 for completion, answer in zip(completions, solution)]


# ---------------------------------------------------------------------------------------------------------------
# What the grpo_kit run records, through its hooks (this module is its GRPO_KIT_PLUGINS module).

_probe: dict = {"step_ends": {}, "generations": []}


@hookimpl
def on_rollout_scored(scored):
    _probe["generations"].append(scored.generated.completion_mask.sum(dim=1).tolist())  # None: the batch unchanged


@hookimpl
def on_step_end(step):
    _probe["step_ends"][step] = time.perf_counter()


@hookimpl
def on_train_end():
    if os.environ.get(PROBE_ENV):
        _probe["phases"] = PHASES.intervals
        Path(os.environ[PROBE_ENV]).write_text(json.dumps(_probe))


# ---------------------------------------------------------------------------------------------------------------
# Phase timers for --profile: wrappers around the functions a step is made of, recording (phase, start, end).


class PhaseTimer:
    def __init__(self):
        self.intervals: list[tuple[str, float, float]] = []

    def wrap(self, owner, attribute: str, phase) -> None:
        """Time every call of `owner.attribute` as `phase` (a name, or a function of the call's arguments)."""
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                name = phase(*args, **kwargs) if callable(phase) else phase
                self.intervals.append((name, started, time.perf_counter()))

        setattr(owner, attribute, timed)

    def time(self, phase: str):
        return _Interval(self, phase)


class _Interval:
    def __init__(self, timer: PhaseTimer, phase: str):
        self.timer, self.phase = timer, phase

    def __enter__(self):
        self.started = time.perf_counter()

    def __exit__(self, *_):
        self.timer.intervals.append((self.phase, self.started, time.perf_counter()))


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
    timer.wrap(grpo_kit.training.batches.GenerationBatches, "add_references", "old/ref log-probs")
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
    for phase, started, ended in intervals:
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


# ---------------------------------------------------------------------------------------------------------------
# The children: TRL's trainer, and the bare loop. Each writes its record as JSON to `out`.


def trl_child(workload: Workload, max_steps: int, workdir: Path, out: Path, profile: bool, seed: int) -> None:
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
        time_trl_phases(PHASES, RecordingTrainer)
    config = GRPOConfig(
        output_dir=str(workdir / "trl-output"),
        max_steps=max_steps,
        per_device_train_batch_size=workload.per_device_train_batch_size,
        gradient_accumulation_steps=workload.gradient_accumulation_steps,
        num_generations=NUM_GENERATIONS,
        max_completion_length=workload.max_completion_length,
        num_iterations=workload.num_iterations,
        beta=workload.beta,
        loss_type="dapo",
        learning_rate=LEARNING_RATE,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        generation_kwargs=workload.generation_kwargs,
        model_init_kwargs={"dtype": "float32"},
        # TRL's defaults that differ from grpo_kit's: bf16 autocast, gradient checkpointing and fused AdamW.
        bf16=False,
        gradient_checkpointing=False,
        optim="adamw_torch",  # unfused torch.optim.AdamW on both sides
        use_cpu=True,
        seed=seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    prompts = datasets.load_dataset("json", data_files=str(workdir / "prompts.jsonl"), split="train")
    clock = StepClock()
    trainer = RecordingTrainer(
        model=str(workdir / "model"), reward_funcs=sum_accuracy, args=config, train_dataset=prompts, callbacks=[clock]
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
        },
        "phases": PHASES.intervals,
    }
    out.write_text(json.dumps(record))


def bare_child(workload: Workload, max_steps: int, workdir: Path, out: Path, seed: int) -> None:
    """The compute itself: generate, score, old/reference log-probs, forward/backward/clip/AdamW, in a plain loop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    model = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if workload.beta else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()]
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
    prompts_per_generation = workload.completions_per_step // NUM_GENERATIONS
    micro_batches_per_generation = workload.gradient_accumulation_steps * workload.num_iterations
    off_policy = workload.num_iterations > 1  # the policy moves before the batch's later micro-batches

    def log_probs(policy, batch):  # (B, T), as grpo_kit and TRL compute them: the completion's tokens only
        length = batch["completion_mask"].shape[1]
        logits = (
            policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits_to_keep=length + 1)
            .logits[:, :-1]
            .float()
        )
        return logits.log_softmax(-1).gather(-1, batch["input_ids"][:, -length:].unsqueeze(-1)).squeeze(-1)

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
                )
                model.eval()
                with PHASES.time("generate"), torch.no_grad():
                    sequences = model.generate(**prompts, generation_config=generation_config)
                    completions = sequences[:, prompts.input_ids.shape[1] :]
                    is_eos = completions == tokenizer.eos_token_id
                    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), completions.shape[1])
                    completion_mask = (torch.arange(completions.shape[1]) <= first_eos[:, None]).long()
                generations.append(completion_mask.sum(1).tolist())
                # The same reward and group-normalised advantages as the others (TRL's scale_rewards="group"), so
                # that this policy learns as theirs do and its completions keep comparable lengths.
                with PHASES.time("score"):
                    answers = tokenizer.batch_decode(completions * completion_mask, skip_special_tokens=True)
                    rewards = torch.tensor(
                        sum_accuracy(answers, [row["solution"] for row in chosen for _ in range(NUM_GENERATIONS)])
                    )
                    groups = rewards.view(-1, NUM_GENERATIONS)
                    advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)
                batch = {
                    "input_ids": sequences,
                    "attention_mask": torch.cat([prompts.attention_mask, completion_mask], dim=1),
                    "completion_mask": completion_mask,
                    "advantages": advantages.view(-1),
                }
                active_tokens = completion_mask.sum()
                with PHASES.time("old/ref log-probs"), torch.no_grad():
                    if off_policy:
                        batch["old"] = log_probs(model, batch)
                    if reference is not None:
                        batch["ref"] = log_probs(reference, batch)
                order = torch.randperm(len(texts))
                micro_batches = [
                    {name: tensor[indices] for name, tensor in batch.items()}
                    for indices in order.chunk(workload.gradient_accumulation_steps)
                ]
                model.train()
            micro_batch = micro_batches[micro_step % workload.gradient_accumulation_steps]
            micro_step += 1
            with PHASES.time("forward+loss"):  # dapo: clipped ratio times advantage, over the batch's tokens
                logps = log_probs(model, micro_batch)
                ratio = torch.exp(logps - micro_batch.get("old", logps.detach()))
                advantages = micro_batch["advantages"][:, None]
                per_token = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
                if reference is not None:
                    difference = micro_batch["ref"] - logps
                    per_token = per_token + workload.beta * (torch.exp(difference) - difference - 1) * ratio
                loss = (per_token * micro_batch["completion_mask"]).sum() / active_tokens
            with PHASES.time("backward"):
                loss.backward()
        with PHASES.time("clip grad norm"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with PHASES.time("optimizer step"):
            optimizer.step()
            optimizer.zero_grad()
        step_ends[step] = time.perf_counter()
    out.write_text(json.dumps({"step_ends": step_ends, "generations": generations, "phases": PHASES.intervals}))


def grpo_kit_profile_child() -> None:
    """`python -m grpo_kit ARGS` in this process, with its phases timed (--profile)."""
    sys.modules["race"] = sys.modules[__name__]  # GRPO_KIT_PLUGINS=race then finds these hooks and PHASES
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


def grpo_kit_overrides(workload: Workload, max_steps: int, workdir: Path, run_dir: Path, seed: int) -> list[str]:
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


def run_child(command: list[str], env: dict, log_path: Path) -> tuple[float, float]:
    """Run `command` to its end; its peak resident MiB (from wait4, this child alone) and wall seconds."""
    started = time.perf_counter()
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPOSITORY)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-40:])
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({process.returncode}); its log {log_path} ends:\n{tail}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started  # Linux reports KiB


def run_side(
    side: str, workload: Workload, max_steps: int, workdir: Path, label: str, profile: bool, threads: int, seed: int
) -> dict:
    """One run of `side` on `workload` in a fresh process: its record (step ends, generations, metrics, settings)."""
    out = workdir / f"{label}.json"
    log_path = workdir / "logs" / f"{label}.log"
    # Every side gets the same number of torch threads (OpenMP's, which torch's CPU kernels use).
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
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
            *(["--profile"] if profile else []),
        ]
    peak_mib, wall = run_child(command, env, log_path)
    record = json.loads(out.read_text())
    record["step_ends"] = {int(step): seconds for step, seconds in record["step_ends"].items()}
    record |= {"peak_mib": peak_mib, "wall": wall}
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
            "dtype": config["model"]["model_init_kwargs"]["dtype"],
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
    return failures


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(workload: Workload, records: dict[str, list[dict]], first: int, last: int) -> dict:
    row = {}
    for side, runs in records.items():
        values = [
            v for record in runs for v in seconds_per_step(record["step_ends"], first, last, workload.num_iterations)
        ]
        lengths = [length for record in runs for batch in record["generations"] for length in batch]
        row[side] = {
            "seconds": median(values),
            "peak_mib": max(record["peak_mib"] for record in runs),
            "mean_length": sum(lengths) / len(lengths),
            "round_medians": [
                median(seconds_per_step(record["step_ends"], first, last, workload.num_iterations)) for record in runs
            ],
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
    print("per round (median s/step), mean completion length, bare peak MiB:")
    for name, row in rows.items():
        rounds = "  ".join(
            f"{side} {' '.join(f'{value:.3f}' for value in row[side]['round_medians'])}" for side in SIDES
        )
        lengths = " / ".join(f"{row[side]['mean_length']:.1f}" for side in SIDES)
        print(f"  {name}: {rounds};  length grpo_kit/TRL/bare {lengths};  bare {row['bare']['peak_mib']:.0f} MiB")


def print_profiles(profiles: dict[str, dict[str, dict]], ranges: dict[str, tuple[int, int]]) -> None:
    for name, by_side in profiles.items():
        first, last = whole_cycles(*ranges[name], WORKLOADS[name].num_iterations)
        print(f"\n{name}: mean seconds per step by phase, steps {first}-{last}")
        print(f"{'phase':20} " + " ".join(f"{side:>9} {'share':>6}" for side in by_side))
        for row in PROFILE_ROWS:
            cells = []
            for side, profile in by_side.items():
                cells.append(f"{profile[row]:9.3f} {profile[row] / profile['step']:6.1%}")
            print(f"{row:20} " + " ".join(cells))


def parse_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    first, last = int(first), int(last)
    if not 2 <= first <= last:
        raise argparse.ArgumentTypeError(f"{text}: write FIRST-LAST with 2 <= FIRST <= LAST (step 1 has no start)")
    return first, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3", help="comma-separated: W1,W2,W3")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side per workload, interleaved")
    parser.add_argument("--steps", type=parse_range, help="measured steps of W1 and W2, FIRST-LAST (default 6-30)")
    parser.add_argument("--w3-steps", type=parse_range, help="measured steps of W3, FIRST-LAST (default 3-8)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round of a few steps")
    parser.add_argument("--profile", action="store_true", help="one run per side with per-phase timings instead")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of every run (default 1: on a shared machine, OpenMP threads that wait for a busy core "
        "at every barrier made steps 25 times slower)",
    )
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
        return trl_child(WORKLOADS[args.workload], args.max_steps, args.workdir, args.out, args.profile, args.seed)
    if args.child == "bare":
        return bare_child(WORKLOADS[args.workload], args.max_steps, args.workdir, args.out, args.seed)
    if args.child is not None:  # never start a whole race from a child
        parser.error(f"unknown --child {args.child}")

    names = [name.strip() for name in args.workloads.split(",")]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}: choose from {', '.join(WORKLOADS)}")
    rounds = 1 if args.quick or args.profile else args.rounds
    ranges = {}
    for name in names:
        chosen = args.w3_steps if name == "W3" else args.steps
        ranges[name] = chosen or (QUICK_STEPS[name] if args.quick else WORKLOADS[name].steps)

    workdir = args.resume or Path(tempfile.mkdtemp(prefix="grpo_kit-race-"))
    (workdir / "logs").mkdir(exist_ok=True)
    started = time.perf_counter()
    print(
        f"race.py: {', '.join(names)}, {rounds} round(s), {args.threads} torch thread(s) per run, {os.cpu_count()} "
        f"CPUs, load {os.getloadavg()[0]:.2f}; "
        f"work folder {workdir}",
        flush=True,
    )
    if not (workdir / "prompts.jsonl").exists():  # written last: a resumed race has both
        build_model(workdir / "model")
        write_prompts(workdir / "prompts.jsonl")
    records = {name: {side: [] for side in SIDES} for name in names}
    for round_number in range(1, rounds + 1):
        for name in names:
            workload, (_, last) = WORKLOADS[name], ranges[name]
            for side in SIDES:
                label = f"{name}-{side}-{round_number}"
                # A finished run's record is kept, so that --resume goes on from the first run not finished.
                finished = workdir / f"{label}.finished.json"
                resumed = args.resume is not None and finished.exists()
                if resumed:
                    record = json.loads(finished.read_text())
                    record["step_ends"] = {int(step): seconds for step, seconds in record["step_ends"].items()}
                else:
                    seed = FIRST_SEED + round_number - 1
                    record = run_side(side, workload, last, workdir, label, args.profile, args.threads, seed)
                    finished.write_text(json.dumps(record))
                records[name][side].append(record)
                first = ranges[name][0]
                per_step = median(seconds_per_step(record["step_ends"], first, last, workload.num_iterations))
                print(
                    f"  round {round_number} {name} {side:8}: {per_step:7.3f} s/step, peak {record['peak_mib']:5.0f} "
                    f"MiB, process {record['wall']:6.1f} s{' (finished earlier)' if resumed else ''}",
                    flush=True,
                )

    failures = [failure for name in names for failure in check(WORKLOADS[name], records[name], ranges[name][1])]
    print(
        f"\nchecks: {'all passed' if not failures else f'{len(failures)} FAILED'} (completions per batch, "
        "generation batches, cap, W3 lengths, settings, float32, kl in W2)"
    )
    if args.profile:
        profiles = {
            name: {
                side: phase_profile(
                    runs[0]["phases"], runs[0]["step_ends"], *ranges[name], WORKLOADS[name].num_iterations
                )
                for side, runs in records[name].items()
            }
            for name in names
        }
        print_profiles(profiles, ranges)
    else:
        print()
        print_table({name: summarise(WORKLOADS[name], records[name], *ranges[name]) for name in names}, ranges)
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

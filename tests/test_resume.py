"""Exact resume: a run killed with SIGKILL at a random step and resumed ends with the weights of an unbroken run. A
signal stops a run saved, or at once when sent twice, with the exit code a requeue script reads."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from safetensors.torch import load_file

REWARD = textwrap.dedent("""
    import os
    import pathlib
    import time

    import grpo_kit

    def digits(prompts, completions, completion_ids, **columns):
        return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]

    def stuck_from_step_3(prompts, completions, trainer_state, **columns):
        if trainer_state.global_step >= 2:  # the steps done: step 3 is being scored
            pathlib.Path(os.environ["MARKER"]).touch()
            time.sleep(3600)
        return [0.0] * len(completions)

    def slow_on_eval_prompts(prompts, completions, **columns):
        if prompts[0].startswith("EVAL"):
            pathlib.Path(os.environ["MARKER"]).touch()
            time.sleep(2)
        return [0.0] * len(completions)

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("digits", digits)
        register("stuck_from_step_3", stuck_from_step_3)
        register("slow_on_eval_prompts", slow_on_eval_prompts)
""")


def command(tiny_model, run_dir, *extra, reward="digits"):
    return [
        sys.executable,
        "-m",
        "grpo_kit",
        f"+reward={reward}",
        f"model.name_or_path={tiny_model}",
        "generation.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.max_steps=8",
        "trainer.learning_rate=1e-2",
        "trainer.progress_bar=false",
        "trainer.save_steps=1",
        "trainer.logging_steps=1",
        "algorithm.steps_per_generation=2",
        "algorithm.num_iterations=2",  # pending batches cross step boundaries
        "trainer.resume=auto",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


@pytest.fixture
def env(tmp_path):
    (tmp_path / "digits_reward.py").write_text(REWARD)
    return {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "GRPO_KIT_PLUGINS": "digits_reward",
        "OMP_NUM_THREADS": "1",
        "MARKER": str(tmp_path / "marker"),  # written by a reward once it holds the run up
    }


def weights(run_dir):
    return load_file(run_dir / "model" / "model.safetensors")


CHILD_TIMEOUT_S = 300  # generous: a few tiny steps take seconds, but the CPU may be shared with other tests


class ChildRun:
    """A run in a child process. Its stdout and stderr go to files beside `run_dir`, so that a child that dies
    or hangs fails the test with what it printed, instead of the test waiting forever."""

    def __init__(self, args, env, run_dir):
        self.stdout = run_dir.with_name(f"{run_dir.name}.stdout")
        self.stderr = run_dir.with_name(f"{run_dir.name}.stderr")
        with self.stdout.open("w") as stdout, self.stderr.open("w") as stderr:
            self.process = subprocess.Popen(args, env=env, stdout=stdout, stderr=stderr, text=True)

    def wait_for(self, path, timeout=CHILD_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None:
                self.fail(f"the run exited with code {self.process.returncode} before writing {path}")
            if time.monotonic() > deadline:
                self.fail(f"the run wrote no {path} in {timeout} s")
            time.sleep(0.01)

    def finish(self, timeout=CHILD_TIMEOUT_S) -> str:
        """Wait for the child to exit; its stdout."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"the run did not exit in {timeout} s")
        return self.stdout.read_text()

    def fail(self, reason):
        self.process.kill()
        self.process.wait()
        pytest.fail(
            f"{reason}.\n--- its stdout ---\n{self.stdout.read_text()}\n--- its stderr ---\n{self.stderr.read_text()}",
            pytrace=False,
        )


ONE_BATCH_A_STEP = ("algorithm.steps_per_generation=1", "algorithm.num_iterations=1")


@pytest.mark.slow
@pytest.mark.parametrize(
    "setting",
    [
        "default",
        # The reference moves every 2 steps and the batches generated after it take their log-probs from it.
        "moving-reference",
        # The replayed batch and the recorded file go on from the checkpoint's positions.
        "replay",
    ],
)
def test_killed_and_resumed_run_ends_bit_for_bit_like_an_unbroken_one(tiny_model, tmp_path, env, setting):
    extra = {
        "default": (),
        "moving-reference": (
            "algorithm.beta=0.04",
            "algorithm.sync_ref_model=true",
            "algorithm.ref_model_sync_steps=2",
            *ONE_BATCH_A_STEP,
        ),
        "replay": (f"rollout_files.replay={tmp_path / 'recorded'}", "rollout_files.save=true", *ONE_BATCH_A_STEP),
    }[setting]
    if setting == "replay":
        subprocess.run(
            command(tiny_model, tmp_path / "recorded", "rollout_files.save=true", *ONE_BATCH_A_STEP),
            env=env,
            check=True,
            capture_output=True,
            timeout=CHILD_TIMEOUT_S,
        )
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    subprocess.run(
        command(tiny_model, unbroken, *extra), env=env, check=True, capture_output=True, timeout=CHILD_TIMEOUT_S
    )

    kill_after = random.randint(1, 6)
    child = ChildRun(command(tiny_model, broken, *extra), env, broken)
    child.wait_for(broken / "checkpoints" / f"step-{kill_after:06d}")
    child.process.send_signal(signal.SIGKILL)
    child.finish()
    assert not (broken / "model").exists(), "the run finished before it could be killed"

    subprocess.run(
        command(tiny_model, broken, *extra), env=env, check=True, capture_output=True, timeout=CHILD_TIMEOUT_S
    )
    ours, theirs = weights(broken), weights(unbroken)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours), f"differs after a kill at step {kill_after}"
    steps = [line for line in (broken / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 8
    if setting == "replay":
        recorded = [sorted(p.name for p in (d / "rollouts").glob("*.pt")) for d in (broken, unbroken)]
        assert recorded[0] == recorded[1] == [f"{i:06d}.pt" for i in range(1, 9)]


def test_sigterm_finishes_the_step_saves_and_stops(tiny_model, tmp_path, env):
    run_dir = tmp_path / "run"
    child = ChildRun(command(tiny_model, run_dir, "trainer.max_steps=1000"), env, run_dir)
    child.wait_for(run_dir / "checkpoints" / "step-000002")
    child.process.send_signal(signal.SIGTERM)
    stdout = child.finish()
    assert child.process.returncode == 128 + signal.SIGTERM  # as if the signal had ended it: a requeue sees no success
    assert "Stopped by SIGTERM" in stdout
    assert f"trainer.resume=auto hydra.run.dir={run_dir.resolve()}" in stdout  # the whole command, folder included
    assert "Done:" not in stdout and not (run_dir / "model").exists()
    saved = sorted((run_dir / "checkpoints").glob("step-*"))
    assert len(saved) == 2  # save_total_limit
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert saved[-1].name == f"step-{len(lines):06d}"


def test_a_second_sigint_stops_at_once_without_saving(tiny_model, tmp_path, env):
    run_dir = tmp_path / "run"
    args = command(
        tiny_model,
        run_dir,
        "trainer.max_steps=1000",
        "trainer.reward_timeout=3600",
        *ONE_BATCH_A_STEP,
        reward="stuck_from_step_3",
    )
    child = ChildRun(args, env, run_dir)
    child.wait_for(tmp_path / "marker")  # step 3's reward holds the step up for an hour
    child.process.send_signal(signal.SIGINT)
    time.sleep(1)  # two signals that come before Python's handler runs are one
    child.process.send_signal(signal.SIGINT)
    stdout = child.finish(timeout=60)
    assert child.process.returncode == 128 + signal.SIGINT
    assert "A second SIGINT stopped the run at once" in stdout and "Done:" not in stdout
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("step-*")) == ["step-000001", "step-000002"]


def test_a_signal_during_evaluation_abandons_it_saves_and_stops(tiny_model, tmp_path, env):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"prompt": f"EVAL {a}+1="}) + "\n" for a in range(30)))
    run_dir = tmp_path / "run"
    args = command(
        tiny_model,
        run_dir,
        "trainer.max_steps=1000",
        f"eval.path={eval_file}",
        "eval.steps=2",
        "eval.on_start=false",
        "eval.batch_size=1",
        "eval.num_generations=2",
        *ONE_BATCH_A_STEP,
        reward="slow_on_eval_prompts",
    )
    child = ChildRun(args, env, run_dir)
    child.wait_for(tmp_path / "marker")  # step 2's evaluation began: 30 batches of 2 s each
    signalled = time.monotonic()
    child.process.send_signal(signal.SIGTERM)
    stdout = child.finish()
    assert child.process.returncode == 128 + signal.SIGTERM
    assert time.monotonic() - signalled < 30, "the evaluation went on after the signal"
    assert "The evaluation of step 2 is abandoned" in stdout
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("step-*"))[-1] == "step-000002"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2] and not any(name.startswith("eval/") for name in lines[-1])


def test_resuming_with_changed_settings_is_refused_with_the_differences(registry, tiny_model, tmp_path):
    import grpo_kit
    from grpo_kit.contract.errors import ConfigError
    from grpo_kit.testing import tiny_run

    base = tiny_run(tiny_model, "+loss=dapo", "+reward=accuracy", "trainer.max_steps=2")
    grpo_kit.train(grpo_kit.compose(base, registry), tmp_path, registry)
    changed = grpo_kit.compose([*base, "trainer.resume=auto", "trainer.max_steps=3", "loss.epsilon=0.3"], registry)
    with pytest.raises(
        ConfigError, match=r"loss.epsilon: 0.2 -> 0.3\n.*trainer.max_steps: 2 -> 3 .*\n.*trainer.resume_force=true"
    ):
        grpo_kit.train(changed, tmp_path, registry)
    forced = grpo_kit.compose(
        [*base, "trainer.resume=auto", "trainer.max_steps=3", "loss.epsilon=0.3", "trainer.resume_force=true"], registry
    )
    grpo_kit.train(forced, tmp_path, registry)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    lock = json.loads((tmp_path / "plugins.lock.json").read_text())
    assert [session["from_step"] for session in lock["sessions"]] == [0, 2]  # the forced settings from step 2 on

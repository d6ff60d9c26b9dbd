"""Exact resume: a run killed with SIGKILL at a random step and resumed ends with the weights of an unbroken run."""

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
    import grpo_kit

    def digits(prompts, completions, completion_ids, **columns):
        return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("digits", digits)
""")


def command(tiny_model, run_dir, *extra):
    return [
        sys.executable, "-m", "grpo_kit", "+reward=digits", f"model.name_or_path={tiny_model}",
        "generation.num_generations=4", "trainer.per_device_train_batch_size=8", "trainer.max_steps=8",
        "trainer.learning_rate=1e-2", "trainer.progress_bar=false", "trainer.save_steps=1",
        "algorithm.steps_per_generation=2", "algorithm.num_iterations=2",  # pending batches cross step boundaries
        "trainer.resume=auto", f"hydra.run.dir={run_dir}", *extra,
    ]


@pytest.fixture
def env(tmp_path):
    (tmp_path / "digits_reward.py").write_text(REWARD)
    return {**os.environ, "PYTHONPATH": str(tmp_path), "GRPO_KIT_PLUGINS": "digits_reward", "OMP_NUM_THREADS": "1"}


def weights(run_dir):
    return load_file(run_dir / "model" / "model.safetensors")


@pytest.mark.slow
def test_killed_and_resumed_run_ends_bit_for_bit_like_an_unbroken_one(tiny_model, tmp_path, env):
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    subprocess.run(command(tiny_model, unbroken), env=env, check=True, capture_output=True)

    kill_after = random.randint(1, 6)
    process = subprocess.Popen(command(tiny_model, broken), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = broken / "checkpoints" / f"step-{kill_after:06d}"
    while not checkpoint.exists() and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (broken / "model").exists(), "the run finished before it could be killed"

    subprocess.run(command(tiny_model, broken), env=env, check=True, capture_output=True)
    ours, theirs = weights(broken), weights(unbroken)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours), f"differs after a kill at step {kill_after}"
    steps = [line for line in (broken / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 8


def test_sigterm_finishes_the_step_saves_and_stops(tiny_model, tmp_path, env):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(command(tiny_model, run_dir, "trainer.max_steps=1000"), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    while not (run_dir / "checkpoints" / "step-000002").exists():
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert "Stopped by SIGTERM" in stdout
    saved = sorted((run_dir / "checkpoints").glob("step-*"))
    assert len(saved) == 2  # save_total_limit
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert saved[-1].name == f"step-{len(lines):06d}"


def test_resuming_with_changed_settings_is_refused_with_the_differences(registry, tiny_model, tmp_path):
    import grpo_kit
    from grpo_kit.compatibility import ConfigError

    base = ["+loss=dapo", "+reward=accuracy", f"model.name_or_path={tiny_model}", "generation.num_generations=4",
            "trainer.per_device_train_batch_size=8", "trainer.max_steps=2", "trainer.progress_bar=false"]
    grpo_kit.train(grpo_kit.compose(base, registry), tmp_path, registry)
    changed = grpo_kit.compose([*base, "trainer.resume=auto", "trainer.max_steps=3", "loss.epsilon=0.3"], registry)
    with pytest.raises(ConfigError, match=r"loss.epsilon: 0.2 -> 0.3\n.*trainer.resume_force=true"):
        grpo_kit.train(changed, tmp_path, registry)
    forced = grpo_kit.compose([*base, "trainer.resume=auto", "trainer.max_steps=3", "loss.epsilon=0.3",
                               "trainer.resume_force=true"], registry)
    grpo_kit.train(forced, tmp_path, registry)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3

"""Several processes compute what one process computes: the same step on the same batch, split between them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "one_step_on_a_fixed_batch.py"
LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def run(command, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def steps(tiny_model, tmp_path_factory):
    """Parameters after one step of each loss: taken by one process, and by two processes (gloo)."""
    one, two = tmp_path_factory.mktemp("one-process"), tmp_path_factory.mktemp("two-processes")
    run([sys.executable, str(SCRIPT), str(tiny_model), str(one)], one)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531"]
    run([*torchrun, str(SCRIPT), str(tiny_model), str(two)], two)
    return one, two


@pytest.mark.slow
@pytest.mark.parametrize("loss", LOSSES)
def test_two_processes_on_two_halves_take_the_step_of_one_process_on_the_whole(steps, loss, tiny_model):
    one, two = (torch.load(directory / f"{loss}.pt") for directory in steps)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-6, msg=f"{loss}: {name}")


def torchrun_cli(tiny_model, run_dir, *overrides):
    """A short run of the tiny model as two processes (gloo), as `accelerate launch --multi_gpu` would start it."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29532",
        "-m",
        "grpo_kit",
        "+reward=accuracy",
        f"model.name_or_path={tiny_model}",
        "data.num_examples=64",
        "generation.num_generations=4",
        "trainer.per_device_train_batch_size=4",
        "trainer.learning_rate=1e-2",
        "trainer.max_steps=4",
        "trainer.save_steps=2",
        "trainer.save_total_limit=5",
        "trainer.progress_bar=false",
        "trainer.logging_steps=1",
        "algorithm.beta=0.04",
        "eval.split=test",
        "eval.num_examples=6",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    return run(command, run_dir)


@pytest.mark.slow
def test_two_processes_train_evaluate_and_resume_bit_for_bit(tiny_model, tmp_path):
    from safetensors.torch import load_file

    unbroken, resumed = tmp_path / "unbroken", tmp_path / "resumed"
    output = torchrun_cli(tiny_model, unbroken)
    assert "2 processes train this run" in output
    assert output.count("loss: dapo, the default") == 1  # said by the main process only
    torchrun_cli(tiny_model, resumed, f"trainer.resume={unbroken / 'checkpoints' / 'step-000002'}")
    ours, theirs = (load_file(d / "model" / "model.safetensors") for d in (resumed, unbroken))
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    lines = [json.loads(line) for line in (unbroken / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]  # one line a step: only the main process writes
    assert "eval/reward" in lines[-1] and "kl" in lines[-1]
    saved = torch.load(unbroken / "checkpoints" / "step-000002" / "state.pt", weights_only=False)
    assert len(saved["processes"]) == 2  # each process's pending batch and random generators

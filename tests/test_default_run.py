"""The embedded default, pinned: its first steps' losses and rewards and its weights after them, at a fixed seed and
one torch thread, as tests/data/default_run.json records them. A change that alters what the default run computes
fails here, and must record the run again on purpose (and say so in its commit):

    GRPO_KIT_RECORD_DEFAULT_RUN=1 python -m pytest tests/test_default_run.py
"""

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import grpo_kit

RECORD = Path(__file__).parent / "data" / "default_run.json"
COMMAND = ["+reward=accuracy", "trainer.max_steps=5", "trainer.torch_threads=1", "trainer.progress_bar=false"]
PINNED = ("loss", "reward", "reward_std", "completions/mean_length", "entropy", "grad_norm", "learning_rate")


def weights_sha256(model_dir: Path) -> str:
    weights = load_file(model_dir / "model.safetensors")
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def default_run(run_dir: Path) -> dict:
    cfg = grpo_kit.compose(COMMAND)
    assert cfg.algorithm.max_staleness == 0 and cfg.model.name_or_path is None, "the default is synchronous, embedded"
    grpo_kit.train(cfg, run_dir)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [{name: line[name] for name in ("step", *PINNED) if name in line} for line in lines if "loss" in line]
    return {"command": COMMAND, "steps": steps, "weights_sha256": weights_sha256(run_dir / "model")}


def test_the_default_run_computes_what_is_recorded(tmp_path):
    run = default_run(tmp_path / "run")
    if os.environ.get("GRPO_KIT_RECORD_DEFAULT_RUN") == "1":
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        provenance = {"commit_before": commit, "torch": torch.__version__, "machine": platform.machine()}
        RECORD.write_text(json.dumps(run | {"recorded_with": provenance}, indent=1) + "\n")
        pytest.skip(f"recorded {RECORD}: commit it")
    recorded = json.loads(RECORD.read_text())
    assert run["command"] == recorded["command"]
    assert len(run["steps"]) == 5 and run["steps"] == recorded["steps"], "the default run's steps changed"
    assert run["weights_sha256"] == recorded["weights_sha256"], "the default run's weights changed"

"""Checkpoints that cannot be trusted, and the run directory's lock: a crafted state.pt runs no code, a damaged or
incomplete checkpoint is never resumed from, a full disk leaves the last checkpoint as the only one, a second run
cannot share a directory, and a refused resume rewrites nothing."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

import grpo_kit
from grpo_kit.contract.errors import ConfigError, InputFileError
from grpo_kit.outputs import checkpoints as checkpoint
from grpo_kit.testing import tiny_run


class RunsCode:
    """Unpickled, it touches `marker`: what a crafted checkpoint could do with os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_state_pt_is_refused_and_runs_no_code(registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy"), registry)
    crafted = tmp_path / "elsewhere" / "checkpoints" / "step-000001"
    crafted.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    torch.save({"step": 1, "model": RunsCode(marker)}, crafted / "state.pt")
    (crafted / "config.json").write_text(json.dumps(OmegaConf.to_container(cfg, resolve=True)))
    checkpoint.write_manifest(crafted)  # as a crafted checkpoint would: its checksums match

    resumed = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", f"trainer.resume={crafted}"), registry)
    with pytest.raises(InputFileError, match=r"state.pt holds more than tensors and plain data, so it was not loaded"):
        grpo_kit.train(resumed, tmp_path / "run", registry)
    assert not marker.exists()


def damage(folder, how):
    state = folder / "state.pt"
    if how == "zeroed":
        with state.open("r+b") as file:  # as a bad disk would: the same length, 4000 bytes of it zeros
            file.seek(state.stat().st_size // 2)
            file.write(bytes(4000))
    elif how == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    else:
        state.unlink()


DAMAGES = {4: "deleted", 3: "truncated", 2: "zeroed"}  # step -> how its checkpoint is damaged
REASONS = {"deleted": "state.pt is missing", "truncated": "state.pt is damaged", "zeroed": "state.pt is damaged"}


def test_damaged_checkpoints_are_refused_by_name_and_skipped_by_resume_auto(registry, tiny_model, tmp_path, caplog):
    settings = tiny_run(
        tiny_model, "+reward=accuracy", "trainer.max_steps=4", "trainer.save_steps=1", "trainer.save_total_limit=5"
    )
    run_dir = tmp_path / "run"
    grpo_kit.train(grpo_kit.compose(settings, registry), run_dir, registry)
    unbroken = load_file(run_dir / "model" / "model.safetensors")
    for step, how in DAMAGES.items():
        damage(run_dir / "checkpoints" / f"step-{step:06d}", how)

    for step, how in DAMAGES.items():
        named = run_dir / "checkpoints" / f"step-{step:06d}"
        with pytest.raises(InputFileError, match=rf"trainer.resume={named} cannot be resumed from: {REASONS[how]}"):
            grpo_kit.train(grpo_kit.compose([*settings, f"trainer.resume={named}"], registry), run_dir, registry)

    with caplog.at_level(logging.INFO, logger="grpo_kit"):
        grpo_kit.train(grpo_kit.compose([*settings, "trainer.resume=auto"], registry), run_dir, registry)
    for step, how in DAMAGES.items():
        assert f"Skipping the checkpoint {run_dir / 'checkpoints' / f'step-{step:06d}'}" in caplog.text
    assert f"Resuming from {run_dir / 'checkpoints' / 'step-000001'} (step 1)" in caplog.text
    resumed = load_file(run_dir / "model" / "model.safetensors")
    assert all(torch.equal(resumed[name], unbroken[name]) for name in unbroken)
    assert all(checkpoint.damage(saved) is None for saved in checkpoint.saved_checkpoints(run_dir))  # saved again


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ({"format": 2, "sha256": []}, "is not a manifest"),
        ({"format": 2, "sha256": {"state.pt": 1}}, "is not a manifest"),
        ({"format": 2, "sha256": {}}, "lists neither state.pt nor model/"),  # with state.pt deleted: not intact
        ([], "unreadable"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_skipped_by_resume_auto(registry, tiny_model, tmp_path, manifest, reason):
    """Each crashed resume=auto (a list for checksums), or was taken for intact (an empty one)."""
    settings = tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=2", "trainer.save_steps=1")
    grpo_kit.train(grpo_kit.compose(settings, registry), tmp_path, registry)
    newest = tmp_path / "checkpoints" / "step-000002"
    (newest / "state.pt").unlink()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    assert reason in checkpoint.damage(newest)
    assert checkpoint.checkpoint_to_resume(
        tmp_path, grpo_kit.compose([*settings, "trainer.resume=auto"], registry)
    ) == (tmp_path / "checkpoints" / "step-000001")


def test_a_checkpoint_of_an_earlier_format_is_refused_at_claim_time(registry, tiny_model, tmp_path, monkeypatch):
    """A TrainState laid out otherwise (format 1: the generation batch as loose micro-batches) cannot be loaded: it is
    refused, saying so, before the model loads."""
    settings = tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=1")
    monkeypatch.setattr(checkpoint, "FORMAT", 1)
    grpo_kit.train(grpo_kit.compose(settings, registry), tmp_path, registry)
    monkeypatch.undo()
    named = tmp_path / "checkpoints" / "step-000001"
    with pytest.raises(InputFileError, match=r"an earlier grpo_kit wrote it, .*format 1; this version reads format 2"):
        grpo_kit.train(grpo_kit.compose([*settings, f"trainer.resume={named}"], registry), tmp_path, registry)


def test_a_run_whose_checkpoints_are_all_damaged_is_refused(registry, tiny_model, tmp_path):
    settings = tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=1")
    grpo_kit.train(grpo_kit.compose(settings, registry), tmp_path, registry)
    damage(tmp_path / "checkpoints" / "step-000001", "zeroed")
    with pytest.raises(ConfigError, match=r"trained 1 step\(s\) but none of its checkpoints is intact"):
        grpo_kit.train(grpo_kit.compose([*settings, "trainer.resume=auto"], registry), tmp_path, registry)


def test_a_full_disk_removes_the_partial_checkpoint_and_names_the_intact_one(
    registry, tiny_model, tmp_path, monkeypatch
):
    real_save, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # what torch.save raises on a full disk: no OSError
            raise RuntimeError(
                "[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file "
                "data/0: file write failed"
            )
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "trainer.save_steps=1"), registry)
    with pytest.raises(OSError, match=r"step 2 could not be written .*; the previous checkpoint .*000001 is intact"):
        grpo_kit.train(cfg, tmp_path, registry)
    assert [path.name for path in (tmp_path / "checkpoints").iterdir()] == ["step-000001"]  # no .writing-step-000002
    assert checkpoint.damage(tmp_path / "checkpoints" / "step-000001") is None


def test_a_traceback_that_error_txt_cannot_hold_reaches_the_console(tmp_path, caplog):
    from grpo_kit.cli.main import write_error_file

    (tmp_path / "error.txt").mkdir()  # unwritable, as on the full disk that failed the run
    write_error_file(
        tmp_path, "Traceback (most recent call last):\nOSError: The checkpoint of step 2 could not be written\n"
    )
    assert "OSError: The checkpoint of step 2 could not be written\n(error.txt could not be written: " in caplog.text


HOLD_THE_LOCK = textwrap.dedent("""
    import sys
    from pathlib import Path
    from grpo_kit.outputs.checkpoints import lock_run_directory

    lock_run_directory(Path(sys.argv[1]))
    print("locked", flush=True)
    sys.stdin.read()  # held until the test closes stdin or kills this process
""")


def test_a_directory_in_use_by_another_process_is_refused_until_that_process_dies(registry, tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=1"), registry)
        with pytest.raises(ConfigError, match=rf"{run_dir} is in use by another run \(pid {holder.pid}, "):
            grpo_kit.train(cfg, run_dir, registry)
        assert [path.name for path in run_dir.iterdir()] == [".lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    grpo_kit.train(cfg, run_dir, registry)  # the lock died with its process
    assert not (run_dir / ".lock").exists()  # released at the end of the run, for the next one
    locked = subprocess.run(
        [sys.executable, "-c", HOLD_THE_LOCK, str(run_dir)], input="", capture_output=True, text=True, timeout=60
    )
    assert locked.stdout == "locked\n", locked.stderr


def snapshot(directory):
    return {path: path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_a_resume_refused_from_the_command_line_rewrites_nothing(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=1", f"hydra.run.dir={run_dir}")
    command = [sys.executable, "-m", "grpo_kit", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    before = snapshot(run_dir)
    records = [run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml", run_dir / "config.yaml"]
    assert set(records) <= set(before)

    refused = subprocess.run(
        [*command, "trainer.resume=auto", "loss.epsilon=0.3"], env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 1
    assert "was saved with other settings:\n  loss.epsilon: 0.2 -> 0.3" in refused.stdout + refused.stderr
    assert snapshot(run_dir) == before

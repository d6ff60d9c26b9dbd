"""The Hydra app: a sweep records a failed run, goes on, and exits 1 once the other runs are done."""

import subprocess
import sys


def test_a_failing_run_does_not_stop_the_sweep(tiny_model, tmp_path):
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "-m",
            "+reward=accuracy",
            f"model.name_or_path={tiny_model}",
            "generation.num_generations=4",
            "trainer.max_steps=2",
            "trainer.progress_bar=false",
            "trainer.save_model=false",
            "trainer.per_device_train_batch_size=6,8",
            "trainer.logging_steps=1",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stderr
    summary = f"1 run(s) of the sweep failed; each one's error.txt says why:\n  {sweep / '0' / 'error.txt'}"
    assert summary in result.stderr
    assert "not a multiple of generation.num_generations=4" in (sweep / "0" / "error.txt").read_text()
    assert not (sweep / "1" / "error.txt").exists()
    assert len((sweep / "1" / "metrics.jsonl").read_text().splitlines()) == 2

"""`grpo-kit report DIR --band FILE`: runs drawn against a recipe's reference band (grpo_kit/report/bands.py).

The runs are written as the trainer writes them, with straight-line metrics, so each window mean is known exactly;
the band is made by band_record from three such seeds, as tests/recipe_bands/regenerate.py makes it.
"""

import json
import math

import pytest

from grpo_kit.contract.errors import ReportError
from grpo_kit.report import main, write_report
from grpo_kit.report.bands import BAND_METRICS, Band, band_record, window_means

STEPS, WINDOW = [10, 20], 10
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def metrics(offset: float, steps: int = 20) -> list[dict]:
    lines = [{"step": 0, "eval/reward": 0.1}]  # an evaluation before training: not a training step
    for step in range(1, steps + 1):
        values = {"reward": offset + 0.01 * step, "completions/mean_length": 2.5, "entropy": 1.0 - 0.01 * step}
        lines.append({"step": step, "loss": 0.0, **values})
    return lines


def write_run(directory, offset: float, steps: int = 20):
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(f"seed: 0\ntrainer:\n  max_steps: {steps}\n")
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in metrics(offset, steps)))


def write_band(path, offsets=(0.0, 0.01, 0.02)) -> Band:
    per_seed = {seed: window_means(metrics(offset), STEPS, WINDOW) for seed, offset in enumerate(offsets, 1)}
    floor = {metric: 0.001 for metric in BAND_METRICS}
    record = band_record("dapo", ["+experiment=dapo"], STEPS, WINDOW, 2.0, [1, 2, 3], 0, per_seed, floor, {})
    path.write_text(json.dumps(record))
    return Band.read(path)


def test_window_means_are_the_steps_up_to_each_step():
    means = window_means(metrics(0.0), STEPS, WINDOW)
    assert means["reward"] == pytest.approx([0.055, 0.155])  # steps 1..10 and 11..20
    assert means["completions/mean_length"] == [2.5, 2.5]
    assert math.isnan(window_means(metrics(0.0, steps=10), STEPS, WINDOW)["reward"][1])  # stopped before step 20


def test_the_band_is_mean_and_k_std_with_a_floor(tmp_path):
    band = write_band(tmp_path / "band.json")
    low, high = band.bounds("reward")
    assert low[0] == pytest.approx(0.065 - 2 * 0.01) and high[1] == pytest.approx(0.165 + 2 * 0.01)
    low, high = band.bounds("completions/mean_length")  # every seed 2.5: the floor gives the width
    assert (low[0], high[0]) == pytest.approx((2.5 - 0.002, 2.5 + 0.002))
    assert band.outside(window_means(metrics(0.01), STEPS, WINDOW)) == []
    outside = band.outside(window_means(metrics(0.06), STEPS, WINDOW))
    assert outside and all(line.startswith("reward at step") for line in outside)
    assert band.outside(window_means(metrics(0.01, steps=10), STEPS, WINDOW))  # a run that stopped early


def test_report_draws_the_runs_against_the_band(tmp_path, capsys):
    band_file = tmp_path / "dapo.json"
    write_band(band_file)
    sweep = tmp_path / "sweep"
    write_run(sweep / "0", 0.01)
    write_run(sweep / "1", 0.08)
    assert main([str(sweep), "--band", str(band_file)]) == 0
    assert (sweep / "band.png").read_bytes().startswith(PNG_SIGNATURE)
    report = (sweep / "report.md").read_text()
    assert "## Against the reference band of `dapo`" in report and "![" in report and "band.png" in report
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith(("| 0 |", "| 1 |"))}
    assert rows["| 0"].endswith("| yes |") and rows["| 1"].endswith("| no |")  # 0.08: 3.5 std above the band
    assert "band.png" in capsys.readouterr().out


def test_a_bad_band_file_writes_nothing(tmp_path):
    write_run(tmp_path / "run", 0.0)
    with pytest.raises(ReportError, match="No band file"):
        write_report(tmp_path / "run", band=tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ReportError, match="not a band file"):
        write_report(tmp_path / "run", band=tmp_path / "junk.json")
    assert not (tmp_path / "run" / "report.md").exists()

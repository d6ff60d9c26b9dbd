"""Paired differences in the sweep report, on a synthetic sweep whose runs all replay the same frozen rollouts.

Three variants (+loss=grpo, dapo, cispo). Every metric is `BASE + OFFSET[loss] + SLOPE[loss] * step +
SEED_EFFECT[loss] * seed`, so the difference from grpo at a step is known exactly: for dapo 0.5 + 0.01 * step +
0.02 * seed, for cispo -0.25. The reward depends on the seed and the step only, as it does under replay.
"""

import csv
import json
import statistics

import pytest
import yaml

from grpo_kit.contract.errors import ReportError
from grpo_kit.report import main, write_report
from grpo_kit.report.collect import find_runs
from grpo_kit.report.paired import compare
from grpo_kit.report.paired_plots import draw_paired_figures
from grpo_kit.report.tables import group_variants

STEPS = 8  # the last quarter: steps 7 and 8
REPLAY = "outputs/recorded"
SEEDS = {"grpo": (0, 1, 2), "dapo": (0, 1, 2), "cispo": (0, 1, 5)}  # cispo's seed 5 has no baseline run
BASE = {"loss": 0.5, "entropy": 1.0, "grad_norm": 2.0, "clip_ratio/region_mean": 0.25, "eval/reward": 0.125}
OFFSET = {"grpo": 0.0, "dapo": 0.5, "cispo": -0.25}
SLOPE = {"grpo": 0.0, "dapo": 0.01, "cispo": 0.0}
SEED_EFFECT = {"grpo": 0.125, "dapo": 0.145, "cispo": 0.125}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def value(loss, seed, step, metric):
    return BASE[metric] + OFFSET[loss] + SLOPE[loss] * step + SEED_EFFECT[loss] * seed


def reward(seed, step):
    return 0.25 + 0.0625 * seed + 0.01 * step


def write_run(directory, loss, seed, replay=REPLAY, reward_shift=0.0):
    (directory / ".hydra").mkdir(parents=True)
    overrides = [f"+loss={loss}", f"seed={seed}", "+reward=accuracy"]
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"seed": seed, "trainer": {"max_steps": STEPS}, "rollouts": {"replay": replay, "save": False}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for step in range(1, STEPS + 1):
        line = {"step": step, "reward": reward(seed, step) + reward_shift, "completions/mean_length": 4.0}
        line |= {name: value(loss, seed, step, name) for name in ("loss", "entropy", "grad_norm")}
        if loss == "cispo":
            line["cispo_clip_ratio"] = 0.0  # no other variant logs it: nothing to pair it with
        else:
            line["clip_ratio/region_mean"] = value(loss, seed, step, "clip_ratio/region_mean")
        if step % 4 == 0:
            line["eval/reward"] = value(loss, seed, step, "eval/reward")
        lines.append(json.dumps(line) + "\n")
    (directory / "metrics.jsonl").write_text("".join(lines))


def write_sweep(sweep_dir, replay=REPLAY, special=None):
    """The sweep's runs in job order; `special[(loss, seed)]` gives one run other write_run arguments."""
    special = special or {}
    number = 0
    for loss, seeds in SEEDS.items():
        for seed in seeds:
            write_run(sweep_dir / str(number), loss, seed, **({"replay": replay} | special.get((loss, seed), {})))
            number += 1
    return sweep_dir


@pytest.fixture
def sweep(tmp_path):
    return write_sweep(tmp_path / "multirun" / "2026-01-01" / "12-00-00")


def expected(loss, metric, baseline="grpo", last_quarter=False):
    """Mean and std over the seeds both ran of each seed's difference averaged over its steps."""
    steps = range(1, STEPS + 1) if metric != "eval/reward" else (4, 8)
    steps = list(steps)[-max(1, len(steps) // 4) :] if last_quarter else steps
    seeds = [seed for seed in SEEDS[loss] if seed in SEEDS[baseline]]
    averages = [
        statistics.fmean(value(loss, seed, step, metric) - value(baseline, seed, step, metric) for step in steps)
        for seed in seeds
    ]
    return statistics.fmean(averages), statistics.stdev(averages)


def read_csv(path):
    with path.open() as file:
        return list(csv.DictReader(file))


def test_paired_csv_per_variant_metric_and_step(sweep):
    written = [path.name for path in write_report(sweep, plots=False, baseline="+loss=grpo")]
    assert written == ["report.md", "runs.csv", "variants.csv", "paired.csv"]
    rows = read_csv(sweep / "paired.csv")
    assert list(rows[0]) == ["variant", "metric", "step", "mean_diff", "std_diff", "n_seeds"]
    by_key = {(row["variant"], row["metric"], int(row["step"])): row for row in rows}
    dapo = by_key["+loss=dapo", "loss", 3]  # 0.5 + 0.03 + 0.02 * seed for seeds 0, 1, 2
    assert float(dapo["mean_diff"]) == pytest.approx(0.55)
    assert float(dapo["std_diff"]) == pytest.approx(0.02)
    assert dapo["n_seeds"] == "3"
    cispo = by_key["+loss=cispo", "entropy", 8]
    assert (float(cispo["mean_diff"]), float(cispo["std_diff"]), cispo["n_seeds"]) == (-0.25, 0.0, "2")
    # Logged every fourth step only: paired at those steps only.
    evaluated = [step for variant, metric, step in by_key if (variant, metric) == ("+loss=dapo", "eval/reward")]
    assert evaluated == [4, 8]
    # What replay cannot change is not compared, and cispo's own clip ratio has no baseline to differ from.
    metrics = {metric for _, metric, _ in by_key}
    assert metrics == {"loss", "entropy", "grad_norm", "clip_ratio/region_mean", "eval/reward"}
    assert {metric for variant, metric, _ in by_key if variant == "+loss=cispo"} == metrics - {"clip_ratio/region_mean"}
    assert {variant for variant, _, _ in by_key} == {"+loss=dapo", "+loss=cispo"}  # the baseline is not compared


def test_report_section_means_over_seeds_of_step_averages(sweep):
    write_report(sweep, plots=False)
    report = (sweep / "report.md").read_text()
    # No --baseline: the first label in sorted order (+loss=cispo < +loss=dapo < +loss=grpo).
    assert "## Paired differences vs `+loss=cispo` (frozen rollouts)" in report
    write_report(sweep, plots=False, baseline="+loss=grpo")
    report = (sweep / "report.md").read_text()
    assert "## Paired differences vs `+loss=grpo` (frozen rollouts)" in report
    assert f"frozen rollouts of `{REPLAY}`" in report
    all_steps, last_quarter = expected("dapo", "loss"), expected("dapo", "loss", last_quarter=True)
    assert all_steps == pytest.approx((0.565, 0.02)) and last_quarter == pytest.approx((0.595, 0.02))
    assert "| `+loss=dapo` | loss | +0.565 ± 0.02 | +0.595 ± 0.02 | 3 |" in report
    mean, std = expected("dapo", "eval/reward")
    assert f"| `+loss=dapo` | eval/reward | {mean:+.3g} ± {std:.2g} |" in report
    assert "| `+loss=cispo` | grad_norm | -0.25 ± 0 | -0.25 ± 0 | 2 |" in report
    assert "Reward is the same as the baseline's at every paired step" in report


def test_paired_figures(sweep):
    names = [path.name for path in write_report(sweep, baseline="loss=grpo")]
    paired = {
        "paired_loss.png",
        "paired_entropy.png",
        "paired_grad_norm.png",
        "paired_clip_ratio_region_mean.png",
        "paired_eval_reward.png",
    }
    assert paired <= set(names) and "paired.csv" in names
    for name in paired:
        assert (sweep / name).read_bytes().startswith(PNG_SIGNATURE), name
    assert (
        "![clip_ratio/region_mean: difference vs the baseline](paired_clip_ratio_region_mean.png)"
        in (sweep / "report.md").read_text()
    )


def test_paired_figures_tick_whole_steps_mark_their_points_and_say_how_many_seeds(sweep):
    variants, _ = group_variants(find_runs(sweep))
    figures = draw_paired_figures(compare(variants, "loss=grpo"), variants)
    for name, fig in figures.items():
        ax = fig.axes[0]
        assert all(float(tick).is_integer() for tick in ax.get_xticks()), name
        differences = [line for line in ax.get_lines() if "baseline" not in line.get_label()]
        assert {line.get_marker() for line in differences} == {"o"}, name  # 8 steps or fewer: sparse
    entropy = figures["paired_entropy.png"].axes[0]
    assert "2-3 seeds per variant" in entropy.get_title(loc="left")  # cispo's seed 5 has no baseline run
    legend = [text.get_text() for text in entropy.get_legend().get_texts()]
    assert legend == ["+loss=grpo (baseline)", "+loss=dapo  (n=3)", "+loss=cispo  (n=2)"]


def test_a_metric_no_variant_changed_has_no_figure(sweep):
    for metrics in sweep.glob("*/metrics.jsonl"):
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        metrics.write_text("".join(json.dumps(line | {"grad_norm": 2.0}) + "\n" for line in lines))
    variants, _ = group_variants(find_runs(sweep))
    figures = draw_paired_figures(compare(variants, "loss=grpo"), variants)
    assert "paired_grad_norm.png" not in figures and "paired_loss.png" in figures
    write_report(sweep, plots=False, baseline="loss=grpo")
    report = (sweep / "report.md").read_text()
    assert "The same as the baseline's at every paired step, for every variant (no figure): `grad_norm`." in report
    assert "| `+loss=dapo` | grad_norm | +0 ± 0 | +0 ± 0 | 3 |" in report  # still in the table


def test_baseline_option_of_the_command(sweep, capsys):
    assert main([str(sweep), "--no-plots", "--baseline", "loss=dapo"]) == 0  # `+` left out: the same choice
    report = (sweep / "report.md").read_text()
    assert "## Paired differences vs `+loss=dapo` (frozen rollouts)" in report
    mean, std = expected("grpo", "loss", baseline="dapo")
    assert f"| `+loss=grpo` | loss | {mean:+.3g} ± {std:.2g} |" in report and mean < 0
    assert main([str(sweep), "--no-plots", "--baseline", "loss=sapo"]) == 1
    error = capsys.readouterr().err
    assert "--baseline 'loss=sapo' matches none of the variants trained on frozen rollouts" in error
    assert "'+loss=grpo'" in error
    with pytest.raises(ReportError, match="matches 3 of the variants"):
        write_report(sweep, plots=False, baseline="+reward=accuracy")  # every variant has it


def test_a_reward_that_differs_under_replay_is_flagged(tmp_path):
    sweep = write_sweep(tmp_path, special={("dapo", 1): {"reward_shift": 0.5}})
    write_report(sweep, plots=False, baseline="loss=grpo")
    report = (sweep / "report.md").read_text()
    assert "**Reward differs under replay**" in report
    first = reward(1, 1)
    assert (
        f"`+loss=dapo` seed 1: reward differs from the baseline's at 8 of 8 steps (first at step 1: "
        f"{first + 0.5:.6g} vs {first:.6g})" in report
    )
    assert "Reward is the same" not in report


def test_runs_on_other_rollouts_are_not_paired(tmp_path):
    sweep = write_sweep(tmp_path, special={("cispo", seed): {"replay": "outputs/other"} for seed in SEEDS["cispo"]})
    write_report(sweep, plots=False, baseline="loss=grpo")
    rows = read_csv(sweep / "paired.csv")
    assert {row["variant"] for row in rows} == {"+loss=dapo"}
    assert "Not compared, no seed on the baseline's rollouts: `+loss=cispo`." in (sweep / "report.md").read_text()


def test_a_sweep_without_replay_has_no_paired_section(tmp_path):
    sweep = write_sweep(tmp_path, replay=None)
    written = [path.name for path in write_report(sweep)]
    assert "paired.csv" not in written and not any(name.startswith("paired_") for name in written)
    assert "Paired differences" not in (sweep / "report.md").read_text()
    with pytest.raises(ReportError, match="paired differences need two variants with completed runs on frozen"):
        write_report(sweep, plots=False, baseline="loss=grpo")


def test_pairs_are_a_seed_on_one_replay_directory(tmp_path):
    for number, (loss, replay) in enumerate([("grpo", "a"), ("grpo", "b"), ("dapo", "a"), ("dapo", "b")]):
        write_run(tmp_path / str(number), loss, 0, replay=replay)  # seed 0 twice: once on each directory
    write_report(tmp_path, plots=False, baseline="loss=grpo")
    report = (tmp_path / "report.md").read_text()
    assert "frozen rollouts of `a`, `b`" in report
    assert "| `+loss=dapo` | loss | +0.545 ± 0 | +0.575 ± 0 | 2 |" in report

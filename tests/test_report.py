"""The sweep report on a synthetic sweep directory: its tables' numbers, its figures, its command and callback.

The sweep: three variants (+loss=grpo, dapo, cispo) x two seeds, written as the trainer and Hydra write them,
with the last run (cispo, seed 1) failed. Every reward is a straight line, so every number is known exactly.
"""

import csv
import json
import math
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from grpo_kit.contract.errors import ReportError
from grpo_kit.report import final_reward, main, write_report
from grpo_kit.report.callback import ReportCallback
from grpo_kit.report.collect import find_runs
from grpo_kit.report.plots import FIGURES, _curve, draw_figures, moving_average
from grpo_kit.report.tables import group_variants

STEPS = 20  # the final reward is the mean of the last 20 // 10 = 2 steps
SECONDS_PER_STEP = 0.5
MEAN_LENGTH = 4.0
BATCH, ACCUMULATION = 8, 2  # 16 completions per step: 4 x 16 / 0.5 = 128 tokens per second
START = {("grpo", 0): 0.2, ("grpo", 1): 0.3, ("dapo", 0): 0.4, ("dapo", 1): 0.5, ("cispo", 0): 0.1, ("cispo", 1): 0.0}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


EVAL_STEPS = 5  # an evaluation every 5 steps, scoring half the training reward


def reward(loss: str, seed: int, step: int) -> float:
    return START[loss, seed] + 0.01 * step


def write_run(directory, loss, seed, steps=STEPS, max_steps=STEPS, error=None, logging_steps=1):
    (directory / ".hydra").mkdir(parents=True)
    overrides = [f"+loss={loss}", f"seed={seed}", "+reward=accuracy"]
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {
        "seed": seed,
        "loss": {"name": loss},
        "trainer": {
            "max_steps": max_steps,
            "per_device_train_batch_size": BATCH,
            "gradient_accumulation_steps": ACCUMULATION,
            "logging_steps": logging_steps,
        },
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [json.dumps({"step": 0, "eval/reward": reward(loss, seed, 0) / 2})]  # eval.on_start: before training
    for step in range(logging_steps, steps + 1, logging_steps):
        line = {
            "step": step,
            "reward": reward(loss, seed, step),
            "completions/mean_length": MEAN_LENGTH,
            "seconds_per_step": SECONDS_PER_STEP,
            "entropy": 1.0 - 0.01 * step,
            "loss": 0.1,
        }
        if loss == "cispo":
            line["cispo_clip_ratio"] = 0.0
        else:
            line["clip_ratio/region_mean"] = 0.01
        if loss == "dapo":
            line["kl"] = None if step == 1 else 0.001 * step  # the logger writes a NaN as null
        if step % EVAL_STEPS == 0:
            line["eval/reward"] = reward(loss, seed, step) / 2
        lines.append(json.dumps(line))
    (directory / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if error:
        (directory / "error.txt").write_text(error)


@pytest.fixture
def sweep(tmp_path):
    sweep_dir = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    number = 0
    for loss in ("grpo", "dapo", "cispo"):
        for seed in (0, 1):
            failed = loss == "cispo" and seed == 1
            error = "Traceback (most recent call last):\n  ...\nRuntimeError: reward server went away\n"
            steps = 3 if failed else STEPS
            write_run(sweep_dir / str(number), loss, seed, steps=steps, error=error if failed else None)
            number += 1
    (sweep_dir / "multirun.yaml").write_text("hydra: {}\n")
    return sweep_dir


def read_csv(path):
    with path.open() as file:
        return list(csv.DictReader(file))


def test_runs_table(sweep):
    write_report(sweep, plots=False)
    rows = read_csv(sweep / "runs.csv")
    assert [row["run"] for row in rows] == ["0", "1", "2", "3", "4", "5"]
    first = rows[0]
    assert first["variant"] == "+loss=grpo" and first["seed"] == "0" and first["status"] == "ok"
    assert float(first["final_reward"]) == pytest.approx((reward("grpo", 0, 19) + reward("grpo", 0, 20)) / 2)
    assert float(first["best_reward"]) == pytest.approx(reward("grpo", 0, 20))
    assert float(first["eval_reward"]) == pytest.approx(reward("grpo", 0, 20) / 2)  # the last evaluation's
    assert first["steps"] == "20"
    assert float(first["wall_time_s"]) == pytest.approx(STEPS * SECONDS_PER_STEP)
    assert float(first["tokens_per_s"]) == pytest.approx(MEAN_LENGTH * BATCH * ACCUMULATION / SECONDS_PER_STEP)
    assert first["overrides"] == "+loss=grpo seed=0 +reward=accuracy"
    failed = rows[5]
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: reward server went away"


def test_a_run_whose_rewards_failed_is_marked(sweep):
    metrics = sweep / "0" / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    for line in lines[1:]:
        line["rewards/accuracy/failures"] = 1.0 if line["step"] in (4, 5) else 0.0  # it raised or timed out
    lines[7]["reward"] = None  # no completion of step 7 had a reward
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    write_report(sweep, plots=False)
    rows = read_csv(sweep / "runs.csv")
    assert [(row["status"], row["reward_failed_steps"]) for row in rows[:2]] == [("ok", "3"), ("ok", "0")]
    report = (sweep / "report.md").read_text()
    assert "| ok, rewards failed on 3 logged steps |" in report and "1 whose rewards failed on some steps" in report


def test_variants_table_is_mean_and_std_over_seeds(sweep):
    write_report(sweep, plots=False)
    rows = {row["variant"]: row for row in read_csv(sweep / "variants.csv")}
    assert list(rows) == ["+loss=dapo", "+loss=grpo", "+loss=cispo"]  # best final reward first
    finals = {seed: (reward("grpo", seed, 19) + reward("grpo", seed, 20)) / 2 for seed in (0, 1)}
    grpo = rows["+loss=grpo"]
    assert float(grpo["final_reward_mean"]) == pytest.approx((finals[0] + finals[1]) / 2)
    assert float(grpo["final_reward_std"]) == pytest.approx(abs(finals[0] - finals[1]) / math.sqrt(2))  # n - 1
    assert (grpo["runs"], grpo["ok"], grpo["failed"], grpo["seeds"]) == ("2", "2", "0", "0 1")
    assert float(grpo["tokens_per_s_mean"]) == pytest.approx(128.0)
    assert float(grpo["eval_reward_mean"]) == pytest.approx((reward("grpo", 0, 20) + reward("grpo", 1, 20)) / 4)
    assert float(grpo["tokens_per_s_std"]) == pytest.approx(0.0)
    cispo = rows["+loss=cispo"]  # one completed seed: a mean, no std; the failed run counts in no number
    assert (cispo["runs"], cispo["ok"], cispo["failed"]) == ("2", "1", "1")
    assert float(cispo["final_reward_mean"]) == pytest.approx((reward("cispo", 0, 19) + reward("cispo", 0, 20)) / 2)
    assert cispo["final_reward_std"] == ""


def test_report_md_and_figures(sweep):
    written = write_report(sweep)
    names = [path.name for path in written]
    assert names[:3] == ["report.md", "runs.csv", "variants.csv"]
    figures = {
        "final_reward.png",
        "reward.png",
        "eval_reward.png",
        "completion_length.png",
        "kl.png",
        "entropy.png",
        "clip_ratio.png",
    }
    assert set(names[3:]) == figures
    for name in figures:
        data = (sweep / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # the IHDR chunk
        assert width > 400 and height > 200, name
    report = (sweep / "report.md").read_text()
    assert "6 runs in 3 variants (5 ok, 1 failed)" in report
    assert "Every run had: `+reward=accuracy`" in report
    assert "| `+loss=dapo` | 0.645 ± 0.071 |" in report
    assert "![Reward](reward.png)" in report
    assert "Not drawn, zero at every logged step of every run: `cispo_clip_ratio`." in report
    assert "RuntimeError: reward server went away (the traceback is in `5/error.txt`)" in report


def test_clip_figure_takes_each_losss_own_clip_ratio(sweep):
    variants, _ = group_variants(find_runs(sweep))
    clip = next(figure for figure in FIGURES if figure.filename == "clip_ratio.png")
    metrics = {variant.label: _curve(variant, clip.metrics).metric for variant in variants}
    assert metrics == {
        "+loss=grpo": "clip_ratio/region_mean",
        "+loss=dapo": "clip_ratio/region_mean",
        "+loss=cispo": "cispo_clip_ratio",
    }


def step_figures(figures):
    """The axes of each figure drawn over the optimizer steps: every one but the final reward's."""
    return {name: fig.axes[0] for name, fig in figures.drawn.items() if name != "final_reward.png"}


def test_step_axes_tick_whole_steps(tmp_path):
    write_run(tmp_path / "0", "dapo", 0, steps=3, max_steps=3)  # so short that matplotlib would tick 0.5, 1.0, ...
    axes = step_figures(draw_figures(group_variants(find_runs(tmp_path))[0]))
    assert {"reward.png", "kl.png"} <= set(axes)
    for name, ax in axes.items():
        ticks = ax.get_xticks()
        assert len(ticks) > 1 and all(float(tick).is_integer() for tick in ticks), (name, ticks)


def test_sparse_curves_have_markers_and_every_figure_says_how_many_seeds(sweep):
    figures = draw_figures(group_variants(find_runs(sweep))[0])
    axes = step_figures(figures)
    assert {line.get_marker() for line in axes["eval_reward.png"].get_lines()} == {"o"}  # 5 evaluations
    assert {line.get_marker() for line in axes["reward.png"].get_lines()} == {"None"}  # 20 steps
    for name, ax in axes.items():
        assert "2 seeds each" in ax.get_title(loc="left"), name  # cispo's failed run drew its 3 steps
        assert all("(n=2)" in text.get_text() for text in ax.get_legend().get_texts()), name
    final = figures.drawn["final_reward.png"].axes[0]
    assert "1-2 seeds per variant" in final.get_title(loc="left")  # only completed runs have a final reward
    assert [label.get_text() for label in final.get_yticklabels()] == [
        "+loss=cispo  (n=1)",
        "+loss=grpo  (n=2)",
        "+loss=dapo  (n=2)",
    ]


def test_final_reward_axis_spans_the_whole_reward_range(sweep):
    final = draw_figures(group_variants(find_runs(sweep))[0]).drawn["final_reward.png"].axes[0]
    low, high = final.get_xlim()
    assert low <= 0.0 and high >= 1.0  # the finals lie in 0.29-0.70: zoomed to them, seed noise would look a gap


def test_a_metric_zero_at_every_step_is_not_drawn(sweep):
    figures = draw_figures(group_variants(find_runs(sweep))[0])
    assert figures.all_zero == ["cispo_clip_ratio"]  # the other clip ratio is 0.01: its figure stays
    legend = [text.get_text() for text in figures.drawn["clip_ratio.png"].axes[0].get_legend().get_texts()]
    assert not any("cispo" in text for text in legend)  # report.md names it: test_report_md_and_figures

    metrics = '{"step": 1, "reward": 0.0, "kl": 0.0, "entropy": 0.5}\n{"step": 2, "reward": 0.0, "kl": null}\n'
    (sweep / "2" / "metrics.jsonl").write_text(metrics)
    figures = draw_figures(group_variants(find_runs(sweep / "2"))[0])
    assert figures.all_zero == ["reward", "kl"]  # a null is no value, not a non-zero one
    assert list(figures.drawn) == ["entropy.png"]  # no final reward figure either: it would be a dot at zero


def test_wall_time_is_said_to_depend_on_machine_load_and_runs_link_their_samples(sweep):
    (sweep / "0" / "samples.html").write_text("<html></html>")
    write_report(sweep, plots=False)
    report = (sweep / "report.md").read_text()
    assert report.count("Wall time and tokens/s depend on the machine and its load") == 2  # variants and runs
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    assert rows["| 0"].endswith("| [samples](0/samples.html) |")
    assert rows["| 1"].endswith("| 128 |  |")


def test_a_sparse_metric_is_a_curve_through_the_steps_that_logged_it(sweep):
    variants, _ = group_variants(find_runs(sweep))
    curve = _curve(variants[0], ("eval/reward",))
    assert list(curve.steps) == [0, 5, 10, 15, 20]
    assert not any(math.isnan(value) for value in curve.mean)


def test_figures_only_for_metrics_some_run_logged(tmp_path):
    write_run(tmp_path / "0", "grpo", 0)
    written = {path.name for path in write_report(tmp_path)}
    assert "kl.png" not in written and "reward.png" in written  # kl is logged only with algorithm.beta > 0


def test_incomplete_run_and_logging_steps(tmp_path):
    write_run(tmp_path / "0", "grpo", 0, steps=10, max_steps=20)  # killed halfway: no error.txt
    write_run(tmp_path / "1", "grpo", 1, steps=20, logging_steps=4)  # a line per 4 steps, their means
    runs = {run.name: run for run in find_runs(tmp_path)}
    assert runs["0"].status == "incomplete" and runs["1"].status == "ok"
    assert runs["1"].wall_time == pytest.approx(STEPS * SECONDS_PER_STEP)  # every step counts, not every line
    assert runs["1"].tokens_per_second == pytest.approx(128.0)


def test_final_reward_for_the_sweeper(tmp_path):
    write_run(tmp_path / "0", "grpo", 0)
    assert final_reward(tmp_path / "0") == pytest.approx((reward("grpo", 0, 19) + reward("grpo", 0, 20)) / 2)
    # Every reward of the last tenth is null (all its rewards timed out): None, which Optuna takes as a failed
    # trial; a NaN would stop its study.
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": null}\n')
    assert final_reward(tmp_path / "1") is None
    assert final_reward(tmp_path / "nothing") is None  # no metrics.jsonl at all


def test_a_run_without_metrics_is_failed(tmp_path):
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / ".hydra" / "overrides.yaml").write_text("- +loss=grpo\n")
    (run,) = find_runs(tmp_path)
    assert run.status == "failed" and "no logged step" in run.error_message


def test_a_half_written_last_line_is_skipped(tmp_path):
    write_run(tmp_path, "grpo", 0)
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 21, "rew')
    (run,) = find_runs(tmp_path)  # a single run's directory is a sweep of one
    assert run.name == "." and run.steps[-1] == STEPS


def test_runs_in_job_order(tmp_path):
    for number in (0, 2, 10, 1):
        write_run(tmp_path / str(number), "grpo", number % 2)
    assert [run.name for run in find_runs(tmp_path)] == ["0", "1", "2", "10"]


def test_moving_average_keeps_length_and_skips_nan():
    values = moving_average(__import__("numpy").array([1.0, float("nan"), 3.0, 5.0]), 3)
    assert list(values) == pytest.approx([1.0, 2.0, 4.0, 4.0])


def test_without_matplotlib_the_tables_are_written(sweep, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    written = [path.name for path in write_report(sweep)]
    assert written == ["report.md", "runs.csv", "variants.csv"]
    assert "pip install 'grpo-kit[sweeps]'" in (sweep / "report.md").read_text()


def test_errors_say_what_to_give(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory: give the sweep's directory"):
        write_report(tmp_path / "nowhere")
    with pytest.raises(ReportError, match="No runs in"):
        write_report(tmp_path)


def test_command(sweep, tmp_path, capsys):
    assert main([str(sweep), "--no-plots"]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main([str(tmp_path / "empty")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_callback_writes_the_report_into_the_sweep_dir(sweep):
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    ReportCallback(plots=False).on_multirun_end(config=config)
    assert (sweep / "report.md").is_file()


def test_callback_failure_does_not_fail_the_sweep(tmp_path, caplog):
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "nowhere")}}})
    ReportCallback().on_multirun_end(config=config)
    assert "grpo-kit report" in caplog.text

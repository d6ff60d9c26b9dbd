"""report.md: what a person reads first after a sweep, with the figures inline and the failures spelled out."""

import math
from pathlib import Path
from urllib.parse import quote

import yaml

from grpo_kit.report.paired import PairedComparison, figure_name
from grpo_kit.report.staleness import staleness_section
from grpo_kit.report.tables import Variant

MACHINE_LOAD = (
    "Wall time and tokens/s depend on the machine and its load at the time: compare them only between runs that "
    "ran on the same machine under the same load."
)
FIGURE_TITLES = {
    "final_reward.png": "Final reward per variant",
    "reward.png": "Reward",
    "eval_reward.png": "Reward on the eval set",
    "completion_length.png": "Completion length",
    "flat_groups.png": "Groups whose rewards are all equal",
    "kl.png": "KL divergence",
    "entropy.png": "Entropy",
    "clip_ratio.png": "Clipped tokens",
    "shadow_loss.png": "Trained and shadow losses",
    "shadow_grad_cosine.png": "Shadow gradients against the trained gradient",
    "gradient_noise_scale.png": "Gradient noise scale",
    "gradient_groups.png": "The gradient each group of completions contributes",
    "staleness.png": "Final reward and KL to the behaviour policy against forced staleness",
}


def render(
    sweep_dir: Path,
    name: str,
    variants: list[Variant],
    shared: list[str],
    run_rows: list[dict],
    variant_rows: list[dict],
    figures: list[Path],
    all_zero: list[str],
    notes: list[str],
    paired: PairedComparison | None,
    paired_figures: list[Path],
) -> str:
    statuses = [row["status"] for row in run_rows]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("ok", "failed", "incomplete") if statuses.count(s))
    reward_failures = sum(1 for row in run_rows if row["reward_failed_steps"])
    if reward_failures:
        counts += f"; {reward_failures} whose rewards failed on some steps"
    lines = [
        f"# Sweep report: {name}",
        "",
        f"`{sweep_dir}`: {len(run_rows)} runs in {len(variants)} variants ({counts}).",
    ]
    if shared:
        lines += ["", "Every run had: `" + " ".join(shared) + "`"]
    lines += ["", *[f"> {note}" for note in notes]] if notes else []
    lines += _optuna_result(sweep_dir)

    lines += [
        "",
        "## Variants, best final reward first",
        "",
        (
            "Final reward: the mean reward of the last tenth of a run's logged steps. Best: the highest reward of "
            "one step. Mean ± std over the variant's completed runs (its seeds). Wall time: the training steps "
            "only. Tokens/s: generated completion tokens per second of training, on one process. "
            f"{MACHINE_LOAD} Eval reward: the reward on the eval set at the last evaluation, when the runs had one."
        ),
        "",
        "| variant | final reward | best reward | eval reward | runs (ok / failed / incomplete) | wall time "
        "| tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in variant_rows:
        lines.append(
            f"| {_cell(row['variant'])} | {_pm(row['final_reward_mean'], row['final_reward_std'], '.3f')} "
            f"| {_pm(row['best_reward_mean'], row['best_reward_std'], '.3f')} "
            f"| {_pm(row['eval_reward_mean'], row['eval_reward_std'], '.3f')} "
            f"| {row['runs']} ({row['ok']} / {row['failed']} / {row['incomplete']}) "
            f"| {_duration(row['wall_time_s_mean'])} "
            f"| {_pm(row['tokens_per_s_mean'], row['tokens_per_s_std'], '.0f')} |"
        )

    if figures or all_zero:
        lines += ["", "## Figures"]
        if all_zero:
            left_out = ", ".join(f"`{metric}`" for metric in all_zero)
            lines += ["", f"Not drawn, zero at every logged step of every run: {left_out}."]
        for path in figures:
            lines += ["", f"![{FIGURE_TITLES.get(path.name, path.stem)}]({path.name})"]

    lines += staleness_section(variants)  # a sweep over algorithm.forced_staleness
    if paired is not None:
        lines += _paired_section(paired, paired_figures)

    run_of = {run.name: run for variant in variants for run in variant.runs}
    lines += [
        "",
        "## Runs",
        "",
        f"{MACHINE_LOAD} Samples: the completions the run wrote, every `trainer.sample_every` steps.",
        "",
        "| run | variant | seed | status | final reward | best reward | eval reward | steps | wall time | tokens/s "
        "| samples |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in run_rows:
        lines.append(
            f"| {row['run']} | {_cell(row['variant'])} | {row['seed'] if row['seed'] is not None else ''} "
            f"| {_status(row)} | {_number(row['final_reward'], '.3f')} | {_number(row['best_reward'], '.3f')} "
            f"| {_number(row['eval_reward'], '.3f')} "
            f"| {row['steps']} | {_duration(row['wall_time_s'])} | {_number(row['tokens_per_s'], '.0f')} "
            f"| {_samples_link(run_of[row['run']])} |"
        )

    lines += _evaluations([run for variant in variants for run in variant.runs], [row["run"] for row in run_rows])

    unfinished = [run for variant in variants for run in variant.runs if run.status != "ok"]
    if unfinished:
        lines += ["", "## Runs that did not finish", ""]
        order = {row["run"]: position for position, row in enumerate(run_rows)}
        for run in sorted(unfinished, key=lambda run: order[run.name]):
            if run.error is not None:
                detail = f"{run.error_message} (the traceback is in `{run.name}/error.txt`)"
            elif run.status == "failed":
                detail = run.error_message
            else:
                detail = f"stopped at step {run.steps[-1]}: killed, timed out, or still running"
            lines.append(f"- **{run.name}** ({run.status}) `{' '.join(run.overrides)}`: {detail}")
    return "\n".join(lines) + "\n"


def _paired_section(paired: PairedComparison, figures: list[Path]) -> list[str]:
    replays = ", ".join(f"`{replay}`" for replay in paired.replays)
    lines = [
        "",
        f"## Paired differences vs {_cell(paired.baseline)} (frozen rollouts)",
        "",
        (
            f"These runs trained on the frozen rollouts of {replays} (rollout_files.replay), so at each step a variant "
            "and the baseline with the same seed saw the same prompts, completions and rewards: the difference of "
            "their metrics is the objective's alone. A cell: the per-step difference variant − baseline averaged over "
            "the steps (or over their last quarter), then mean ± std over the seeds both ran. Per step: paired.csv."
        ),
        "",
    ]
    if paired.reward_mismatches:
        lines += [
            "> **Reward differs under replay**: these pairs did not see the same rollouts, so their differences are "
            "not the objective's alone (another rollout_files.replay directory, other batch settings, a hook that "
            "resamples groups?)",
            *[f"> - {mismatch}" for mismatch in paired.reward_mismatches],
        ]
    elif paired.differences:
        lines.append("Reward is the same as the baseline's at every paired step, as frozen rollouts make it.")
    if paired.unchanged:
        unchanged = ", ".join(f"`{metric}`" for metric in paired.unchanged)
        lines += ["", f"The same as the baseline's at every paired step, for every variant (no figure): {unchanged}."]
    if paired.unpaired:
        unpaired = ", ".join(_cell(label) for label in paired.unpaired)
        lines += ["", f"Not compared, no seed on the baseline's rollouts: {unpaired}."]
    if paired.differences:
        lines += ["", "| variant | metric | all steps | last quarter | seeds |", "|---|---|---|---|---|"]
        for difference in paired.differences:
            lines.append(
                f"| {_cell(difference.variant)} | {difference.metric} | {_signed(*difference.averaged())} "
                f"| {_signed(*difference.averaged(last_quarter=True))} | {len(difference.by_pair)} |"
            )
    metric_of = {figure_name(metric): metric for metric in paired.metrics}
    for path in figures:
        lines += ["", f"![{metric_of[path.name]}: difference vs the baseline]({path.name})"]
    return lines


def _evaluations(runs: list, order: list[str]) -> list[str]:
    """The runs that `grpo-kit eval` evaluated (eval.json): one row each, one column per summary metric of each
    eval set (eval/NAME/... for a named one); the per-reward metrics stay in eval.json."""
    position = {name: index for index, name in enumerate(order)}
    evaluated = sorted((run for run in runs if run.evaluation), key=lambda run: position[run.name])
    if not evaluated:
        return []
    names = (name for run in evaluated for name in run.evaluation.get("metrics", {}))
    columns = list(dict.fromkeys(name for name in names if _is_summary(name)))
    lines = [
        "",
        "## Evaluations (grpo-kit eval)",
        "",
        "The final model of each run evaluated by `grpo-kit eval` (its eval.json, which holds every metric).",
        "",
        "| run | step | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for run in evaluated:
        metrics = run.evaluation.get("metrics", {})
        cells = " | ".join(_number(metrics.get(name), ".3f") for name in columns)
        lines.append(f"| {run.name} | {run.evaluation.get('step', '')} | {cells} |")
    return lines


def _is_summary(metric: str) -> bool:
    """eval/reward, eval/pass@k, eval/maj@k, and the same of a named set (eval/NAME/...), not of one reward."""
    last = metric.rpartition("/")[2]
    return "/rewards/" not in metric and (last == "reward" or last.startswith(("pass@", "maj@")))


def _optuna_result(sweep_dir: Path) -> list[str]:
    """The Optuna sweeper's verdict, when this sweep was a search (it writes optimization_results.yaml)."""
    path = sweep_dir / "optimization_results.yaml"
    if not path.is_file():
        return []
    result = yaml.safe_load(path.read_text()) or {}
    if "best_params" not in result:
        return []
    params = " ".join(f"{name}={value}" for name, value in result["best_params"].items())
    return ["", f"Optuna's best trial: `{params}`, final reward {_number(result.get('best_value'), '.3f')}."]


def _samples_link(run) -> str:
    """A link to the run's samples.html, relative to report.md (beside the run folders), when the run wrote one."""
    if not (run.directory / "samples.html").is_file():
        return ""
    target = "samples.html" if run.name == "." else f"{run.name}/samples.html"
    return f"[samples]({quote(target)})"


def _pm(mean: float, std: float, spec: str) -> str:
    if mean is None or math.isnan(mean):
        return "–"
    return f"{mean:{spec}}" if std is None or math.isnan(std) else f"{mean:{spec}} ± {std:{spec}}"


def _signed(mean: float, std: float) -> str:
    """A difference with its sign; `.3g` because differences under replay can be a few thousandths or less."""
    return f"{mean:+.3g}" if math.isnan(std) else f"{mean:+.3g} ± {std:.2g}"


def _status(row: dict) -> str:
    """ok, failed or incomplete, and the steps at which a reward failed: a run that trained on fewer rewards than
    it was meant to is not simply ok."""
    failed = row["reward_failed_steps"]
    return f"{row['status']}, rewards failed on {failed} logged steps" if failed else row["status"]


def _number(value, spec: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:{spec}}"


def _duration(seconds: float) -> str:
    if seconds is None or math.isnan(seconds):
        return "–"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _cell(text: str) -> str:
    """A table cell: a `|` would end it, so it is escaped."""
    return f"`{text}`".replace("|", "\\|")

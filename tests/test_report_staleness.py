"""The report of a forced-staleness sweep (grpo_kit/report/staleness.py): each correction's held-out reward, final
reward and KL to the behaviour policy at each k, from a synthetic sweep whose every number is known."""

import json

import yaml

from grpo_kit.report import write_report

STEPS = 10  # the final reward is the last step's (10 // 10 = 1)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def final(correction: str, lag: int, seed: int) -> float:
    """Staleness costs 0.05 a step uncorrected, 0.01 corrected; seed 2 is 0.1 luckier."""
    return 0.8 - (0.05 if correction == "none" else 0.01) * lag + 0.1 * (seed - 1)


def write_run(directory, correction: str, lag: int | None, seed: int) -> None:
    (directory / ".hydra").mkdir(parents=True)
    overrides = [f"rollout_correction={correction}", f"seed={seed}"]
    overrides += [] if lag is None else [f"algorithm.forced_staleness={lag}"]
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {
        "seed": seed,
        "algorithm": {"forced_staleness": lag},
        "rollout_correction": {"name": correction},
        "trainer": {"max_steps": STEPS},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for step in range(1, STEPS + 1):
        line = {"step": step, "reward": final(correction, lag or 0, seed) if step == STEPS else 0.0}
        line["async/kl_to_behaviour"] = 0.001 * (lag or 0) * step / 5.5  # its mean over the steps: 0.001 k
        if step == STEPS:
            line["eval/reward"] = final(correction, lag or 0, seed) / 2
        lines.append(json.dumps(line))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_forced_staleness_sweep_reports_each_correction_against_k(tmp_path):
    index = 0
    for correction in ("none", "token_truncate"):
        for lag in (0, 4):
            for seed in (1, 2):
                write_run(tmp_path / str(index), correction, lag, seed)
                index += 1
    written = write_report(tmp_path)
    assert (tmp_path / "staleness.png") in written
    assert (tmp_path / "staleness.png").read_bytes().startswith(PNG_SIGNATURE)
    report = (tmp_path / "report.md").read_text()
    section = report[report.index("## Forced staleness") :]
    rows = [line for line in section.splitlines() if line.startswith("| none") or line.startswith("| token")]
    # correction | k | held-out | final | change from k=0 (paired by seed) | KL | seeds
    assert rows == [
        "| none | 0 | 0.425 ± 0.035 | 0.850 ± 0.071 | +0.000 ± 0.000 | 0.0000 ± 0.0000 | 2 |",
        "| none | 4 | 0.325 ± 0.035 | 0.650 ± 0.071 | -0.200 ± 0.000 | 0.0040 ± 0.0000 | 2 |",
        "| token_truncate | 0 | 0.425 ± 0.035 | 0.850 ± 0.071 | +0.000 ± 0.000 | 0.0000 ± 0.0000 | 2 |",
        "| token_truncate | 4 | 0.405 ± 0.035 | 0.810 ± 0.071 | -0.040 ± 0.000 | 0.0040 ± 0.0000 | 2 |",
    ]
    assert "![Final reward and KL to the behaviour policy against forced staleness](staleness.png)" in report


def test_a_sweep_that_does_not_vary_forced_staleness_has_no_such_section(tmp_path):
    for index, correction in enumerate(("none", "token_truncate")):
        write_run(tmp_path / str(index), correction, None, seed=1)
    written = write_report(tmp_path)
    assert (tmp_path / "staleness.png") not in written
    assert "## Forced staleness" not in (tmp_path / "report.md").read_text()

"""speed.sh's one table, in Markdown for benchmarks/README.md, from the files it left in RESULTS: decode.json
(decode_bench.py) and race.json (race.py --profile --sides grpo_kit,TRL), and versions.txt where the install wrote it.

    python benchmarks/gpu/speed_summary.py RESULTS
"""

import json
import sys
from pathlib import Path

DECODE_LABELS = {
    "generate": "`generate` (TRL's call)",
    "generate_no_cudnn": "`generate`, cuDNN attention off",
    "lean": "lean loop",
    "static": "static loop",
}


def mib(value) -> str:
    return "-" if value is None else f"{value:,.0f} MiB"


def decode_rows(figures: dict) -> list[tuple[str, str]]:
    settings = figures["settings"]
    where = (
        f"{settings['shape']}, {settings['batch']} rows, {settings['new_tokens']} new tokens, {settings['precision']}"
    )
    rows = []
    for loop, result in figures["loops"].items():
        label = f"decode {DECODE_LABELS.get(loop, loop)} ({where})"
        if "error" in result:
            rows.append((label, f"failed: {result['error']}"))
            continue
        rows.append(
            (
                label,
                f"prefill {result['prefill_ms']:.1f} ms; {result['cold_ms_per_step']:.2f} ms per step cold, "
                f"{result['warm_ms_per_step']:.2f} warm; peak {mib(result['peak_mib'])} above the model, "
                f"{mib(result['total_peak_mib'])} in all",
            )
        )
    return rows


def race_rows(figures: dict) -> list[tuple[str, str]]:
    rows = []
    for name, sides in figures.get("rows", {}).items():
        ours, theirs = sides["grpo_kit"], sides["TRL"]
        mine, trl = 1000 * ours["seconds_per_token"], 1000 * theirs["seconds_per_token"]
        per_token = f"{mine:.3f} / {trl:.3f}: {mine / trl:.2f}x"
        rows.append((f"race {name}: ms per generated token (grpo_kit / TRL)", per_token))
        rows.append(
            (
                f"race {name}: peak (grpo_kit / TRL)",
                f"{mib(ours['peak_mib'])} / {mib(theirs['peak_mib'])}: {ours['peak_mib'] / theirs['peak_mib']:.2f}x",
            )
        )
        rows.append((f"race {name}: tokens generated (grpo_kit / TRL)", f"{ours['tokens']} / {theirs['tokens']}"))
        rows.append(
            (
                f"race {name}: s to the first step's end / after the last step (grpo_kit; TRL)",
                f"{ours['to_first_step']:.1f} / {ours['after_last_step']:.1f}; "
                f"{theirs['to_first_step']:.1f} / {theirs['after_last_step']:.1f}",
            )
        )
    for name, sides in figures.get("profiles", {}).items():
        phases = next(iter(sides.values()))["seconds"]
        for phase in phases:
            cells = []
            for side, profile in sides.items():
                seconds, peak = profile["seconds"][phase], profile["peak_mib"][phase]
                share = seconds / profile["seconds"]["step"]
                cells.append(f"{side} {seconds:.3f} s ({share:.0%})" + (f", {mib(peak)}" if peak is not None else ""))
            rows.append((f"race {name} phase: {phase} (s per step, peak)", "; ".join(cells)))
    rows.append(("race checks", "all passed" if not figures["failures"] else "; ".join(figures["failures"])))
    return rows


def main() -> None:
    results = Path(sys.argv[1])
    rows = []
    versions = results / "versions.txt"
    if versions.exists():
        lines = versions.read_text().splitlines()
        rows += [("versions", lines[0]), ("device", " ".join(lines[1:]))]
    for name, read in (("decode.json", decode_rows), ("race.json", race_rows)):
        path = results / name
        rows += read(json.loads(path.read_text())) if path.exists() else [(name, "not written (see the log above)")]
    print("| check | result |\n|---|---|")
    for check, result in rows:
        print(f"| {check} | {result} |")


if __name__ == "__main__":
    main()

"""The GPU check's one table (benchmarks/gpu/run.sh), in Markdown for benchmarks/README.md, from the files run.sh
left in RESULTS: versions.txt, gpu-tests.xml (pytest's junit report), liger-memory.json, race.json.

    python benchmarks/gpu/summary.py RESULTS
"""

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def test_counts(report: Path) -> str:
    if not report.exists():
        return "not run"
    suite = ElementTree.parse(report).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    total, failed, errors, skipped = (int(suite.get(name, 0)) for name in ("tests", "failures", "errors", "skipped"))
    counts = f"{total - failed - errors - skipped} passed, {skipped} skipped, {failed} failed, {errors} errors"
    names = [case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None]
    return counts + (f" ({', '.join(names)})" if names else "")


def main() -> None:
    results = Path(sys.argv[1])
    rows = []
    versions = (results / "versions.txt").read_text().splitlines() if (results / "versions.txt").exists() else []
    rows += [("versions", versions[0] if versions else "not recorded"), ("device", " ".join(versions[1:]) or "?")]
    rows.append(("`pytest -m gpu`", test_counts(results / "gpu-tests.xml")))

    liger = results / "liger-memory.json"
    if liger.exists():
        figures = json.loads(liger.read_text())["results"]
        full = figures.get("full")
        for setting, result in figures.items():
            ratio = f", {result['peak_mib'] / full['peak_mib']:.3f}x full's" if full else ""
            rows.append(
                (
                    f"log-probs `{setting}` (B 4, T 1,024, V 151,936)",
                    f"{result['peak_mib']:,.0f} MiB peak{ratio}, {1000 * result['seconds']:.1f} ms per micro-batch "
                    f"(path taken: {result['path']})",
                )
            )
    else:
        rows.append(("log-probs full / chunked / liger", "not run"))

    race = results / "race.json"
    if race.exists():
        figures = json.loads(race.read_text())
        for name, row in figures["rows"].items():
            ours, theirs, bare = row["grpo_kit"], row["TRL"], row["bare"]
            mine, trl, floor = (1000 * row[side]["seconds_per_token"] for side in ("grpo_kit", "TRL", "bare"))
            rows.append(
                (
                    f"race {name}: ms per generated token (grpo_kit / TRL / bare)",
                    f"{mine:.3f} / {trl:.3f} / {floor:.3f}: {mine / trl:.2f}x TRL's, {mine / floor:.2f}x bare's",
                )
            )
            rows.append(
                (
                    f"race {name}: peak allocated CUDA MiB (grpo_kit / TRL / bare)",
                    f"{ours['peak_mib']:,.0f} / {theirs['peak_mib']:,.0f} / {bare['peak_mib']:,.0f}: "
                    f"{ours['peak_mib'] / theirs['peak_mib']:.2f}x TRL's",
                )
            )
            tokens = " / ".join(str(row[side]["tokens"]) for side in ("grpo_kit", "TRL", "bare"))
            rows.append((f"race {name}: tokens generated (grpo_kit / TRL / bare)", tokens))
        rows.append(("race checks", "all passed" if not figures["failures"] else "; ".join(figures["failures"])))
    else:
        rows.append(("race with TRL", "not run"))

    print("| check | result |\n|---|---|")
    for check, result in rows:
        print(f"| {check} | {result} |")


if __name__ == "__main__":
    main()

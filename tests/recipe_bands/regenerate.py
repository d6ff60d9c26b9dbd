"""Regenerate the recipes' reference bands: each recipe of conf/experiment/ run for a few seeds on the embedded sums
task, its reward, mean completion length and entropy recorded at fixed steps into tests/recipe_bands/NAME.json.

    python tests/recipe_bands/regenerate.py              # every recipe: about 13 minutes on two CPU cores
    python tests/recipe_bands/regenerate.py dapo gspo    # some of them
    python tests/recipe_bands/regenerate.py --restate    # K and STD_FLOOR below applied to the recorded runs

Each file says which seeds, steps and git commit made it (`recorded_with`), and also holds the run of the slow
test's own seed (`test_seed_values`), which is not part of the band: tests/test_recipe_bands.py runs that seed and
asserts it stays inside. Runs are one after another, in this process; commit the files it writes.
"""

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import grpo_kit
from grpo_kit.report.bands import band_record, window_means

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RECIPES = ["dapo", "dr_grpo", "gspo", "cispo", "sapo", "vespo", "luspo"]
BAND_SEEDS = [1, 2, 3, 4, 5]
TEST_SEED = 0  # held out of the band, so the slow test checks a draw the band was not made from
MAX_STEPS = 100
STEPS, WINDOW = [25, 50, 75, 100], 25  # each value is the mean of the 25 logged steps up to its step
# With five seeds the sample std is itself uncertain: a sixth seed lands within mean ± 6 std with about 99.5%
# probability per value (Student's t with 4 degrees of freedom, times sqrt(1 + 1/5)). k = 4 put seed 0 of dapo
# outside at step 100 (4.5 std above), a false alarm this k avoids; a change of what a recipe learns moves it more.
K = 6.0
# A metric whose few seeds happened to agree would give a band no wider than rounding; 0.01 is below the spread
# any recipe showed at any step, so the floor only ever widens such a degenerate band.
STD_FLOOR = {"reward": 0.01, "completions/mean_length": 0.01, "entropy": 0.01}


def command(recipe: str) -> list[str]:
    return [f"+experiment={recipe}", "+reward=accuracy", f"trainer.max_steps={MAX_STEPS}", "trainer.progress_bar=false"]


def run_values(overrides: list[str], seed: int) -> dict[str, list[float]]:
    """One run of `overrides` at `seed` in a scratch directory: its window means at STEPS."""
    with tempfile.TemporaryDirectory(prefix="recipe-band-") as scratch:
        run_dir = Path(scratch) / "run"
        grpo_kit.train(grpo_kit.compose([*overrides, f"seed={seed}"]), run_dir)
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return window_means(metrics, STEPS, WINDOW)


def provenance() -> dict:
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "grpo_kit", "plugins", "conf"], capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return {
        "commit": commit,
        "uncommitted_changes": bool(dirty),  # to grpo_kit/, plugins/ or conf/: the commit alone is not the code run
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
    }


def regenerate(recipe: str) -> Path:
    started = time.monotonic()
    overrides = command(recipe)
    per_seed = {seed: run_values(overrides, seed) for seed in BAND_SEEDS}
    record = band_record(recipe, overrides, STEPS, WINDOW, K, BAND_SEEDS, TEST_SEED, per_seed, STD_FLOOR,
                         provenance())  # fmt: skip
    record["test_seed_values"] = run_values(overrides, TEST_SEED)
    record["recorded_with"]["seconds"] = round(time.monotonic() - started)
    path = HERE / f"{recipe}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def restate(recipe: str) -> Path:
    """The band of the runs a file already records (its per_seed), with this script's K and STD_FLOOR: no run."""
    path = HERE / f"{recipe}.json"
    old = json.loads(path.read_text())
    per_seed = {int(seed): values for seed, values in old["per_seed"].items()}
    record = band_record(recipe, old["command"], old["steps"], old["window"], K, old["seeds"], old["test_seed"],
                         per_seed, STD_FLOOR, old["recorded_with"])  # fmt: skip
    record["test_seed_values"] = old["test_seed_values"]
    record["recorded_with"]["restated"] = f"k {old['k']:g} -> {K:g}, std_floor {STD_FLOOR}, {time.strftime('%Y-%m-%d')}"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def main(arguments: list[str]) -> None:
    recipes = [name for name in arguments if name != "--restate"]
    unknown = sorted(set(recipes) - set(RECIPES))
    if unknown:
        sys.exit(f"unknown recipes {unknown}: choose among {RECIPES}")
    for recipe in recipes or RECIPES:
        path = restate(recipe) if "--restate" in arguments else regenerate(recipe)
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Each paper recipe (conf/experiment/) stays inside its reference band (tests/recipe_bands/NAME.json).

One run per recipe at the band file's test seed, which the band was not made from; every value at the band's steps
must lie within mean ± k std of the band's seeds. A change to a default, a preset or a mask that alters what a
recipe does to learning moves it out. Regenerate the bands, on purpose, with tests/recipe_bands/regenerate.py.
About 25 s per recipe on two CPU cores.

GRPO_KIT_RECIPE_OVERRIDES (space-separated, appended to each run) shows a band failing with a recipe's key option
changed, e.g. GRPO_KIT_RECIPE_OVERRIDES=loss.epsilon_high=0.2.
"""

import json
import os
from pathlib import Path

import pytest

import grpo_kit
from grpo_kit.report.bands import Band, window_means

BANDS = sorted((Path(__file__).parent / "recipe_bands").glob("*.json"))


def run_recipe(overrides: list[str], run_dir: Path) -> list[dict]:
    overrides = [*overrides, *os.environ.get("GRPO_KIT_RECIPE_OVERRIDES", "").split()]
    grpo_kit.train(grpo_kit.compose(overrides), run_dir)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("path", BANDS, ids=lambda path: path.stem)
def test_the_recipe_stays_inside_its_band(path, tmp_path):
    band = Band.read(path)
    metrics = run_recipe([*band.command, f"seed={band.test_seed}"], tmp_path / "run")
    outside = band.outside(window_means(metrics, band.steps, band.window))
    assert not outside, f"{band.recipe} left its band ({path}):\n" + "\n".join(outside)

"""The embedded vision demonstration (`data=embedded_vision`): its task's rows, its held-out images, its build, its
presets, and (slow) that the command learns."""

import json
import random
import subprocess
import sys
import time

import numpy
import pytest
import torch
from PIL import Image
from transformers import Qwen2VLForConditionalGeneration

from grpo_kit.config.compose import with_presets
from grpo_kit.embedded import sums as embedded
from grpo_kit.embedded import vision


@pytest.fixture(scope="module")
def training_rows() -> list[dict]:
    return vision.build_task(300)


def squares_seen(image: Image.Image) -> int:
    """The squares in `image`, counted from its pixels alone: each quarter that is not all background must hold
    exactly one filled square of one colour."""
    pixels = torch.from_numpy(numpy.asarray(image).copy())  # (H, W, 3)
    squares = 0
    for top in (0, vision.CELL):
        for left in (0, vision.CELL):
            quarter = pixels[top : top + vision.CELL, left : left + vision.CELL]
            drawn = (quarter != torch.tensor(vision.BACKGROUND)).any(-1)  # (CELL, CELL)
            if not drawn.any():
                continue
            rows, columns = drawn.any(1).nonzero().squeeze(1), drawn.any(0).nonzero().squeeze(1)
            box = quarter[rows[0] : rows[-1] + 1, columns[0] : columns[-1] + 1].reshape(-1, 3)
            assert len(rows) == len(columns) and len(rows) in vision.SIDES, "a quarter holds no square of a known side"
            assert (box == box[0]).all(), "a quarter holds more than a square, or one of several colours"
            squares += 1
    return squares


def test_every_row_asks_about_its_image_and_its_solution_is_the_count_of_squares_in_it(training_rows):
    for row in training_rows:
        assert row["prompt"] == [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": vision.QUESTION}]}
        ]
        assert row["image"].size == (vision.IMAGE_SIDE, vision.IMAGE_SIDE) and row["image"].mode == "RGB"
        assert row["solution"] == str(squares_seen(row["image"]))
    assert {row["solution"] for row in training_rows} == {str(count) for count in vision.COUNTS}


def test_the_task_is_the_same_for_the_same_seed_and_differs_for_another(training_rows):
    def fingerprint(rows):
        return [(vision.image_key(row["image"]), row["solution"]) for row in rows]

    assert fingerprint(vision.build_task(50)) == fingerprint(training_rows[:50])
    assert fingerprint(vision.build_task(50, seed=vision.TASK_SEED + 1)) != fingerprint(training_rows[:50])
    assert fingerprint(vision.held_out_problems()) == fingerprint(vision.held_out_problems())


def test_held_out_images_are_distinct_and_never_drawn_for_training(training_rows):
    held_out = vision.held_out_problems()
    keys = {vision.image_key(row["image"]) for row in held_out}
    assert len(keys) == len(held_out) == vision.NUM_HELD_OUT
    assert keys.isdisjoint(vision.image_key(row["image"]) for row in training_rows)
    # The held-out images' own generator, drawing training problems, must skip every one of them.
    drawn = vision.drawn_problems(random.Random(vision.EVAL_SEED))
    assert keys.isdisjoint(vision.image_key(next(drawn)[0]) for _ in range(2 * vision.NUM_HELD_OUT))


def test_noisy_answers_are_right_at_their_rate_and_wrong_ones_are_other_numbers():
    rng = random.Random(0)
    answers = [vision.noisy_answer(rng, 3) for _ in range(4000)]
    assert abs(answers.count(3) / len(answers) - vision.RIGHT_ANSWER_RATE) < 0.03
    assert set(answers) == set(vision.WRONG_ANSWERS)


def test_the_embedded_dispatch_serves_the_vision_task_and_its_splits():
    assert [row["solution"] for row in embedded.task("vision", 20)] == [
        row["solution"] for row in vision.build_task(20)
    ]
    assert len(embedded.eval_problems("vision", "test")) == vision.NUM_HELD_OUT
    assert len(embedded.eval_problems("vision", "train")) == vision.NUM_HELD_OUT
    with pytest.raises(ValueError, match="choose sums, tool_use or vision"):
        embedded.task("pictures", 1)


def test_data_embedded_vision_chooses_its_model_unless_one_is_named():
    assert with_presets(["data=embedded_vision"]) == ["data=embedded_vision", "model=embedded_vision"]
    assert with_presets(["data=embedded_vision", "model=embedded"]) == ["data=embedded_vision", "model=embedded"]
    assert "model=embedded_vision" not in with_presets(["data=embedded", "+reward=accuracy"])


def test_the_build_saves_a_qwen2_vl_and_its_processor_that_answer_about_an_image(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_KIT_CACHE", str(tmp_path))
    monkeypatch.setattr(vision, "SEEING_STEPS", 2)  # what pretraining reaches is the slow test's concern
    monkeypatch.setattr(vision, "ANSWERING_STEPS", 2)
    monkeypatch.setattr(vision, "PRETRAIN_BATCH", 4)
    path = embedded.model_path("vision")
    assert path.name.startswith("embedded-vision-model-") and vision.saved_by_this_module(path)
    assert embedded.model_path("vision") == path  # built once
    model = Qwen2VLForConditionalGeneration.from_pretrained(path)
    processor = vision.ImageOnlyQwen2VLProcessor.from_pretrained(path)
    row = vision.held_out_problems()[0]
    prompt = processor.apply_chat_template(row["prompt"], tokenize=False)
    inputs = processor(text=[prompt], images=[row["image"]], return_tensors="pt")
    assert (inputs.input_ids == processor.image_token_id).sum() == 4  # 4 x 4 patches merged 2 x 2
    generated = model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert generated.shape[1] > inputs.input_ids.shape[1]


@pytest.mark.slow
def test_the_vision_command_learns_to_count_on_held_out_images(tmp_path):
    """The issue's acceptance command, as a user types it (plus a run directory): within 5 minutes on two CPU cores,
    the last tenth of logged steps scores at least 0.2 above the first, and the held-out images' score rises. The
    time is printed, not asserted (about 45 s here, plus the model's build of about 45 s, once)."""
    run_dir = tmp_path / "run"
    start = time.perf_counter()
    command = ["-m", "grpo_kit", "+loss=dapo", "+reward=accuracy", "data=embedded_vision", f"hydra.run.dir={run_dir}"]
    subprocess.run([sys.executable, *command], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [line["reward"] for line in lines if "reward" in line]
    evals = [line["eval/reward"] for line in lines if "eval/reward" in line]
    tenth = max(1, len(rewards) // 10)
    first, last = sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth
    print(f"{seconds:.0f} s; reward {first:.3f} -> {last:.3f}; eval {evals[0]:.3f} -> {evals[-1]:.3f}")
    assert last >= first + 0.2
    assert evals[-1] > evals[0] + 0.1

"""Images in prompts (docs/vision.md): they reach every pass that computes log-probs, with the values of a direct
call of the model on each row alone, and bad images are refused before training."""

import copy
import dataclasses
import importlib.util
import io
import json
import os

import pytest
import torch
from PIL import Image

import grpo_kit
from grpo_kit.config.compose import options
from grpo_kit.config.schema import DataConfig, LoraConfig, ModelConfig
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.model.fast.chunked_logits import chunked_logps_and_entropies
from grpo_kit.model.loading import load_model, load_processor
from grpo_kit.model.logprobs import OutputHead, last_hidden_states, per_token_logps_and_entropies
from grpo_kit.model.lora import AdapterFreeReference
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.rollout.images import ImagePrompts, check_images
from grpo_kit.rollout.prompts import load_prompts
from grpo_kit.testing.micro_batches import half_a_generation_batch, loss_and_gradients
from grpo_kit.testing.models import build_tiny_vision_model
from grpo_kit.testing.runs import tiny_run
from grpo_kit.training.batches import split
from grpo_kit.training.token_budget import TokenBudget, in_parts
from grpo_kit.training.vision import image_prompts

TOLERANCE = 1e-5
QUESTION = [{"role": "user", "content": "how many squares?"}]


def noise(seed: int, width: int = 56, height: int = 56) -> Image.Image:
    pixels = torch.randint(0, 256, (height, width, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    return build_tiny_vision_model(tmp_path_factory.mktemp("tiny-vision-model"))


@pytest.fixture(scope="module")
def policy(vision_model):
    model, _ = load_model(ModelConfig(name_or_path=str(vision_model)))
    return model.eval()  # no dropout: each path must give the same values


@pytest.fixture(scope="module")
def prompts_of_model(vision_model):
    return ImagePrompts(load_processor(ModelConfig(name_or_path=str(vision_model))), "a tiny Qwen2-VL")


@pytest.fixture(scope="module")
def rows():
    """Rows of 1, 2, 0 and 1 images of different sizes (different patch counts), one text prompt among them."""
    return [
        {"prompt": QUESTION, "image": noise(0)},
        {"prompt": QUESTION, "images": [noise(1, 28, 84), noise(2)]},
        {"prompt": QUESTION},
        {"prompt": "<|vision_start|><|image_pad|><|vision_end|>count: ", "images": [noise(3, 84, 28)]},
    ]


@pytest.fixture(scope="module")
def batch(prompts_of_model, rows):
    """The training batch of these rows as the rollout builds it, with random completions of mixed lengths."""
    prompt_ids, _ = prompts_of_model.encode(rows)
    tokenizer = prompts_of_model.processor.tokenizer
    padded = tokenizer.pad({"input_ids": prompt_ids}, padding_side="left", return_tensors="pt")
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 2, 5, 1])
    vocab = len(tokenizer)
    return MicroBatch(
        prompt_ids=padded["input_ids"],
        prompt_mask=padded["attention_mask"],
        completion_ids=torch.randint(6, vocab, (4, 6), generator=generator),  # no image token among them
        completion_mask=(torch.arange(6) < lengths[:, None]).long(),
        advantages=torch.tensor([1.0, -0.5, 0.25, -1.0]),
        **prompts_of_model.row_tensors(rows),
    )


@pytest.fixture(scope="module")
def direct(policy, prompts_of_model, rows, batch):
    """Each row's completion log-probs from a call of the model on that row alone: its prompt unpadded, its own
    pixels and grids as the processor gives them for it alone."""
    expected = torch.zeros(batch.completion_ids.shape)
    for row, data in enumerate(rows):
        prompt_ids, images = prompts_of_model.encode([data])
        length = int(batch.completion_mask[row].sum())
        input_ids = torch.tensor([prompt_ids[0] + batch.completion_ids[row, :length].tolist()])
        extra = {} if images is None else images.forward_kwargs(policy, input_ids)
        with torch.no_grad():
            logits = policy(input_ids=input_ids, **extra).logits[0, len(prompt_ids[0]) - 1 : -1]
        expected[row, :length] = logits.log_softmax(-1).gather(-1, input_ids[0, -length:, None]).squeeze(-1)
    return expected


def masked(values, completion_mask):
    return values * completion_mask


def assert_matches(actual, direct, completion_mask):
    width = actual.shape[1]
    difference = (masked(actual, completion_mask[:, :width]) - direct[:, :width]).abs()
    assert difference.max().item() <= TOLERANCE, f"differs from the direct call by {difference.max().item():.3g}"


def test_the_images_change_the_log_probs(policy, batch, direct):
    """Without this, every test below could pass with the images dropped."""
    without_images = dataclasses.replace(batch, pixel_values=None, image_grid_thw=None)
    with torch.no_grad():
        blind, _ = per_token_logps_and_entropies(policy, without_images, 1.0)
    assert (masked(blind, batch.completion_mask) - direct).abs().max() > 1e-2


@pytest.mark.parametrize("passes_by_length", [True, False])
def test_full_logits_path(policy, batch, direct, passes_by_length):
    from grpo_kit.model.fast.switches import speed_ups_of, use_speed_ups

    saved = speed_ups_of(policy)
    use_speed_ups(policy, dataclasses.replace(saved, passes_by_length=passes_by_length))
    try:
        with torch.no_grad():
            logps, _ = per_token_logps_and_entropies(policy, batch, 1.0)
    finally:
        use_speed_ups(policy, saved)
    assert_matches(logps, direct, batch.completion_mask)


def test_chunked_logits_path(policy, batch, direct):
    with torch.no_grad():
        logps, _ = per_token_logps_and_entropies(policy, batch, 1.0, chunk_size=3)
    assert_matches(logps, direct, batch.completion_mask)


def test_each_micro_batch_of_a_split_batch(policy, batch, direct):
    """Micro-batches (shuffled rows) and token-budget parts take each row's own images. Each row's advantage is its
    index, which no log-prob reads, so that each micro-batch names its rows."""
    torch.manual_seed(0)
    rows_seen = []
    numbered = dataclasses.replace(batch, advantages=torch.arange(4.0))
    for micro_batch in split(numbered, 2, 1, by_length=False):
        parts = lambda part: per_token_logps_and_entropies(policy, part, 1.0)[0]  # noqa: E731
        with torch.no_grad():
            logps = in_parts(parts, micro_batch, TokenBudget(max_tokens=3, packing=False))
        rows = micro_batch.advantages.long()
        assert_matches(logps, direct[rows], batch.completion_mask[rows])
        rows_seen += rows.tolist()
    assert sorted(rows_seen) == [0, 1, 2, 3]


def test_reference_copy_and_adapter_free_reference(policy, vision_model, batch, direct):
    reference = copy.deepcopy(policy)
    with torch.no_grad():
        assert_matches(per_token_logps_and_entropies(reference, batch, 1.0)[0], direct, batch.completion_mask)
    if importlib.util.find_spec("peft") is None:
        pytest.skip("peft is not installed (the lora extra)")
    config = ModelConfig(name_or_path=str(vision_model), lora=LoraConfig(enabled=True))
    lora_policy, _ = load_model(config)
    with torch.no_grad():
        logps, _ = per_token_logps_and_entropies(AdapterFreeReference(lora_policy.eval()), batch, 1.0)
    assert_matches(logps, direct, batch.completion_mask)


def test_lora_adapts_the_language_model_alone_unless_asked(vision_model):
    if importlib.util.find_spec("peft") is None:
        pytest.skip("peft is not installed (the lora extra)")
    for train_vision_tower, adapted_tower in (("auto", False), (True, True)):
        config = ModelConfig(
            name_or_path=str(vision_model), lora=LoraConfig(enabled=True), train_vision_tower=train_vision_tower
        )
        model, _ = load_model(config)
        trained = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
        assert any("language_model" in name for name in trained)
        assert any(".visual." in name for name in trained) == adapted_tower, trained


def test_full_fine_tuning_trains_the_vision_tower_unless_kept(vision_model):
    for train_vision_tower, trains_tower in (("auto", True), (False, False)):
        model, _ = load_model(ModelConfig(name_or_path=str(vision_model), train_vision_tower=train_vision_tower))
        tower = [parameter.requires_grad for name, parameter in model.named_parameters() if ".visual." in name]
        assert tower and all(flag == trains_tower for flag in tower)


@pytest.fixture
def liger_installed():
    """Skips without liger-kernel, or fails where GRPO_KIT_REQUIRE_LIGER=1 (CI sets it)."""
    if importlib.util.find_spec("liger_kernel") is None:
        reason = "liger-kernel is not installed (the liger extra): pip install -e '.[liger]'"
        if os.environ.get("GRPO_KIT_REQUIRE_LIGER") == "1":
            pytest.fail(f"GRPO_KIT_REQUIRE_LIGER=1, but {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.mark.usefixtures("liger_installed")
def test_liger_path_computes_the_full_paths_loss_and_gradients(registry, policy, batch):
    cfg = grpo_kit.compose(["+loss=dapo"], registry)
    objective = grpo_kit.build_objective(cfg, registry)
    plain = PolicyLoss(objective, 1.0, False)
    liger = PolicyLoss(objective, 1.0, False, logits="liger", chunk_size=3)
    reduction = half_a_generation_batch(batch, objective.max_completion_length)
    (loss, grads, _), (liger_loss, liger_grads, _) = (
        loss_and_gradients(path, policy, batch, reduction) for path in (plain, liger)
    )
    assert liger.last_path == "liger"
    assert abs(loss.item() - liger_loss.item()) <= TOLERANCE
    assert grads.keys() == liger_grads.keys() and any(".visual." in name for name in grads)
    for name, grad in grads.items():
        assert (grad - liger_grads[name]).abs().max().item() <= TOLERANCE, name


def test_last_hidden_states_carry_the_images(policy, batch, direct):
    head = OutputHead(policy)
    with torch.no_grad():
        hidden = last_hidden_states(policy, batch, head)
        logps, _ = chunked_logps_and_entropies(hidden, head, batch.completion_ids, 1.0, chunk_size=2)
    assert_matches(logps, direct, batch.completion_mask)


# --- bad images are refused, naming the row and the column ---


def dataset_of(rows):
    import datasets

    return datasets.Dataset.from_list(rows)


def test_a_missing_image_file_is_refused_with_its_row(tmp_path):
    good = tmp_path / "good.png"
    noise(0).save(good)
    rows = [{"prompt": "x", "image": str(good)}, {"prompt": "y", "image": str(tmp_path / "missing.png")}]
    with pytest.raises(ConfigError, match=r"row 2 \(counting from 1\), column `image`.*missing\.png"):
        check_images(dataset_of(rows), "data.path=rows.jsonl", image_token="x")


def test_unreadable_bytes_are_refused_with_their_row():
    picture = io.BytesIO()
    noise(0).save(picture, format="PNG")
    rows = [
        {"prompt": QUESTION, "images": [picture.getvalue()]},
        {"prompt": QUESTION, "images": [picture.getvalue()[:40]]},  # a truncated file
    ]
    with pytest.raises(ConfigError, match=r"row 2 \(counting from 1\), column `images`"):
        check_images(dataset_of(rows), "The dataset", image_token="<|image_pad|>")


def test_an_image_the_processor_refuses_is_refused_at_the_start_with_its_row(prompts_of_model):
    """A 1 x 400 image opens, but Qwen2-VL's processor refuses it: it used to crash training when a batch drew it,
    and again at every resume."""
    processor = prompts_of_model.processor
    rows = [{"prompt": [{"role": "user", "content": "?"}], "image": noise(0)}]
    rows.append({"prompt": [{"role": "user", "content": "?"}], "image": noise(1, width=400, height=1)})
    check_images(dataset_of(rows[:1]), "The dataset", processor.image_token, processor.image_processor)
    with pytest.raises(ConfigError, match=r"row 2 \(counting from 1\), column `image`, holds an image the model's"):
        check_images(dataset_of(rows), "The dataset", processor.image_token, processor.image_processor)


def test_a_huge_image_a_bomb_and_a_fifo_are_refused_with_their_row(tmp_path):
    huge = tmp_path / "huge.png"
    Image.new("L", (8000, 6000)).save(huge)  # 48 million pixels: compressed to almost nothing
    bomb = tmp_path / "bomb.png"
    Image.new("1", (20000, 10000)).save(bomb)  # 200 million: past PIL's own limit
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    for path, words in [(huge, "8000 x 6000 pixels, more than 40,000,000"), (bomb, "decompression bomb")]:
        with pytest.raises(ConfigError, match=rf"row 1 \(counting from 1\).*{words}"):
            check_images(dataset_of([{"prompt": "x", "image": str(path)}]), "The dataset", image_token="x")
    with pytest.raises(ConfigError, match=r"fifo.png is not a regular file"):
        check_images(dataset_of([{"prompt": "x", "image": str(fifo)}]), "The dataset", image_token="x")


def test_relative_image_paths_are_read_from_the_datasets_folder(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    (folder / "pictures").mkdir(parents=True)
    noise(0).save(folder / "pictures" / "a.png")
    (folder / "rows.jsonl").write_text(json.dumps({"prompt": "x", "image": "pictures/a.png"}) + "\n")
    monkeypatch.chdir(tmp_path)  # elsewhere than the dataset
    dataset = load_prompts(DataConfig(path=str(folder / "rows.jsonl")))
    assert dataset[0]["image"] == str(folder / "pictures" / "a.png")
    check_images(dataset, "The dataset", image_token="x")


def test_a_text_prompt_must_place_each_image(rows):
    with pytest.raises(ConfigError, match=r"row 1 .* 1 image\(s\) in `image`.* 0 time\(s\)"):
        check_images(dataset_of([{"prompt": "count: ", "image": noise(0)}]), "The dataset", "<|image_pad|>")


def test_images_for_a_model_that_reads_none_are_refused():
    with pytest.raises(ConfigError, match="has an `image` column, but the model reads no images"):
        check_images(dataset_of([{"prompt": "x", "image": noise(0)}]), "The dataset", image_token=None)


def test_a_run_with_images_refuses_packing_before_loading_the_model(registry, vision_model, tmp_path):
    noise(0).save(tmp_path / "a.png")
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": QUESTION, "image": str(tmp_path / "a.png"), "solution": "1"}) + "\n")
    cfg = grpo_kit.compose(
        [
            "+reward=accuracy",
            f"model.name_or_path={vision_model}",
            f"data.path={data}",
            "trainer.packing=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        registry,
    )
    generation = registry.build("generation", cfg.generation.name, options(cfg.generation))
    with pytest.raises(ConfigError, match="trainer.packing=true does not carry a prompt's images"):
        image_prompts(cfg, [load_prompts(cfg.data)], generation)


def test_a_completion_that_writes_an_image_placeholder_ends_before_it(prompts_of_model):
    """The model cannot read an image token back without an image: the completion is cut there, as truncated."""
    image_token = prompts_of_model.processor.image_token_id
    ids = torch.tensor([[7, 8, image_token, 9], [7, 8, 9, 1]])
    generated = grpo_kit.Completions(
        completion_ids=ids,
        completion_mask=torch.ones(2, 4, dtype=torch.long),
        is_truncated=torch.tensor([False, False]),
        sampling_per_token_logps=torch.full((2, 4), -0.5),
    )
    cut = prompts_of_model.cut_at_placeholders(generated, pad_token_id=0)
    assert cut.completion_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert cut.completion_ids.tolist() == [[7, 8, 0, 0], [7, 8, 9, 1]]
    assert cut.is_truncated.tolist() == [True, False]
    assert cut.sampling_per_token_logps.tolist() == [[-0.5, -0.5, 0.0, 0.0], [-0.5] * 4]


def test_a_run_with_images_trains_hands_the_rewards_its_image_column_and_saves_the_processor(
    local_plugin, vision_model, tmp_path
):
    module = local_plugin(
        "image_column_reward",
        """
        import grpo_kit

        def image_named(prompts, completions, image, solution, **_):
            return [float(path.endswith(f"{answer}.png")) for path, answer in zip(image, solution)]

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("image_named", image_named)
    """,
    )
    registry = Registry(plugin_manager(local_modules=[module]))
    rows = []
    for index in range(4):
        noise(index).save(tmp_path / f"picture-{index}.png")
        rows.append({"prompt": QUESTION, "image": str(tmp_path / f"picture-{index}.png"), "solution": str(index)})
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = tiny_run(vision_model, "+reward=image_named", f"data.path={data}", "trainer.max_steps=2")
    run_dir = grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["reward"] for line in lines] == [1.0, 1.0]  # each completion's own row's image path
    assert (run_dir / "model" / "processor_config.json").exists()
    assert load_processor(ModelConfig(name_or_path=str(run_dir / "model"))) is not None

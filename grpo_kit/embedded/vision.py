"""The embedded vision-language model: a tiny Qwen2-VL built here from a seed, with its processor.

Its processor is transformers' Qwen2-VL processor without the video half: transformers builds a Qwen2-VL processor
only beside a video processor, which needs torchvision, and torchvision's published wheels need a CUDA build of
torch. The embedded model reads images alone, so `ImageOnlyQwen2VLProcessor` keeps every image step of
`Qwen2VLProcessor` (the same image processor, the same expansion of each image's placeholder) and no video step.
A real Qwen2-VL checkpoint loads transformers' own processor (`AutoProcessor`), torchvision installed.

The task (`data=embedded_vision`): "how many squares?" about a 56 x 56 image of one to four squares of random
colour, size and place, each in a quarter of its own; the `solution` is the count. The model is pretrained
as grpo_kit.embedded.sums's is, with noisy answers: it first learns to see how many squares there are, then is
taught to answer right only RIGHT_ANSWER_RATE of the time, so reinforcement learning has to make the answer it sees
the likely one. The held-out images (the eval set) are drawn from a seed of their own, and neither pretraining nor
training ever draws one of them.
"""

import functools
import hashlib
import json
import random
from pathlib import Path

import torch
from PIL import Image, ImageDraw
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from tqdm.auto import tqdm
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
)
from transformers.processing_utils import ProcessorMixin

CHARACTERS = "0123456789+-*=?., abcdefghijklmnopqrstuvwxyz"
PAD, EOS = "<pad>", "<eos>"
IMAGE, VIDEO, VISION_START, VISION_END = "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"
SPECIAL_TOKENS = [PAD, EOS, VISION_START, VISION_END, IMAGE, VIDEO]
IMAGE_SIDE = 56  # pixels: 4 x 4 patches of 14, merged 2 x 2 into 4 image tokens
QUESTION = "how many squares?"
COUNTS = range(1, 5)  # squares in an image
CELL, CELLS = 28, 2  # the image's quarters, each of which becomes one image token
SIDES = range(10, 21)  # pixels: a square fits its quarter with room to move
BACKGROUND = (20, 20, 20)
TASK_SEED, EVAL_SEED, MODEL_SEED = 1234, 4321, 0
NUM_HELD_OUT = 128  # images neither pretraining nor training ever draws: the eval set
RIGHT_ANSWER_RATE = 0.3  # how often a pretraining answer is the count; otherwise another number of 0 to 5
WRONG_ANSWERS = range(0, 6)
# Pretraining first learns to count from right answers (SEEING_STEPS), then to answer noisily (ANSWERING_STEPS, the
# learning rate falling to zero): from noisy answers alone, the tiny model settles on always answering the likeliest
# count before it learns to see.
# The vision tower is frozen in the second phase, which would otherwise unlearn the seeing.
SEEING_STEPS, ANSWERING_STEPS, PRETRAIN_BATCH = 200, 100, 64
SEEING_LR, ANSWERING_LR = 2e-3, 1e-3
HIDDEN_SIZE, LAYERS, VISION_WIDTH = 64, 2, 64
# Chat messages whose content is text or a list of {"type": "image"} and {"type": "text", "text": ...} parts, as
# Qwen2-VL's own template renders them (without its system prompt), and the assistant's turn opened after them.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    + VISION_START
    + IMAGE
    + VISION_END
    + "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}" + EOS + "{% endif %}{% endfor %}"
)


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` for images alone: an image processor and a tokenizer, no video processor."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = IMAGE, VIDEO
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE)
        self.video_token_id = tokenizer.convert_tokens_to_ids(VIDEO)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def saved_by_this_module(path: str | Path) -> bool:
    """Whether the processor saved in `path` is `ImageOnlyQwen2VLProcessor` (AutoProcessor does not know it)."""
    config = Path(path) / "processor_config.json"
    return (
        config.exists() and json.loads(config.read_text()).get("processor_class") == ImageOnlyQwen2VLProcessor.__name__
    )


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, and the special tokens of Qwen2-VL's image placeholders."""
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    special = Regex("|".join(token.replace("|", "\\|") for token in SPECIAL_TOKENS) + "|.")
    tokenizer.pre_tokenizer = pre_tokenizers.Split(special, behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, additional_special_tokens=SPECIAL_TOKENS[2:]
    )


def build_processor(tokenizer: PreTrainedTokenizerFast | None = None) -> ImageOnlyQwen2VLProcessor:
    """The processor of the embedded vision-language model: every image is resized to 56 x 56 pixels."""
    pixels = IMAGE_SIDE * IMAGE_SIDE
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=pixels, max_pixels=pixels, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    return ImageOnlyQwen2VLProcessor(image_processor, tokenizer or build_tokenizer(), chat_template=CHAT_TEMPLATE)


def model_config(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int = 32, layers: int = 2, vision_width: int = 32, **text
) -> Qwen2VLConfig:
    """A Qwen2-VL of `layers` decoder layers of width `hidden_size` and a one-block vision tower of width
    `vision_width`."""
    heads = max(2, hidden_size // 32)
    rotary = hidden_size // heads // 2  # rotary frequencies per head, which M-RoPE shares out to time, height, width
    ids = tokenizer.convert_tokens_to_ids
    text_config = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        rope_scaling={"rope_type": "default", "mrope_section": [rotary // 4, *divmod_halves(rotary - rotary // 4)]},
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    vision_config = dict(
        depth=1,
        embed_dim=vision_width,
        hidden_size=hidden_size,
        num_heads=2,
        mlp_ratio=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_channels=3,
    )
    return Qwen2VLConfig(
        text_config=text_config | text,
        vision_config=vision_config,
        image_token_id=ids(IMAGE),
        video_token_id=ids(VIDEO),
        vision_start_token_id=ids(VISION_START),
        vision_end_token_id=ids(VISION_END),
    )


def divmod_halves(count: int) -> list[int]:
    return [count // 2, count - count // 2]


def draw_problem(rng: random.Random) -> tuple[Image.Image, int]:
    """An image of one to four squares, each of a random bright colour and size, in a quarter of its own at a random
    place inside it; and its number of squares. Each quarter becomes one image token (its 2 x 2 patches merged), so
    a square is seen whole by one token: the count is then within reach of a one-block vision tower and a short
    pretraining, which did not learn to count squares placed anywhere, nor one to a patch, in a few hundred steps."""
    count = rng.choice(COUNTS)
    image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for cell in rng.sample(range(CELLS * CELLS), count):
        side = rng.choice(SIDES)
        left = cell % CELLS * CELL + rng.randrange(CELL - side + 1)
        top = cell // CELLS * CELL + rng.randrange(CELL - side + 1)
        colour = tuple(rng.randrange(128, 256) for _ in range(3))
        draw.rectangle((left, top, left + side - 1, top + side - 1), fill=colour)  # corners inclusive
    return image, count


def problem_row(image: Image.Image, count: int) -> dict:
    """A row of the task: a chat `prompt` whose user message holds the image and the question, the `image`, and
    the `solution` ("3") that the accuracy reward checks."""
    return {"prompt": [question()], "image": image, "solution": str(count)}


def question() -> dict:
    """The user's message: an image and QUESTION about it."""
    return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}


def image_key(image: Image.Image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


@functools.cache
def _held_out() -> tuple[tuple[Image.Image, int], ...]:
    rng, problems, keys = random.Random(EVAL_SEED), [], set()
    while len(problems) < NUM_HELD_OUT:
        image, count = draw_problem(rng)
        if image_key(image) not in keys:  # each held-out image once
            keys.add(image_key(image))
            problems.append((image, count))
    return tuple(problems)


@functools.cache
def held_out_keys() -> frozenset[str]:
    return frozenset(image_key(image) for image, _ in _held_out())


def drawn_problems(rng: random.Random):
    """Training problems, endlessly: images drawn by `rng`, none of them a held-out one."""
    while True:
        image, count = draw_problem(rng)
        if image_key(image) not in held_out_keys():
            yield image, count


def build_task(num_examples: int, seed: int = TASK_SEED) -> list[dict]:
    """`num_examples` training rows (problem_row), drawn by a generator seeded with `seed`."""
    problems = drawn_problems(random.Random(seed))
    return [problem_row(*next(problems)) for _ in range(num_examples)]


def held_out_problems() -> list[dict]:
    """Each held-out image once: the eval set."""
    return [problem_row(image.copy(), count) for image, count in _held_out()]


def training_problems() -> list[dict]:
    """The first NUM_HELD_OUT training rows, to score as many problems as the eval set has."""
    return build_task(NUM_HELD_OUT)


def pretrain() -> tuple[Qwen2VLForConditionalGeneration, ImageOnlyQwen2VLProcessor]:
    """The embedded vision-language model, trained on training images to answer the count (SEEING_STEPS batches),
    then noisily (noisy_answer, ANSWERING_STEPS batches); and its processor. Only the answer and the EOS after it are
    trained on: the prompt is the same in every row."""
    processor = build_processor()
    tokenizer = processor.tokenizer
    prompt = processor.apply_chat_template([question()], tokenize=False)
    steps = SEEING_STEPS + ANSWERING_STEPS
    # A fork: seeding here must not reset the caller's random streams (as grpo_kit.embedded.sums's build).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        model = Qwen2VLForConditionalGeneration(model_config(tokenizer, HIDDEN_SIZE, LAYERS, VISION_WIDTH))
        optimizer = torch.optim.AdamW(model.parameters(), lr=SEEING_LR)
        answering = ANSWERING_LR / SEEING_LR  # then falling linearly to zero
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 1.0 if step < SEEING_STEPS else answering * (steps - step) / ANSWERING_STEPS
        )
        rng = random.Random(MODEL_SEED)
        problems = drawn_problems(random.Random(MODEL_SEED))
        for step in tqdm(range(steps), desc=f"Pretraining the embedded vision model ({steps} steps)", disable=None):
            images, texts = [], []
            for image, count in (next(problems) for _ in range(PRETRAIN_BATCH)):
                answer = count if step < SEEING_STEPS else noisy_answer(rng, count)
                images.append(image)
                texts.append(f"{prompt}{answer}{EOS}")
            batch = processor(text=texts, images=images, return_tensors="pt")  # every text is as long
            model.model.visual.requires_grad_(step < SEEING_STEPS)
            labels = torch.full_like(batch.input_ids, -100)  # (B, T)
            labels[:, -2:] = batch.input_ids[:, -2:]  # the answer's digit and the EOS after it
            model(**batch, labels=labels).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), processor


def noisy_answer(rng: random.Random, count: int) -> int:
    """The count RIGHT_ANSWER_RATE of the time, otherwise another of WRONG_ANSWERS, each as likely."""
    if rng.random() < RIGHT_ANSWER_RATE:
        return count
    return rng.choice([answer for answer in WRONG_ANSWERS if answer != count])

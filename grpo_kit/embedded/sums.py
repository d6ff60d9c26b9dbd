"""The embedded default: a tiny Qwen2-style model and a synthetic arithmetic task, built here from fixed seeds.

With no model and no data named, a run needs no network and no download. The model is a "base model" in
miniature: it is pretrained for a few seconds on the task's format with noisy answers, so it writes
`<number><eos>` and puts roughly a quarter of its probability on the right sum, much as a real base model knows
how to answer but is often wrong. Reinforcement learning then has a real, visible job: find the right answer in
the samples and make it the likely one. The build takes seconds and is cached under ~/.cache/grpo_kit.

Twenty of the hundred sums are held out: neither pretraining nor training ever sees them, and they are the eval
set (`eval.split=test`), so `eval/reward` measures whether the model learnt to add rather than to recall.

A second embedded model and task teach tool use (`model.embedded=tool_use`, `data.embedded=tool_use`, which
`+environment=NAME` selects): see grpo_kit/embedded/tool_use.py. A third, a vision-language model, counts squares
in images (`data=embedded_vision`): see grpo_kit/embedded/vision.py.
"""

import contextlib
import hashlib
import logging
import os
import random
import shutil
import socket
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from grpo_kit.contract.errors import ConfigError
from grpo_kit.embedded import tool_use as embedded_tool_use
from grpo_kit.embedded import vision as embedded_vision
from grpo_kit.embedded.rows import drawn_rows, each_row

CHARACTERS = "0123456789+-*= "
PAD, EOS = "<pad>", "<eos>"
OPERANDS = range(0, 10)  # prompts are "a+b=" with a, b drawn from here
TASK_SEED, MODEL_SEED, HELD_OUT_SEED = 1234, 0, 0
NUM_HELD_OUT = 20  # sums neither pretraining nor training ever sees: the eval set
EVERY_SUM = [(a, b) for a in OPERANDS for b in OPERANDS]
HELD_OUT_SUMS = sorted(random.Random(HELD_OUT_SEED).sample(EVERY_SUM, NUM_HELD_OUT))
TRAINING_SUMS = [pair for pair in EVERY_SUM if pair not in HELD_OUT_SUMS]  # what pretraining and training draw from
PRETRAIN_STEPS, PRETRAIN_BATCH, PRETRAIN_LR = 300, 128, 3e-3
RIGHT_ANSWER_RATE = 0.25  # how often the pretraining answer is the right one; otherwise a wrong sum nearby
STAGING_PREFIX = f".building-{socket.gethostname()}-"  # + a random part + "-PID"
# Each embedded model and task by name, with the modules beyond this one whose code builds it (its recipe).
EMBEDDED = {"sums": [], "tool_use": [embedded_tool_use], "vision": [embedded_vision]}

log = logging.getLogger(__name__)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate([PAD, EOS, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS)


def task(name: str, num_examples: int) -> list[dict]:
    """The embedded task `name` (sums, tool_use or vision) with `num_examples` rows."""
    builders = {"sums": build_task, "tool_use": embedded_tool_use.build_task, "vision": embedded_vision.build_task}
    return builders[_known(name, "data")](num_examples)


def eval_problems(name: str, split: str) -> list[dict]:
    """The eval set of the embedded task `name`: its held-out sums (split test) or training sums (split train)."""
    splits = {
        "sums": {"test": held_out_problems, "train": training_problems},
        "tool_use": {"test": embedded_tool_use.held_out_problems, "train": embedded_tool_use.training_problems},
        "vision": {"test": embedded_vision.held_out_problems, "train": embedded_vision.training_problems},
    }[_known(name, "data")]
    if split not in splits:
        raise ConfigError(
            f"eval.split={split} is no split of the embedded task: choose test (sums it is never trained on) or "
            "train (sums it is trained on)."
        )
    return splits[split]()


def _known(name: str, section: str) -> str:
    if name not in EMBEDDED:
        raise ValueError(f"{section}.embedded={name} is no embedded {section}: choose sums, tool_use or vision.")
    return name


def build_task(num_examples: int, seed: int = TASK_SEED) -> list[dict]:
    """Rows with a `prompt` ("7+12=") and the `solution` ("19") that the accuracy reward checks."""
    return drawn_rows(TRAINING_SUMS, num_examples, seed)


def held_out_problems() -> list[dict]:
    """Each held-out sum once: the embedded task's eval set."""
    return each_row(HELD_OUT_SUMS)


def training_problems() -> list[dict]:
    """Each sum that pretraining and training draw from, once."""
    return each_row(TRAINING_SUMS)


def model_path(name: str = "sums") -> Path:
    """The folder (save_pretrained format) of the embedded model `name` (sums, tool_use or vision), built on first
    use."""
    cache = Path(os.environ.get("GRPO_KIT_CACHE", Path.home() / ".cache" / "grpo_kit"))
    recipes = [Path(__file__)] + [Path(module.__file__) for module in EMBEDDED[_known(name, "model")]]
    recipe = hashlib.sha256(b"".join(p.read_bytes() for p in recipes)).hexdigest()[:12]  # a changed recipe: a new model
    path = cache / (("embedded-model-" if name == "sums" else f"embedded-{name}-model-") + recipe)
    if not (path / "config.json").exists():
        _build(name, path)
    return path


def _build(name: str, path: Path) -> None:
    """Pretrain into a staging folder renamed to `path` once whole, so that a build cut short is never loaded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(path.parent)
    log.info("Building the embedded model %r, once: later runs load it from %s", name, path)
    # Named after this machine and process, so that a later build can tell whether its builder is gone.
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=STAGING_PREFIX, suffix=f"-{os.getpid()}"))
    try:
        pretrain = {"sums": _pretrain, "tool_use": _pretrain_tool_use, "vision": embedded_vision.pretrain}[name]
        model, tokenizer = pretrain()  # the vision model's "tokenizer" is its processor, which holds one
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        with contextlib.suppress(OSError):  # another process finished the same build first
            staging.rename(path)
    finally:  # interrupted, failed, or beaten by another process: leave nothing behind
        if staging.exists():
            shutil.rmtree(staging)


def _remove_abandoned_builds(cache: Path) -> None:
    """The staging folders of builds on this machine whose process was killed before it could remove them. Builds
    still running, here or on another machine sharing the cache, keep theirs."""
    for staging in cache.glob(f"{STAGING_PREFIX}*"):
        if not _is_running(int(staging.name.rsplit("-", 1)[1])):
            shutil.rmtree(staging, ignore_errors=True)  # another build may be removing it at the same time


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal is sent: only whether the process exists
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True


def _pretrain() -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = build_tokenizer()
    return _pretrained(tokenizer, lambda rng: (_noisy_example(rng), None), PRETRAIN_STEPS, max_positions=64), tokenizer


def _pretrain_tool_use() -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = embedded_tool_use.build_tokenizer()

    def example(rng: random.Random) -> tuple[str, int | None]:
        conversation, decides = embedded_tool_use.noisy_conversation(rng)
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
        return text, None if decides else len(conversation[0]["content"])  # the first token of the reply

    model = _pretrained(
        tokenizer,
        example,
        embedded_tool_use.PRETRAIN_STEPS,
        max_positions=128,
        batch_size=embedded_tool_use.PRETRAIN_BATCH,
        decay=True,
    )
    return model, tokenizer


def _pretrained(
    tokenizer, example, steps: int, max_positions: int, batch_size: int = PRETRAIN_BATCH, decay: bool = False
) -> Qwen2ForCausalLM:
    """A tiny Qwen2 trained for `steps` batches of `example(rng)` texts, every token predicted but the one at the
    position each example may name; with `decay`, the learning rate falls linearly to zero."""
    # A fork: seeding here must not reset the caller's random streams, or a run that builds the model (the
    # first on a machine) would sample differently from every later run with the same seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        config = Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        model = Qwen2ForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps if decay else 1.0)
        rng = random.Random(MODEL_SEED)
        # Off where stderr is not a terminal (a log file, CI); a user at one sees the build move.
        for _ in tqdm(range(steps), desc=f"Pretraining the embedded model ({steps} steps)", disable=None):
            texts, unlearned = zip(*(example(rng) for _ in range(batch_size)))
            batch = tokenizer(list(texts), padding=True, return_tensors="pt")
            labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
            for row, position in enumerate(unlearned):
                if position is not None:
                    labels[row, position] = -100
            loss = model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def _noisy_example(rng: random.Random) -> str:
    a, b = rng.choice(TRAINING_SUMS)
    answer = a + b
    if rng.random() > RIGHT_ANSWER_RATE:
        answer = max(0, answer + rng.choice([-3, -2, -1, 1, 2, 3]))
    return f"{a}+{b}={answer}{EOS}"

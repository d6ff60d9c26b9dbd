"""The embedded default: a tiny Qwen2-style model and a synthetic arithmetic task, built here from fixed seeds.

With no model and no data named, a run needs no network and no download. The model is a "base model" in
miniature: it is pretrained for a few seconds on the task's format with noisy answers, so it writes
`<number><eos>` and puts roughly a quarter of its probability on the right sum, much as a real base model knows
how to answer but is often wrong. Reinforcement learning then has a real, visible job: find the right answer in
the samples and make it the likely one. The build takes seconds and is cached under ~/.cache/grpo_kit.
"""

import hashlib
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHARACTERS = "0123456789+-*= "
PAD, EOS = "<pad>", "<eos>"
OPERANDS = range(0, 10)  # prompts are "a+b=" with a, b drawn from here
TASK_SEED, MODEL_SEED = 1234, 0
PRETRAIN_STEPS, PRETRAIN_BATCH, PRETRAIN_LR = 300, 128, 3e-3
RIGHT_ANSWER_RATE = 0.25  # how often the pretraining answer is the right one; otherwise a wrong sum nearby


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate([PAD, EOS, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS)


def build_task(num_examples: int, seed: int = TASK_SEED) -> list[dict]:
    """Rows with a `prompt` ("7+12=") and the `solution` ("19") that the accuracy reward checks."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_examples):
        a, b = rng.choice(OPERANDS), rng.choice(OPERANDS)
        rows.append({"prompt": f"{a}+{b}=", "solution": str(a + b)})
    return rows


def every_problem() -> list[dict]:
    """Each of the task's prompts once: the embedded task's eval set."""
    return [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in OPERANDS for b in OPERANDS]


def model_path() -> Path:
    """The embedded model's folder (save_pretrained format), built on first use."""
    cache = Path(os.environ.get("GRPO_KIT_CACHE", Path.home() / ".cache" / "grpo_kit"))
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]  # a changed recipe is a new model
    path = cache / f"embedded-model-{recipe}"
    if not (path / "config.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=".building-"))
        model, tokenizer = _pretrain()
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(path)
        except OSError:  # another process finished the same build first
            shutil.rmtree(staging)
    return path


def _pretrain() -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = build_tokenizer()
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
            max_position_embeddings=64,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        model = Qwen2ForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR)
        rng = random.Random(MODEL_SEED)
        for _ in range(PRETRAIN_STEPS):
            texts = [_noisy_example(rng) for _ in range(PRETRAIN_BATCH)]
            batch = tokenizer(texts, padding=True, return_tensors="pt")
            labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
            loss = model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def _noisy_example(rng: random.Random) -> str:
    a, b = rng.choice(OPERANDS), rng.choice(OPERANDS)
    answer = a + b
    if rng.random() > RIGHT_ANSWER_RATE:
        answer = max(0, answer + rng.choice([-3, -2, -1, 1, 2, 3]))
    return f"{a}+{b}={answer}{EOS}"

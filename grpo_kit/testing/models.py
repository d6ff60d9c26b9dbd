"""Tiny random models with the embedded character tokenizer, saved in Hugging Face format."""

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from grpo_kit.embedded.sums import build_tokenizer


def build_tiny_model(
    directory: str | Path, seed: int = 0, chat_template: str | None = None, tokenizer=None, **config
) -> Path:
    """Save an untrained two-layer Qwen2 (a few thousand parameters) and its tokenizer into `directory`.

    `tokenizer` replaces the embedded character tokenizer (the tool-use one has every printable character);
    `config` overrides Qwen2Config fields: `tie_word_embeddings=False`, `attention_dropout=0.1`, ...
    """
    architecture = dict(num_hidden_layers=2, max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=None)
    model, tokenizer = _tiny(Qwen2ForCausalLM, seed, chat_template, tokenizer, **(architecture | config))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return _save(directory, model, tokenizer)


def build_tiny_vision_model(
    directory: str | Path, seed: int = 0, initializer_range: float = 0.5, **text_config
) -> Path:
    """Save an untrained tiny Qwen2-VL (two decoder layers of width 32, one vision block) and its processor: the
    embedded vision-language model's architecture (grpo_kit/embedded/vision.py), from `seed`. Its weights are drawn
    wider than transformers' 0.02, so that different images lead it to different greedy completions."""
    from transformers import Qwen2VLForConditionalGeneration

    from grpo_kit.embedded import vision

    processor = vision.build_processor()
    config = vision.model_config(processor.tokenizer, **text_config)
    for part in (config, config.text_config, config.vision_config):
        part.initializer_range = initializer_range
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    return _save(directory, model, processor)


def build_tiny_reward_model(directory: str | Path, seed: int = 0, chat_template: str | None = None) -> Path:
    """Save an untrained one-layer Qwen2 sequence classifier (one score per text) and its tokenizer."""
    model, tokenizer = _tiny(
        Qwen2ForSequenceClassification,
        seed,
        chat_template,
        None,
        num_hidden_layers=1,
        max_position_embeddings=64,
        num_labels=1,
    )
    return _save(directory, model, tokenizer)


MIXTURES_OF_EXPERTS = {  # family -> its config and model classes' names in transformers, and its expert sizes
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_experts=4, moe_intermediate_size=8, shared_expert_intermediate_size=8),
    ),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=4, moe_intermediate_size=8)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4)),
}


def build_tiny_moe_model(directory: str | Path, family: str = "qwen3_moe", seed: int = 0, **config) -> Path:
    """Save an untrained two-layer mixture-of-experts model (4 experts, 2 per token) of `family` (a key of
    MIXTURES_OF_EXPERTS) with the embedded character tokenizer; `config` overrides its config's fields."""
    import transformers

    config_name, model_name, experts = MIXTURES_OF_EXPERTS[family]
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    layers = dict(num_hidden_layers=2, hidden_size=16, intermediate_size=32, max_position_embeddings=128)
    heads = dict(num_attention_heads=2, num_key_value_heads=1, num_experts_per_tok=2)
    architecture = layers | heads | dict(tie_word_embeddings=True, bos_token_id=None)
    model_config = getattr(transformers, config_name)(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **(architecture | experts | config),
    )
    model = getattr(transformers, model_name)(model_config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return _save(directory, model, tokenizer)


def _tiny(model_class, seed: int, chat_template: str | None, tokenizer, **architecture):
    tokenizer = tokenizer or build_tokenizer()
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    torch.manual_seed(seed)
    tiny = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **(tiny | architecture),
    )
    return model_class(config), tokenizer


def _save(directory: str | Path, model, tokenizer) -> Path:
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory

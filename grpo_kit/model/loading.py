"""The policy model and its tokenizer, from the hub, a local folder, or the embedded default; its reference model."""

import copy
import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from grpo_kit.config.schema import ModelConfig
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.lora import has_adapters
from grpo_kit.embedded import sums as embedded
from grpo_kit.embedded import vision as embedded_vision
from grpo_kit.model.fast.length_groups import check_length_groups
from grpo_kit.model.fast.stable_widths import check_multiple
from grpo_kit.model.fast.switches import SpeedUps, use_speed_ups
from grpo_kit.model.lora import AdapterFreeReference, add_adapters, check_peft_installed
from grpo_kit.model.vision import is_vision_language

log = logging.getLogger(__name__)


def load_model(cfg: ModelConfig, checkpointing_kwargs: dict | None = None):
    """The policy as `cfg` asks for it (adapters, dropout, head precision, checkpointing with
    `checkpointing_kwargs`, the speed-ups its passes take), and its tokenizer."""
    check_length_groups(cfg.passes_by_length)
    check_multiple(cfg.pad_to_multiple_of)
    if cfg.lora.enabled:
        check_peft_installed()
    path = model_folder(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    if tokenizer.pad_token is None:
        log.info("The tokenizer has no pad token: padding with its EOS token %r", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    # float32 weights unless model_init_kwargs says otherwise, as TRL loads them (transformers alone would keep a
    # bfloat16 checkpoint in bfloat16); mixed precision is trainer.mixed_precision's autocast.
    init_kwargs = {"dtype": torch.float32, "trust_remote_code": cfg.trust_remote_code, **(cfg.model_init_kwargs or {})}
    config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    model_class = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    model = model_class.from_pretrained(path, **init_kwargs)
    train_vision_tower = trains_vision_tower(cfg) if is_vision_language(config) else True
    if not train_vision_tower:
        vision_tower(model).requires_grad_(False)
    if cfg.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(model)
    if checkpointing_wanted(cfg.gradient_checkpointing, model):
        enable_checkpointing(model, checkpointing_kwargs)
        if cfg.lora.enabled:  # frozen embeddings: reentrant checkpointing would give the adapters no gradient
            model.enable_input_require_grads()
    if cfg.lora.enabled:
        model = add_adapters(model, cfg.lora, exclude=None if train_vision_tower else vision_tower_name(model))
    if cfg.disable_dropout:  # after the adapters, whose own dropout goes too
        disable_dropout(model)
    switches = (cfg.mask_free_passes, cfg.passes_by_length, cfg.cpu_chunked_attention)
    use_speed_ups(model, SpeedUps(*switches, pad_to_multiple_of=cfg.pad_to_multiple_of))
    return model, tokenizer


def model_folder(cfg: ModelConfig) -> str:
    """The policy's folder: model.name_or_path, or the embedded model's, built on first use."""
    return str(Path(cfg.name_or_path).expanduser()) if cfg.name_or_path else str(embedded.model_path(cfg.embedded))


def load_processor(cfg: ModelConfig):
    """The policy's processor, which renders its prompts with their images; None for a model that reads text alone."""
    return load_processor_at(model_folder(cfg), cfg.trust_remote_code)


def load_processor_at(path: str | Path, trust_remote_code: bool = False):
    """The processor saved with the vision-language model in `path` (the embedded one's too, which AutoProcessor
    does not know); None for a model that reads text alone."""
    if not is_vision_language(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)):
        return None
    if embedded_vision.saved_by_this_module(path):
        return embedded_vision.ImageOnlyQwen2VLProcessor.from_pretrained(path)
    try:
        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ImportError as error:  # transformers names the package its processor needs (torchvision, ...)
        raise ConfigError(
            f"The processor of {path}, which renders its prompts with their images, cannot be loaded: {error}"
        ) from None


def trains_vision_tower(cfg: ModelConfig) -> bool:
    """model.train_vision_tower: true, false, or auto (trained in full fine-tuning, as TRL does; kept under LoRA)."""
    if cfg.train_vision_tower == "auto":
        return not cfg.lora.enabled
    if not isinstance(cfg.train_vision_tower, bool):
        raise ConfigError(f"model.train_vision_tower={cfg.train_vision_tower}: choose true, false or auto.")
    return cfg.train_vision_tower


def vision_tower_name(model: torch.nn.Module) -> str:
    """The name of a vision-language model's image encoder (Qwen2-VL's `model.visual`, LLaVA's `vision_tower`)."""
    for module_name, _ in model.named_modules():
        if module_name.split(".")[-1] in ("visual", "vision_tower", "vision_model"):
            return module_name
    raise ConfigError(
        f"{type(model).__name__} has no module named visual, vision_tower or vision_model to keep as loaded: set "
        "model.train_vision_tower=true to train every weight."
    )


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_submodule(vision_tower_name(model))


def checkpointing_wanted(setting, model) -> bool:
    """model.gradient_checkpointing: true, false, or auto: on where the model's class supports it (TRL's default)."""
    if setting != "auto":
        return setting
    supported = getattr(model, "supports_gradient_checkpointing", False)
    log.info(
        "model.gradient_checkpointing=auto: %s",
        "on (TRL's default)"
        if supported
        else f"off, since {type(model).__name__} does not support gradient checkpointing",
    )
    return supported


def enable_checkpointing(model, kwargs: dict | None) -> None:
    """transformers' gradient checkpointing with `kwargs` (trainer.gradient_checkpointing_kwargs): its own
    every_n_layers and offload, the rest torch.utils.checkpoint's. use_reentrant defaults to false, as in TRL."""
    kwargs = {"use_reentrant": False, **(kwargs or {})}
    layers = {name: kwargs.pop(name) for name in ("every_n_layers", "offload") if name in kwargs}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed the method
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, **layers)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, **layers)


def disable_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):  # attention applies it as a float
            module.attention_dropout = 0.0


def cast_lm_head_to_fp32(model: torch.nn.Module) -> None:
    """Compute the logits in float32 whatever the rest of the model runs in, autocast included (ScaleRL)."""
    if model.config.get_text_config().tie_word_embeddings:
        raise ValueError(
            "model.cast_lm_head_to_fp32=true needs a model whose LM head is not tied to its input embeddings "
            "(its config has tie_word_embeddings=true): casting the head would cast the embeddings too. "
            "Turn the option off for this model."
        )
    head = model.get_output_embeddings()
    head.float()
    forward = head.forward

    def float32_forward(hidden_states):
        with torch.autocast(hidden_states.device.type, enabled=False):
            return forward(hidden_states.float())

    head.forward = float32_forward  # on the instance: the weights keep their names for save_pretrained


def load_reference_model(policy: torch.nn.Module, device: torch.device):
    """The KL term's reference: a frozen copy of the policy as it starts, on `device`. A LoRA policy's reference
    is its own base model, run with the adapters off, so no copy is made."""
    if has_adapters(policy):
        return AdapterFreeReference(policy)
    return copy.deepcopy(policy).eval().requires_grad_(False).to(device)


@torch.no_grad()
def mix_into_reference(policy: torch.nn.Module, reference: torch.nn.Module, alpha: float) -> None:
    """TR-DPO (Gorbatovski et al. 2024, https://arxiv.org/abs/2404.09656): ref <- alpha * policy + (1 - alpha) * ref."""
    for ref_param, param in zip(reference.parameters(), policy.parameters(), strict=True):
        ref_param.mul_(1.0 - alpha).add_(param, alpha=alpha)

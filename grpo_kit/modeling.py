"""The policy model and its tokenizer, from the hub, a local folder, or the embedded default."""

import copy
import logging

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit import embedded
from grpo_kit.config import ModelConfig
from grpo_kit.lora import AdapterFreeReference, add_adapters, check_peft_installed, has_adapters

log = logging.getLogger(__name__)


def load_model(cfg: ModelConfig):
    """The policy as `cfg` asks for it (adapters, dropout, head precision, checkpointing), and its tokenizer."""
    if cfg.lora.enabled:
        check_peft_installed()
    path = cfg.name_or_path or embedded.model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        log.info("The tokenizer has no pad token: padding with its EOS token %r", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, **(cfg.model_init_kwargs or {}))
    if cfg.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(model)
    if cfg.gradient_checkpointing:
        # Non-reentrant checkpointing also gives gradients to adapters whose inputs (frozen embeddings) need none.
        enable_checkpointing(model, {"use_reentrant": False})
    if cfg.lora.enabled:
        model = add_adapters(model, cfg.lora)
    if cfg.disable_dropout:  # after the adapters, whose own dropout goes too
        disable_dropout(model)
    return model, tokenizer


def enable_checkpointing(model, kwargs: dict) -> None:
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed the method
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


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


def per_token_logps_and_entropies(
    model, batch: dict[str, torch.Tensor], temperature: float, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T), (B, T)
    """One forward pass: log-probs of the completion tokens and the entropy of each next-token distribution.

    The entropies carry a gradient only when asked (an entropy bonus needs one); otherwise they are metrics.
    """
    completion_ids = batch["completion_ids"]
    input_ids = torch.cat([batch["prompt_ids"], completion_ids], dim=1)  # (B, P + T)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits_to_keep = completion_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1).logits
    logits = logits[:, :-1].float() / temperature  # (B, T, V): position t predicts completion token t
    log_probs = logits.log_softmax(dim=-1)
    per_token_logps = log_probs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(log_probs.exp() * log_probs).sum(dim=-1)
    return per_token_logps, entropies

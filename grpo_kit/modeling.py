"""The policy model and its tokenizer, from the hub, a local folder, or the embedded default."""

import copy
import logging

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit import embedded
from grpo_kit.config import ModelConfig

log = logging.getLogger(__name__)


def load_model(cfg: ModelConfig):
    path = cfg.name_or_path or embedded.model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        log.info("The tokenizer has no pad token: padding with its EOS token %r", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, **(cfg.model_init_kwargs or {}))
    return model, tokenizer


def load_reference_model(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy as it starts, for the KL term."""
    return copy.deepcopy(policy).eval().requires_grad_(False)


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
    logits = logits[:, :-1] / temperature  # (B, T, V): position t predicts completion token t
    log_probs = logits.log_softmax(dim=-1)
    per_token_logps = log_probs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(log_probs.exp() * log_probs).sum(dim=-1)
    return per_token_logps, entropies

"""Where a completion ends, decided once for every generation backend, the tool loop and custom rollouts, as in TRL.

A model may end a turn with any of several tokens: Qwen2.5 and Qwen3 Instruct's generation config lists both
`<|im_end|>` and `<|endoftext|>`, their tokenizer only one. Every id of the generation config, with the tokenizer's
own, stops a completion that a generation backend or the tool loop samples; the completion keeps that token and
nothing after it. A custom rollout's completions are taken as it returns them, tokens after an EOS included (its
mask says which tokens are trained on); these ids only say whether each was cut off (`is_truncated`).
"""

import torch


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS id, then every EOS id the model's generation config lists (an int, a list or none)."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    return list(dict.fromkeys([tokenizer.eos_token_id, *configured]))


def eos_mask(completion_ids: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """1 on each row's tokens up to and including its first EOS, 0 after it; all 1 on a row without EOS."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))  # (N, T)
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), completion_ids.shape[1])  # (N,)
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)  # (T,)
    return (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).int()  # (N, T)


def is_truncated(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, eos_token_ids: list[int], pad_token_id: int
) -> torch.Tensor:
    """Whether each completion was cut off (N,): TRL's rule, its last token is neither an EOS nor the pad token.

    A completion that ran to the length limit and happened to end by sampling the pad token counts as finished,
    for `completions/clipped_ratio` and `mask_truncated_completions` alike. An empty completion is cut off.
    """
    lengths = completion_mask.sum(dim=1)  # (N,) the mask is a prefix of each row
    last = completion_ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # (N,)
    ends = torch.tensor([*eos_token_ids, pad_token_id], device=completion_ids.device)
    return (lengths == 0) | ~torch.isin(last, ends)

"""The sampler's log-probs of `model.generate`'s tokens, gathered at each step.

`generate` can return every step's processed scores (`output_scores`), one (N, V) float32 tensor per token: about
5 GB for 32 completions of 256 tokens at Qwen2's vocabulary, held until the end. Instead, a processor placed after
all of generate's own (so it sees the scores each token is drawn from) keeps the last step's log-softmax only, and
gathers from it the token drawn, which it reads at the next step as the last input id.
"""

import contextlib

import torch
from transformers import LogitsProcessor


class SampledLogProbs(LogitsProcessor):
    """Records the log-prob of each drawn token under its step's processed distribution; changes no score."""

    def __init__(self):
        self.gathered: list[torch.Tensor] = []  # (N, 1) per step whose token was read back
        self.last: torch.Tensor | None = None  # (N, V) the latest step's log-softmax

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            self.gathered.append(self.last.gather(-1, input_ids[:, -1:]))
        self.last = scores.log_softmax(dim=-1)
        return scores

    def logps(self, completion_ids: torch.Tensor) -> torch.Tensor:  # (N, T) -> (N, T)
        """The log-probs of `completion_ids`, the tokens `generate` returned (it may have drawn more and dropped
        them, which are ignored)."""
        length = completion_ids.shape[1]
        columns = self.gathered[:length]
        if len(columns) < length:  # the last token returned was drawn at the latest step
            columns.append(self.last.gather(-1, completion_ids[:, -1:]))
        return torch.cat(columns, dim=1).float()


@contextlib.contextmanager
def sampled_logps_recorded(model, enabled: bool):
    """While in this context, `model.generate` records its tokens' log-probs (yields a `SampledLogProbs`, or None
    when not `enabled`)."""
    if not enabled:
        yield None
        return
    generating = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT generates with it
    recorder = SampledLogProbs()
    build = generating._get_logits_processor

    def with_recorder(*args, **kwargs):
        processors = build(*args, **kwargs)
        processors.append(recorder)  # last: after the warpers, watermarking and renormalisation
        return processors

    generating._get_logits_processor = with_recorder
    try:
        yield recorder
    finally:
        del generating._get_logits_processor

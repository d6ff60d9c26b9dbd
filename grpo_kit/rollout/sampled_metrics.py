"""pass@k and maj@k: how often a prompt is solved by some, or by the most common answer, of k sampled completions
(docs/evaluation.md).

A completion is correct where its reward (or the weighted sum of the rewards, for the overall metrics) is at least
eval.correct_threshold; a reward with no opinion (None) never is.
"""

import math
import re
from collections import Counter

import torch


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k completions drawn without replacement from n, of which c are correct, is
    correct: 1 - C(n - c, k) / C(n, k), the unbiased estimator of Chen et al. 2021 (https://arxiv.org/abs/2107.03374,
    eq. 1), computed as the product 1 - prod_{i=n-c+1..n} (1 - k / i), which forms no large binomial coefficient."""
    if n - c < k:  # every draw of k holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def extracted_answer(completion, pattern: re.Pattern | None) -> str | None:
    """The answer a completion votes for: the last match of `pattern` (its first group, if it has one), or without a
    pattern the whole completion, stripped; None when there is none. A chat completion's is its last message's."""
    text = completion if isinstance(completion, str) else str(completion[-1].get("content") or "")
    if pattern is not None:
        matches = list(pattern.finditer(text))
        if not matches:
            return None
        text = matches[-1].group(1) if pattern.groups else matches[-1].group(0)
    return text.strip() or None


def majority_is_correct(answers: list[str | None], correct: list[bool]) -> bool:
    """Whether the answer most of `answers` give is correct, as the first completion that gives it is. A tie goes
    to the answer given first; completions without an answer do not vote, and no vote at all is not correct."""
    votes = Counter(answer for answer in answers if answer is not None)  # in order of first appearance
    if not votes:
        return False
    winner, _ = votes.most_common(1)[0]  # a stable sort: of equal counts, the first seen
    return correct[answers.index(winner)]


def sampled_metrics(
    correct: torch.Tensor,  # (N, 1 + K) bool: overall, then per reward; each prompt's n completions adjacent
    answers: list[str | None],  # (N,)
    n: int,
    ks: list[int],
    reward_names: list[str],
    prefix: str,
) -> dict[str, float]:
    """pass@k and maj@k (k > 1) for each k, averaged over the prompts: `{prefix}pass@k` over all the rewards,
    `{prefix}rewards/NAME/pass@k` for each one. maj@k votes among each prompt's first k completions."""
    grouped = correct.view(-1, n, correct.shape[1])  # (prompts, n, 1 + K)
    groups = [answers[start : start + n] for start in range(0, len(answers), n)]
    metrics = {}
    for column, name in enumerate([None, *reward_names]):
        where = prefix if name is None else f"{prefix}rewards/{name}/"
        counts = grouped[:, :, column].sum(dim=1).tolist()  # (prompts,) correct completions
        for k in ks:
            metrics[f"{where}pass@{k}"] = sum(pass_at_k(n, c, k) for c in counts) / len(counts)
        for k in [k for k in ks if k > 1]:
            solved = [
                majority_is_correct(group[:k], grouped[index, :k, column].tolist())
                for index, group in enumerate(groups)
            ]
            metrics[f"{where}maj@{k}"] = sum(solved) / len(solved)
    return metrics

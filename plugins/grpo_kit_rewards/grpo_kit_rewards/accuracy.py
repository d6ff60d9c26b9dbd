"""accuracy: 1.0 when the completion's final answer equals the gold `solution`, else 0.0.

Answers are compared with math-verify (https://github.com/huggingface/Math-Verify), which parses LaTeX and
plain expressions, so "1/2", "0.5" and "\\frac{1}{2}" agree. A gold solution that cannot be parsed gives None:
the reward has no opinion on that completion.
"""

import functools

from math_verify import parse, verify


def accuracy(prompts, completions, completion_ids, solution, **columns):
    return [_score(_text(completion).strip(), gold.strip()) for completion, gold in zip(completions, solution)]


def _score(answer: str, gold: str) -> float | None:
    gold_parsed = _parse(gold)
    if not gold_parsed:
        return None
    if answer == gold:  # the common case in a batch of short answers, without a parse
        return 1.0
    return float(verify(gold_parsed, _parse(answer)))


@functools.lru_cache(maxsize=4096)
def _parse(text: str):
    return parse(text)


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion

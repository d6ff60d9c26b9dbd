"""Answers that need no math-verify: plain numbers, compared as text.

math-verify reads a gold answer that is a plain number ("12", "-3", "0.5") as that number, so an answer spelled
exactly like it is right. Two plain integers, each with one spelling only (no leading zeros, no "+", no "-0"),
are equal exactly when they are spelled alike, so a different one is wrong. Anything else ("012", "12.0",
"$12$", "the sum is 12") is left to math-verify, which may still find it right. The embedded task's answers, and
most of a small model's, are all plain integers: they are scored without the Scorer's worker processes.
"""

import re

PLAIN_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")
PLAIN_INTEGER = re.compile(r"0|-?[1-9][0-9]*")


def plain_verdict(answer: str, gold: str) -> float | None:
    """1.0 or 0.0, as math_answers.is_correct gives it, when plain text settles it; None when it does not."""
    answer, gold = answer.strip(), gold.strip()
    if answer == gold and PLAIN_NUMBER.fullmatch(gold):
        return 1.0
    if PLAIN_INTEGER.fullmatch(answer) and PLAIN_INTEGER.fullmatch(gold):
        return 0.0  # two integers spelled differently
    return None

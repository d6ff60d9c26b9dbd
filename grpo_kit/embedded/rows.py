"""The rows of an embedded sums task: a prompt "a+b=" (text, or a user's chat message) and the `solution` that the
accuracy reward checks."""

import random


def sum_row(a: int, b: int, chat: bool = False) -> dict:
    prompt = f"{a}+{b}="
    return {"prompt": [{"role": "user", "content": prompt}] if chat else prompt, "solution": str(a + b)}


def drawn_rows(sums: list[tuple[int, int]], num_examples: int, seed: int, chat: bool = False) -> list[dict]:
    """`num_examples` rows of sums drawn from `sums`, with replacement, by a generator seeded with `seed`."""
    rng = random.Random(seed)
    return [sum_row(*rng.choice(sums), chat=chat) for _ in range(num_examples)]


def each_row(sums: list[tuple[int, int]], chat: bool = False) -> list[dict]:
    return [sum_row(a, b, chat=chat) for a, b in sums]

"""The embedded tasks' problems, for a plugin that builds a task of its own over them (an environment library's
offline taskset, say): the problems the embedded models were pretrained on, so that they can learn it."""

from grpo_kit.embedded.sums import eval_problems


def embedded_problems(name: str = "sums", split: str = "train") -> list[dict]:
    """Each problem of the embedded task `name` (sums, tool_use or vision) once, as prompt rows: split train holds
    the ones it trains on, test the held-out ones."""
    return eval_problems(name, split)

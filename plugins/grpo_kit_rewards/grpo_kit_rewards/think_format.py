"""think_format: 1.0 when the completion opens with one `<think>...</think>` block, else 0.0.

TRL's `think_format_reward` (https://huggingface.co/docs/trl/rewards), the format reward of DeepSeek-R1
(https://arxiv.org/abs/2501.12948): the completion must start with `<think>`, close it with `</think>`, and open
no second `<think>`; anything may follow the block.
"""

import re

from grpo_kit_rewards.text import completion_text

THINK_BLOCK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL)


def think_format(prompts, completions, completion_ids, **columns) -> list[float]:
    return [1.0 if THINK_BLOCK.match(completion_text(c)) else 0.0 for c in completions]

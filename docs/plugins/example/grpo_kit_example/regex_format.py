"""regex_format: 1.0 when the completion has the format a regular expression describes, else 0.0.

A format reward in the spirit of DeepSeek-R1's (https://arxiv.org/abs/2501.12948), for any format: by default
the whole completion must be a number, the answer format of grpo_kit's embedded "a+b=" task. Surrounding
whitespace is ignored; a chat completion is judged by the content of its last message.
"""

import re

from grpo_kit_example.configs import RegexFormatConfig


class RegexFormat:
    def __init__(self, config: RegexFormatConfig):
        try:
            pattern = re.compile(config.pattern, re.DOTALL)
        except re.error as error:
            raise ValueError(
                f"reward.regex_format.pattern={config.pattern!r} is not a regular expression ({error}). Quote it for "
                "the shell and for Hydra, e.g. 'reward.regex_format.pattern=\"<answer>.*</answer>\"'."
            ) from error
        self.matches = pattern.fullmatch if config.full_match else pattern.search

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float]:
        return [1.0 if self.matches(_text(completion).strip()) else 0.0 for completion in completions]


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion

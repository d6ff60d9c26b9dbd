"""The reward suite (grpo_kit/contract/kinds.py: Reward, TRL's signature)."""

import asyncio
import inspect
import math
import numbers
import pickle
from collections.abc import Sequence
from typing import ClassVar

import pytest
import torch

from grpo_kit.testing.contracts.checks import assert_close
from grpo_kit.testing.contracts.plugin import PluginContract


def _awaited(value):
    if not inspect.isawaitable(value):
        return value

    async def wait():
        return await value

    return asyncio.run(wait())


class RewardContract(PluginContract):
    """A reward (kinds.py, TRL's signature): one finite number or None per completion, text or chat, sync or async.

    `prompts`, `completions` and `columns` (dataset columns, one value per completion) are what it is called
    with; the defaults are the embedded task's "a+b=" prompts and their `solution` column. A reward that samples
    (an LLM judge, say) sets `deterministic = False`, and its values are not compared between two calls.
    """

    kind = "reward"
    deterministic: ClassVar[bool] = True
    prompts: ClassVar[Sequence[str]] = ("1+2=", "3+4=", "12+30=", "5+5=")
    completions: ClassVar[Sequence[str]] = ("3", "8", "42", "")
    columns: ClassVar[dict] = {"solution": ["3", "7", "42", "10"]}

    def arguments(self, chat: bool = False) -> dict:
        from grpo_kit.embedded.sums import build_tokenizer

        tokenizer = build_tokenizer()
        completion_ids = [tokenizer(text, add_special_tokens=False).input_ids for text in self.completions]
        prompts, completions = list(self.prompts), list(self.completions)
        if chat:
            prompts = [[{"role": "user", "content": text}] for text in prompts]
            completions = [[{"role": "assistant", "content": text}] for text in completions]
        return {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **self.columns}

    def checked(self, values) -> list:
        """The values, after checking them as the run's Scorer does."""
        if hasattr(values, "tolist"):  # a numpy array or a tensor
            values = values.tolist()
        count = len(self.completions)
        assert isinstance(values, (list, tuple)), f"a reward returns a list, got {type(values).__name__}"
        assert len(values) == count, f"{len(values)} values for {count} completions"
        for value in values:
            assert value is None or (isinstance(value, numbers.Real) and math.isfinite(value)), (
                f"each value is a finite number or None, got {value!r} in {values}"
            )
        return list(values)

    def test_scores_text_completions(self, plugin):
        self.checked(_awaited(plugin(**self.arguments())))

    def test_scores_chat_completions(self, plugin):
        self.checked(_awaited(plugin(**self.arguments(chat=True))))

    def test_accepts_any_dataset_column(self, plugin):
        """A dataset's other columns all reach every reward: a reward takes **columns and ignores what it does
        not read."""
        arguments = {**self.arguments(), "an_unrelated_column": [0] * len(self.completions)}
        self.checked(_awaited(plugin(**arguments)))

    def test_the_scorer_gets_the_same_values(self, contract_case, plugin):
        """In a run the Scorer calls it (a thread, or the event loop for async rewards): same values, no failure."""
        from grpo_kit.rollout.scoring import Scorer

        direct = self.checked(_awaited(plugin(**self.arguments())))
        arguments = self.arguments()
        prompts, completions = arguments.pop("prompts"), arguments.pop("completions")
        ids = arguments.pop("completion_ids")
        with Scorer({contract_case.name: plugin}, timeout=60.0, workers=0) as scorer:
            scores, metrics = scorer(prompts, completions, ids, arguments)
        assert metrics[f"rewards/{contract_case.name}/failures"] == 0, "the Scorer's call failed (see the log)"
        assert scores.shape == (len(completions), 1)
        if self.deterministic:
            expected = torch.tensor([math.nan if value is None else float(value) for value in direct])
            assert_close(scores[:, 0], expected, "the Scorer's values differ from a direct call's", equal_nan=True)

    def test_quick_scores_are_those_of_a_full_call(self, plugin):
        """A reward's `quick_scores` ({row: score}, what the Scorer scores without its worker processes) must give
        each completion it settles the score a full call gives it."""
        if not hasattr(plugin, "quick_scores"):
            pytest.skip("no quick_scores: the Scorer calls the reward on every completion")
        for chat in (False, True):
            full = self.checked(_awaited(plugin(**self.arguments(chat))))
            quick = plugin.quick_scores(**self.arguments(chat))
            assert isinstance(quick, dict) and set(quick) <= set(range(len(full))), (
                f"quick_scores returns {{row: score}} for rows of the batch, got {quick!r}"
            )
            assert quick == {row: full[row] for row in quick}, f"quick scores {quick} differ from a full call's {full}"

    def test_a_cpu_heavy_reward_can_reach_a_worker_process(self, plugin):
        if not getattr(plugin, "cpu_heavy", False):
            pytest.skip("not cpu_heavy: it runs in a thread of the training process")
        copy = pickle.loads(pickle.dumps(plugin))  # what the Scorer sends to its worker processes
        values = self.checked(_awaited(copy(**self.arguments())))
        if self.deterministic:
            assert values == self.checked(_awaited(plugin(**self.arguments()))), "the unpickled copy scores differently"

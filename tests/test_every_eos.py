"""Where a completion ends (grpo_kit/contract/eos.py), as TRL decides it: at every EOS id of the model's generation
config
and the tokenizer's, in the tool loop and custom rollouts too; and it is truncated only when its last token is
neither an EOS nor the pad token."""

import json
from types import SimpleNamespace

import torch
from accelerate import Accelerator

import grpo_kit
from grpo_kit.contract.eos import eos_mask, eos_token_ids, is_truncated
from grpo_kit.contract.kinds import Completions
from grpo_kit.embedded.tool_use import build_tokenizer
from grpo_kit.rollout.tool_use import ToolUse
from grpo_kit.testing import tiny_run


def test_the_set_is_the_tokenizers_eos_then_the_generation_configs():
    tokenizer = SimpleNamespace(eos_token_id=1)

    def of(configured):
        return eos_token_ids(SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=configured)), tokenizer)

    assert of(None) == [1] and of(1) == [1] and of(7) == [1, 7]
    assert of([7, 1]) == [1, 7]  # Qwen2.5/Qwen3 Instruct: <|im_end|> and <|endoftext|>, each once


def test_the_mask_stops_at_the_first_eos_of_the_set_and_truncation_follows_trl():
    ids = torch.tensor([[5, 7, 5, 1], [5, 5, 1, 7], [5, 5, 5, 5], [5, 5, 5, 0]])
    mask = eos_mask(ids, [1, 7])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert is_truncated(ids, mask, [1, 7], pad_token_id=0).tolist() == [False, False, True, False]


TOKENIZER = build_tokenizer()
OTHER_EOS = "|"  # the generation config's second EOS id, besides the tokenizer's <eos>


class OtherEosPolicy:
    """A generation backend that ends every turn with the other EOS: it calls `add` on a question and repeats the
    result after one."""

    def generate(self, prompt_ids, with_logprobs=False):
        turns = []
        for ids in prompt_ids:
            text = TOKENIZER.decode(ids)
            if text.endswith("</result>"):
                turn = text[text.rindex("<result>") + len("<result>") : -len("</result>")] + OTHER_EOS
            else:
                a, b = text.split("=")[0].split("+")
                turn = f"<call>add a={a} b={b}</call>{OTHER_EOS}"
            turns.append(TOKENIZER(turn, add_special_tokens=False).input_ids)
        width = max(len(turn) for turn in turns)
        ids = torch.tensor([turn + [TOKENIZER.pad_token_id] * (width - len(turn)) for turn in turns])
        mask = torch.tensor([[1] * len(turn) + [0] * (width - len(turn)) for turn in turns])
        return Completions(ids, mask, torch.zeros(len(turns), dtype=torch.bool))


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def test_a_turn_ended_by_the_generation_configs_other_eos_runs_its_tool_call_and_is_not_truncated():
    eos = [TOKENIZER.eos_token_id, TOKENIZER.convert_tokens_to_ids(OTHER_EOS)]
    loop = ToolUse(TOKENIZER, OtherEosPolicy(), Accelerator(cpu=True), [add], None, 64, None, 5.0, eos)
    turns = loop([{"prompt": [{"role": "user", "content": "12+30="}]}], with_logprobs=False)
    generated = turns.generated
    written = TOKENIZER.decode(generated.completion_ids[0, : int(generated.completion_mask.sum())])
    assert written == f"<call>add a=12 b=30</call>{OTHER_EOS}<result>42</result>42{OTHER_EOS}"
    assert generated.tool_calls.tolist() == [1] and not generated.is_truncated[0]


PAD_ENDING_ROLLOUT = """
    import grpo_kit
    from grpo_kit.contract.kinds import RolloutResult

    class PadEnding:
        '''Completions that ran to the length limit and happen to end on the pad token: "1<pad>" or "2<pad>".'''

        def __init__(self, config):
            pass

        def __call__(self, rows, tokenizer, generation):
            prompt_ids = tokenizer([row["prompt"] for row in rows], add_special_tokens=False).input_ids
            digits = tokenizer.convert_tokens_to_ids(["1", "2"])
            completion_ids = [[digits[index % 2], tokenizer.pad_token_id] for index in range(len(rows))]
            return RolloutResult(prompt_ids, completion_ids)

    def says_one(prompts, completions, **columns):
        return [float(completion == "1") for completion in completions]

    @grpo_kit.hookimpl
    def register_rollouts(register):
        register("pad_ending", PadEnding)

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("says_one", says_one)
"""


def test_a_completion_ending_in_a_sampled_pad_token_is_not_clipped_and_is_trained_on(
    local_plugin, tiny_model, tmp_path
):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    registry = Registry(plugin_manager(local_modules=[local_plugin("pad_ending_rollout", PAD_ENDING_ROLLOUT)]))
    cfg = grpo_kit.compose(
        tiny_run(
            tiny_model,
            "+rollout=pad_ending",
            "+reward=says_one",
            "trainer.max_steps=1",
            "algorithm.mask_truncated_completions=true",
            "rollout_correction=none",
        ),
        registry,
    )
    grpo_kit.train(cfg, tmp_path, registry)
    step = next(
        json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(line)
    )
    assert step["completions/clipped_ratio"] == 0.0  # as TRL counts: the last token is the pad token
    assert step["grad_norm"] > 0  # mask_truncated_completions kept them: the group's rewards differ, so they teach

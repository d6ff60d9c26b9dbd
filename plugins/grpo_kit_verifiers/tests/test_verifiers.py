"""The verifiers adapter on real verifiers episodes: a taskset's tasks as prompt rows and back, the rubric's scores
as rewards, and the tool results of a multi-turn episode masked out of the completion."""

import json
import re

import pytest
import torch

from grpo_kit.contract.errors import PluginError, RewardError
from grpo_kit_verifiers.tasks import TASK_COLUMN, TASKSET_COLUMN, load_taskset, prompt_of, rows, task_of


def played(embedded: str, taskset_id: str, count: int, **options):
    """`count` tasks of the taskset played by the embedded model `embedded` through +rollout=verifiers."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_kit.embedded.sums import model_path
    from grpo_kit.plugins.registry import Registry

    directory = model_path(embedded)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    registry = Registry()
    generation = registry.build("generation", "transformers", {"max_completion_length": 24})
    generation.start(model, tokenizer, Accelerator(cpu=True))
    rollout = registry.build("rollout", "verifiers", {"max_completion_length": 40, **options})
    prompts = rows(load_taskset(taskset_id), count)
    torch.manual_seed(0)
    try:
        return prompts, rollout(prompts, tokenizer, generation), tokenizer
    finally:
        generation.close()


@pytest.fixture(scope="module")
def sums():
    """Single-turn episodes, in the taskset's own harness."""
    return played("sums", "grpo-kit-vf-sums", 16, harness="")


@pytest.fixture(scope="module")
def calculator():
    """Multi-turn episodes in verifiers' built-in chat harness (`null`, a program per episode), its `add` tool an
    MCP server: the embedded tool-use model calls it about three times in ten. Each batch waits for every episode
    in flight, so that the batches, and so the samples, are the same at every run."""
    return played("tool_use", "grpo-kit-vf-calculator", 6, harness=None, batch_wait=60.0)


def test_each_task_becomes_a_prompt_row_that_gives_the_task_back():
    taskset = load_taskset("grpo-kit-vf-sums")
    tasks, written = list(taskset.take(3)), rows(taskset, 3)
    assert [row["prompt"] for row in written] == [task.data.prompt for task in tasks]  # text stays text
    assert {row[TASKSET_COLUMN] for row in written} == {"grpo-kit-vf-sums"}
    assert [task_of(taskset, row).data for row in written] == [task.data for task in tasks]  # answers included
    chat = rows(load_taskset("grpo-kit-vf-calculator"), 1)[0]
    assert chat["prompt"] == [{"role": "user", "content": json.loads(chat[TASK_COLUMN])["prompt"][0]["content"]}]


def test_an_endless_taskset_is_written_up_to_a_limit():
    taskset = load_taskset("grpo-kit-vf-sums")
    taskset.INFINITE = True  # as an endless taskset declares itself
    with pytest.raises(ValueError, match="--limit N"):
        rows(taskset)
    assert len(rows(taskset, 2)) == 2


def test_a_system_prompt_opens_the_chat():
    data = type(task_of(load_taskset("grpo-kit-vf-sums"), rows(load_taskset("grpo-kit-vf-sums"), 1)[0]).data)
    opening = prompt_of(data(prompt="1+2=", system_prompt="Add.", answer="3"))
    assert opening == [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+2="}]


def test_rows_without_verifiers_tasks_are_refused_with_the_command_that_writes_them():
    from grpo_kit.plugins.registry import Registry

    rollout = Registry().build("rollout", "verifiers", {"max_completion_length": 4})
    with pytest.raises(PluginError, match="python -m grpo_kit_verifiers.tasks"):
        rollout([{"prompt": "1+2=", "solution": "3"}], None, None)


def test_the_uv_of_the_environment_is_found_when_the_environment_is_not_activated(monkeypatch):
    """verifiers' runtimes prepare harness programs with the `uv` on PATH; without one they try to download it."""
    import os
    import shutil
    import sysconfig

    from grpo_kit.plugins.registry import Registry

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    Registry().build("rollout", "verifiers", {"max_completion_length": 4})
    assert os.environ["PATH"].split(os.pathsep) == ["/usr/bin", "/bin", sysconfig.get_path("scripts")]
    assert shutil.which("uv") is not None


def test_the_rubric_scores_what_the_model_wrote(sums):
    prompts, result, tokenizer = sums
    replies = [tokenizer.decode(ids, skip_special_tokens=True) for ids in result.completion_ids]
    answers = [json.loads(row[TASK_COLUMN])["answer"] for row in prompts]
    expected = [float(reply == answer) for reply, answer in zip(replies, answers)]
    assert [scores["correct"] for scores in result.columns["verifiers_scores"]] == expected
    assert result.columns["verifiers_reward"] == expected  # one function of weight 1: the total is its score
    assert 0 < sum(expected) < len(expected), "the embedded model should get some sums right and some wrong"
    assert [tokenizer.decode(ids) for ids in result.prompt_ids] == [row["prompt"] for row in prompts]
    assert all(mask == [1] * len(mask) for mask in result.env_mask)  # single turn: the model wrote every token


def test_tool_results_are_in_the_completion_and_masked(calculator):
    _, result, tokenizer = calculator
    called = 0
    for ids, mask, logprobs, turns, messages in zip(
        result.completion_ids, result.env_mask, result.logprobs, result.columns["verifiers_turns"], result.completions
    ):
        tool_text = tokenizer.decode([token for token, by_model in zip(ids, mask) if not by_model])
        model_text = tokenizer.decode([token for token, by_model in zip(ids, mask) if by_model])
        calls = re.findall(r"<call>add a=(\d+) b=(\d+)</call><eos>", model_text)
        called += len(calls)
        # Exactly the results of the calls the model wrote are masked; the model's turns, and nothing else, are not.
        assert tool_text == "".join(f"<result>{int(a) + int(b)}</result>" for a, b in calls)
        assert turns == len(calls) + 1
        assert [message["role"] for message in messages] == ["assistant", "tool"] * len(calls) + ["assistant"]
        assert [m["content"] for m in messages if m["role"] == "tool"] == [str(int(a) + int(b)) for a, b in calls]
        assert all(logp == 0.0 for logp, by_model in zip(logprobs, mask) if not by_model)
        assert all(logp < 0.0 for logp, by_model in zip(logprobs, mask) if by_model)
    assert called, "no episode called the tool; the embedded model calls it about three times in ten"


def test_reward_weights_make_the_total_and_one_function_can_be_chosen(calculator):
    from grpo_kit.plugins.registry import Registry

    prompts, result, _ = calculator
    scores = result.columns["verifiers_scores"]
    assert result.columns["verifiers_reward"] == [s["correct"] for s in scores]  # used_tool weighs 0
    assert [s["used_tool"] for s in scores] == [float(0 in mask) for mask in result.env_mask]
    arguments = dict(prompts=[r["prompt"] for r in prompts], completions=[""] * len(prompts), completion_ids=[])
    chosen = Registry().build("reward", "verifiers", {"function": "used_tool"})
    assert chosen(**arguments, **result.columns) == [s["used_tool"] for s in scores]
    unknown = Registry().build("reward", "verifiers", {"function": "style"})
    with pytest.raises(RewardError, match="correct, used_tool"):
        unknown(**arguments, **result.columns)


def test_a_chat_template_that_rewrites_the_past_is_refused():
    """The harness's second request: its conversation, rendered, must begin with what the model already read."""
    import asyncio

    import httpx
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_kit.embedded.sums import model_path
    from grpo_kit.plugins.registry import Registry
    from grpo_kit_verifiers.bridge import Bridge

    directory = model_path("tool_use")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = "{{ messages | length }}" + tokenizer.chat_template  # a new message changes the opening
    generation = Registry().build("generation", "transformers", {"max_completion_length": 8})
    generation.start(model, tokenizer, Accelerator(cpu=True))

    async def two_turns():
        async with Bridge(tokenizer, generation, 32, batch_wait=0.0) as bridge:
            bridge.started(1)
            user = {"role": "user", "content": "12+45="}
            async with httpx.AsyncClient(base_url=bridge.base_url, headers={"X-Session-ID": "one"}) as client:
                first = await client.post("/chat/completions", json={"model": "policy", "messages": [user]})
                reply = first.json()["choices"][0]["message"]
                second = await client.post("/chat/completions", json={"messages": [user, reply, user]})
            return first.status_code, second.status_code, bridge.failure

    try:
        first, second, failure = asyncio.run(two_turns())
    finally:
        generation.close()
    assert (first, second) == (200, 500)  # the harness sees an error; the rollout raises the bridge's failure
    assert isinstance(failure, PluginError) and "chat template writes the conversation" in str(failure)

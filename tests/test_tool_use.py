"""Multi-turn rollouts with tools (grpo_kit/rollout/tool_use.py): what the loop appends and masks, how tool failures are
reported, that tool tokens get no gradient, and runs end to end with an environment and with plain tools."""

import asyncio
import json
import time

import pytest
import torch
from accelerate import Accelerator

import grpo_kit
from grpo_kit.contract.kinds import Completions
from grpo_kit.embedded.tool_use import build_tokenizer
from grpo_kit.rollout.tool_use import ToolUse
from grpo_kit.testing import tiny_run
from grpo_kit.testing.micro_batches import objective_batch
from grpo_kit.testing.models import build_tiny_model

TOKENIZER = build_tokenizer()


class ScriptedPolicy:
    """A generation backend (kinds.py: Generation) that answers by rule on the embedded tool-use format: to a
    question it calls `add` with the question's numbers; after a result, it repeats the result; each token's
    log-prob is -0.5. Its completions are known exactly, which a sampled model's are not."""

    def __init__(self, max_completion_length: int = 128):
        self.max_completion_length = max_completion_length
        self.prompts: list[str] = []

    def generate(self, prompt_ids, with_logprobs=False):
        turns = []
        for ids in prompt_ids:
            text = TOKENIZER.decode(ids)
            self.prompts.append(text)
            if text.endswith("</result>"):
                turn = text[text.rindex("<result>") + len("<result>") : -len("</result>")] + "<eos>"
            else:
                a, b = text.split("=")[0].split("+")
                turn = f"<call>add a={a} b={b}</call><eos>"
            turns.append(TOKENIZER(turn, add_special_tokens=False).input_ids[: self.max_completion_length])
        width = max(len(turn) for turn in turns)
        ids = torch.tensor([turn + [TOKENIZER.pad_token_id] * (width - len(turn)) for turn in turns])
        mask = torch.tensor([[1] * len(turn) + [0] * (width - len(turn)) for turn in turns])
        truncated = torch.tensor([turn[-1] != TOKENIZER.eos_token_id for turn in turns])
        logps = torch.full(ids.shape, -0.5) * mask if with_logprobs else None
        return Completions(ids, mask, truncated, logps)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def broken_add(a: int, b: int) -> int:
    """Add two integers, or fail.

    Args:
        a: The first number.
        b: The second number.
    """
    raise ValueError("the calculator is broken")


def slow_add(a: int, b: int) -> int:
    """Add two integers, slowly.

    Args:
        a: The first number.
        b: The second number.
    """
    time.sleep(5)
    return a + b


async def async_add(a: int, b: int) -> int:
    """Add two integers, asynchronously.

    Args:
        a: The first number.
        b: The second number.
    """
    await asyncio.sleep(0.01)
    return a + b


def rows(*questions: str) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": question}], "solution": "0"} for question in questions]


def tool_use(tools=(), environment=None, max_completion_length=128, max_iterations=None, timeout=5.0, policy=None):
    return ToolUse(
        TOKENIZER,
        policy or ScriptedPolicy(),
        Accelerator(cpu=True),
        list(tools),
        environment,
        max_completion_length,
        max_iterations,
        timeout,
        [TOKENIZER.eos_token_id],
    )


def tokens(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False).input_ids


def named(function, name):
    function.__name__ = name
    return function


def test_the_tool_result_is_appended_and_masked_and_the_model_answers_after_it():
    turns = tool_use([add])(rows("12+30="), with_logprobs=True)
    call, result, answer = "<call>add a=12 b=30</call><eos>", "<result>42</result>", "42<eos>"
    generated = turns.generated
    length = int(generated.completion_mask.sum())
    assert generated.completion_ids[0, :length].tolist() == tokens(call + result + answer)
    expected_mask = [1] * len(tokens(call)) + [0] * len(tokens(result)) + [1] * len(tokens(answer))
    assert generated.tool_mask[0, :length].tolist() == expected_mask
    # The sampler's log-probs stay aligned with the tokens: its own where it sampled, 0 where the tool wrote.
    assert generated.sampling_per_token_logps[0, :length].tolist() == [-0.5 if m else 0.0 for m in expected_mask]
    assert turns.completions[0] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 12, "b": 30}}}],
        },
        {"role": "tool", "name": "add", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    assert generated.tool_calls.tolist() == [1] and generated.tool_failures.tolist() == [0]
    assert not generated.is_truncated[0]


@pytest.mark.parametrize(
    "tool, message",
    [
        (named(broken_add, "add"), "Error: ValueError: the calculator is broken"),
        (named(slow_add, "add"), "Error: the tool did not answer within 0.2 s"),
    ],
)
def test_a_tool_that_raises_or_times_out_is_reported_and_the_rollout_goes_on(tool, message):
    start = time.perf_counter()
    turns = tool_use([tool], timeout=0.2, max_completion_length=128)(rows("1+2=", "3+4="), with_logprobs=False)
    assert time.perf_counter() - start < 3, "a slow tool held the rollout up past its timeout"
    for completion in turns.completions:
        assert completion[1] == {"role": "tool", "name": "add", "content": message}
        assert completion[2]["role"] == "assistant"  # the model answered after the error
    assert turns.generated.tool_failures.tolist() == [1, 1]


def test_async_tools_are_awaited():
    turns = tool_use([named(async_add, "add")])(rows("5+6="), with_logprobs=False)
    assert turns.completions[0][1]["content"] == "11"


def test_a_call_to_an_unknown_tool_is_a_failure_the_model_sees():
    def subtract(a: int, b: int) -> int:
        """Subtract.

        Args:
            a: The first number.
            b: The second number.
        """
        return a - b

    turns = tool_use([subtract], max_completion_length=128)(rows("5+6="), with_logprobs=False)
    assert turns.completions[0][1]["content"] == "Error: LookupError: there is no tool named 'add' (tools: subtract)"
    assert turns.generated.tool_failures.tolist() == [1]


def test_max_tool_calling_iterations_zero_runs_no_tool():
    turns = tool_use([add], max_iterations=0)(rows("5+6="), with_logprobs=False)
    assert len(turns.completions[0]) == 1 and turns.generated.tool_calls.tolist() == [0]
    assert turns.generated.tool_mask.all()


def test_a_tool_result_that_leaves_no_room_to_answer_is_not_appended():
    call = "<call>add a=12 b=30</call><eos>"
    turns = tool_use([add], max_completion_length=len(tokens(call)) + 3)(rows("12+30="), with_logprobs=False)
    assert turns.generated.completion_ids[0].tolist() == tokens(call)
    assert [message["role"] for message in turns.completions[0]] == ["assistant"]


class CountingEnvironment:
    """Counts the calls since its last reset, and greets each episode with the row's `greeting`."""

    built = 0

    def __init__(self):
        CountingEnvironment.built += 1
        self.calls, self.episode = 0, None

    def reset(self, **row):
        self.calls, self.episode = 0, row["prompt"][0]["content"]
        return row["greeting"]

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls += 1
        return f"{a + b} (call {self.calls} of episode {self.episode})"


def test_each_completion_has_its_own_environment_reset_before_every_generation():
    CountingEnvironment.built = 0
    policy = ScriptedPolicy()
    loop = tool_use(environment=CountingEnvironment, policy=policy)
    for batch in (["1+2=", "3+4="], ["5+6=", "7+8="]):
        data = [row | {"greeting": f"hi{index}"} for index, row in enumerate(rows(*batch))]
        turns = loop(data, with_logprobs=False)
        for question, completion in zip(batch, turns.completions):
            a, b = question[:-1].split("+")
            assert completion[1]["content"] == f"{int(a) + int(b)} (call 1 of episode {question})"
    assert CountingEnvironment.built == 2  # one per completion, kept across batches
    assert policy.prompts[-4].startswith("5+6=hi0") and policy.prompts[-3].startswith("7+8=hi1")  # the observation


def test_tool_result_tokens_get_no_gradient():
    """Whatever the log-probs at the tool's tokens, the loss and the gradient of every other token are the same,
    and the tool tokens' gradient is zero; the token count that normalises the loss leaves them out."""
    generator = torch.Generator().manual_seed(0)
    completion_mask = torch.ones(4, 6)
    completion_mask[3, 4:] = 0
    tool_mask = torch.tensor([[1, 1, 0, 0, 1, 1]] * 4)
    tool = (tool_mask == 0) & (completion_mask == 1)
    base = -torch.rand(4, 6, generator=generator)
    old = -torch.rand(4, 6, generator=generator)
    for loss in ["grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo"]:
        objective = grpo_kit.build_objective(grpo_kit.compose([f"+loss={loss}", "algorithm.beta=0.04"]))
        results = []
        for perturbation in (0.0, 3.0):
            batch = objective_batch(
                completion_mask,
                torch.tensor([1.0, -0.5, 0.3, -1.2]),
                tool_mask=tool_mask,
                old_per_token_logps=old + perturbation * tool,
                ref_per_token_logps=old - perturbation * tool,
            )
            logps = (base + perturbation * tool).requires_grad_()
            out = objective(logps, torch.zeros(4, 6), batch)
            out.loss.backward()
            results.append((out.loss.detach(), logps.grad))
        (loss_a, grad_a), (loss_b, grad_b) = results
        torch.testing.assert_close(loss_a, loss_b, msg=f"{loss}: the tool tokens' log-probs changed the loss")
        torch.testing.assert_close(grad_a, grad_b, msg=f"{loss}: the tool tokens' log-probs changed the gradient")
        assert (grad_a[tool] == 0).all(), f"{loss}: tool tokens got a gradient"
        assert (grad_a[~tool & (completion_mask == 1)] != 0).any(), f"{loss}: no gradient at all"


QWEN_LIKE_TEMPLATE = (  # tool calls as JSON between tags, a chat format many tool-calling models use
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}<u>{{ message.content }}</u>"
    "{%- elif message.role == 'assistant' -%}<a>{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] -%}<t>{{ call.function | tojson }}</t>{%- endfor -%}<eos>"
    "{%- elif message.role == 'tool' -%}<r>{{ message.content }}</r>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<a>{%- endif -%}"
)
QWEN_LIKE_RESPONSE = {
    "start_anchor": "<a>",
    "defaults": {"role": "assistant"},
    "fields": {
        "tool_calls": {
            "open": "<t>",
            "close": "</t>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<eos>|$", "content": "text"},
    },
}


@pytest.fixture(scope="module")
def tool_template_model(tmp_path_factory):
    """A tiny random model whose tokenizer has a JSON tool-calling chat template and response template."""
    directory = build_tiny_model(
        tmp_path_factory.mktemp("tool-template-model"), chat_template=QWEN_LIKE_TEMPLATE, tokenizer=build_tokenizer()
    )
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["response_template"] = QWEN_LIKE_RESPONSE
    config_file.write_text(json.dumps(config))
    return directory


def test_a_chat_dataset_with_a_tool_calling_template_trains_with_plain_tools(tool_template_model, tmp_path, registry):
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows("1+2=", "3+4=", "5+6=", "7+8=")))
    cfg = grpo_kit.compose(
        tiny_run(
            tool_template_model,
            f"data.path={data}",
            "tools=[tests.test_tool_use:add]",
            "+reward=accuracy",
            "trainer.max_steps=2",
            "generation.max_completion_length=12",
            "generation.temperature=3.0",
        ),
        registry,
    )
    grpo_kit.train(cfg, tmp_path / "run", registry)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("tools/call_frequency" in line for line in metrics if "reward" in line)


def test_the_tool_calling_template_round_trips_a_call_through_the_loop(tool_template_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tool_template_model)
    call = '<t>{"name":"add","arguments":{"a":2,"b":5}}</t><eos>'

    class Caller(ScriptedPolicy):
        def generate(self, prompt_ids, with_logprobs=False):
            text = [tokenizer.decode(ids) for ids in prompt_ids]
            turns = [
                tokenizer(call if t.endswith("<u>2+5=</u><a>") else "7<eos>", add_special_tokens=False).input_ids
                for t in text
            ]
            width = max(map(len, turns))
            ids = torch.tensor([t + [0] * (width - len(t)) for t in turns])
            mask = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in turns])
            return Completions(ids, mask, torch.zeros(len(turns), dtype=torch.bool))

    loop = ToolUse(tokenizer, Caller(), Accelerator(cpu=True), [add], None, 64, None, 5.0, [tokenizer.eos_token_id])
    turns = loop(rows("2+5="), with_logprobs=False)
    written = tokenizer.decode(turns.generated.completion_ids[0, : int(turns.generated.completion_mask.sum())])
    assert written == call + "<r>7</r><a>7<eos>"
    assert [m["role"] for m in turns.completions[0]] == ["assistant", "tool", "assistant"]


@pytest.mark.slow
def test_the_calculator_command_learns_to_call_the_tool(tmp_path):
    """The issue's acceptance command, as a user types it (plus a run directory)."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+loss=dapo",
            "+reward=accuracy",
            "+environment=calculator",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - start
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in lines if "reward" in line]
    tenth = max(1, len(lines) // 10)

    def mean(key, part):
        return sum(line[key] for line in part) / len(part)

    first, last = lines[:tenth], lines[-tenth:]
    print(
        f"{seconds:.0f} s; reward {mean('reward', first):.3f} -> {mean('reward', last):.3f}; calls per completion "
        f"{mean('tools/call_frequency', first):.3f} -> {mean('tools/call_frequency', last):.3f}"
    )
    assert mean("reward", last) >= mean("reward", first) + 0.3
    assert mean("tools/call_frequency", last) > mean("tools/call_frequency", first)


ECHO_ROLLOUT = """
    import grpo_kit
    from grpo_kit.contract.kinds import RolloutResult

    class FeedbackRollout:
        '''Samples through the run's backend, then appends environment feedback ("!") that the model did not write.'''

        def __init__(self, config):
            pass

        def __call__(self, rows, tokenizer, generation):
            prompt_ids = tokenizer([row["prompt"] for row in rows], add_special_tokens=False).input_ids
            out = generation.generate(prompt_ids, with_logprobs=True)
            lengths = out.completion_mask.sum(dim=1).tolist()
            feedback = tokenizer("*", add_special_tokens=False).input_ids
            completion_ids, logprobs, env_mask = [], [], []
            for ids, logps, length in zip(out.completion_ids.tolist(), out.sampling_per_token_logps.tolist(), lengths):
                completion_ids.append(ids[:length] + feedback)
                logprobs.append(logps[:length] + [0.0] * len(feedback))
                env_mask.append([1] * length + [0] * len(feedback))
            return RolloutResult(prompt_ids, completion_ids, logprobs, env_mask, columns={"seen": [1] * len(rows)})

    def seen(prompts, completions, completion_ids, seen, **columns):
        return [float(s) for s in seen]

    @grpo_kit.hookimpl
    def register_rollouts(register):
        register("feedback", FeedbackRollout)

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("seen", seen)
"""


def test_a_rollout_plugin_generates_and_its_environment_tokens_are_masked(local_plugin, tiny_model, tmp_path):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    registry = Registry(plugin_manager(local_modules=[local_plugin("feedback_rollout", ECHO_ROLLOUT)]))
    cfg = grpo_kit.compose(
        tiny_run(tiny_model, "+rollout=feedback", "+reward=seen", "trainer.max_steps=2", "trainer.sample_every=1"),
        registry,
    )
    grpo_kit.train(cfg, tmp_path, registry)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples and all(sample["completion"].endswith("*") for sample in samples)  # what the rewards read
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(line["rewards/seen/mean"] == 1.0 for line in metrics if "reward" in line)  # the extra column arrived


def test_a_rollout_plugin_cannot_be_combined_with_tools(local_plugin, tiny_model, tmp_path):
    from grpo_kit.contract.errors import ConfigError
    from grpo_kit.plugins.registry import Registry, plugin_manager

    registry = Registry(plugin_manager(local_modules=[local_plugin("feedback_rollout", ECHO_ROLLOUT)]))
    cfg = grpo_kit.compose(
        tiny_run(tiny_model, "+rollout=feedback", "+reward=seen", "tools=[tests.test_tool_use:add]"), registry
    )
    with pytest.raises(ConfigError, match=r"\+rollout=feedback generates by itself"):
        grpo_kit.train(cfg, tmp_path, registry)

"""The embedded tool-use task: 2-digit sums as chat messages, and a tokenizer whose chat template can call tools.

The tiny model cannot add 2-digit numbers reliably, but it can call the calculator environment's `add` tool
(plugins/grpo_kit_environments) and copy the result. Its pretraining teaches the format with a noisy choice of when
to call: it calls `add` three times in ten, and guesses otherwise. Reinforcement learning then has to discover that
calling pays, which `tools/call_frequency` shows rising (`python -m grpo_kit +environment=calculator`).

The conversation, as the chat template writes it (one token per character, and one per special token):

    12+45=<call>add a=12 b=45</call><eos><result>57</result>57<eos>
    ^ user   ^ assistant: a tool call       ^ tool   ^ assistant: the answer
"""

import random
import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpo_kit.embedded.rows import drawn_rows, each_row

PAD, EOS = "<pad>", "<eos>"
CALL, END_CALL, RESULT, END_RESULT = "<call>", "</call>", "<result>", "</result>"
CHARACTERS = "".join(sorted(set(string.printable) - set(string.whitespace) | {" "}))
OPERANDS = range(10, 100)
TASK_SEED, EVAL_SEED = 1234, 4321
NUM_HELD_OUT = 100  # sums neither pretraining nor training ever sees: the eval set
EVERY_SUM = [(a, b) for a in OPERANDS for b in OPERANDS]
HELD_OUT_SUMS = sorted(random.Random(EVAL_SEED).sample(EVERY_SUM, NUM_HELD_OUT))
TRAINING_SUMS = sorted(set(EVERY_SUM) - set(HELD_OUT_SUMS))  # what pretraining and training draw from
CALL_RATE = 0.3  # how often the pretrained model calls the tool; otherwise it guesses
DRILL_RATE = 0.5  # pretraining conversations that teach how to call and copy, but not when to call
RIGHT_GUESS_RATE = 0.25  # how often a guess is the right sum; otherwise a wrong sum nearby
# At grpo_kit.embedded.sums's learning rate, falling to zero. 1500 steps, because with 1000 the model copied too few
# tool results for the calculator run to learn (docs/agents.md).
PRETRAIN_STEPS, PRETRAIN_BATCH = 1500, 64

# Jinja, as transformers renders chat templates. Tool schemas (`tools`) are not rendered: the tiny model learns
# its one tool in pretraining instead of reading a description it could not understand.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}{{ message.content }}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "<call>{{ call.function.name }}"
    "{%- for key, value in call.function.arguments.items() %} {{ key }}={{ value }}{%- endfor -%}"
    "</call>"
    "{%- endfor -%}"
    "{{ message.content or '' }}<eos>"
    "{%- elif message.role == 'tool' -%}<result>{{ message.content }}</result>"
    "{%- endif -%}"
    "{%- endfor -%}"
)

# transformers' response template (`tokenizer.parse_response`): how an assistant turn is read back into a message.
# The assistant turn starts where the prompt ends (`\Z`); `<call>NAME k=v k=v</call>` is a tool call whose arguments
# are cast to the tool's parameter types; the rest, up to EOS, is the content.
RESPONSE_TEMPLATE = {
    "start_anchor_pattern": r"\Z",
    "defaults": {"role": "assistant"},
    "fields": {
        "tool_calls": {
            "open_pattern": r"<call>(?P<name>\w+)",
            "close": END_CALL,
            "repeats": True,
            "content": "kv-lines",
            "content_args": {"line_sep": " ", "kv_sep": "="},
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<eos>|$", "content": "text"},
    },
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    special = [PAD, EOS, CALL, END_CALL, RESULT, END_RESULT]
    vocab = {token: index for index, token in enumerate([*special, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tokenizer.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, additional_special_tokens=special[2:]
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def build_task(num_examples: int, seed: int = TASK_SEED) -> list[dict]:
    """Rows with a chat `prompt` ([{"role": "user", "content": "12+45="}]) and the `solution` ("57")."""
    return drawn_rows(TRAINING_SUMS, num_examples, seed, chat=True)


def held_out_problems() -> list[dict]:
    """Each held-out sum once: the eval set."""
    return each_row(HELD_OUT_SUMS, chat=True)


def training_problems() -> list[dict]:
    """The first 100 training problems (there are too many sums to score each)."""
    return build_task(100)


def noisy_conversation(rng: random.Random) -> tuple[list[dict], bool]:
    """A pretraining conversation, and whether it teaches when to call: a call to `add` with its result copied
    into the answer, or a guess, often wrong. Half the conversations are calls that teach only how to call and
    copy (their first reply token is not trained on), so that the skill is learnt without calling more often."""
    a, b = rng.choice(TRAINING_SUMS)
    question = {"role": "user", "content": f"{a}+{b}="}
    drill = rng.random() < DRILL_RATE
    if drill or rng.random() < CALL_RATE:
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
        return [
            question,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "add", "content": str(a + b)},
            {"role": "assistant", "content": str(a + b)},
        ], not drill
    guess = a + b if rng.random() < RIGHT_GUESS_RATE else a + b + rng.choice([-10, -2, -1, 1, 2, 10])
    return [question, {"role": "assistant", "content": str(guess)}], True

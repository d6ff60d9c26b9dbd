"""The test server's request rules (grpo_kit_vllm.testing.protocol) hold without a model and without torch.

test_test_server.py checks the same rules through a running server; here they are checked on their own, which is
what keeps them apart from the engine: vLLM's list answered by what is known of a model, in a process that has not
loaded torch.
"""

import json
import subprocess
import sys
import textwrap
from http import HTTPStatus

import pytest

from grpo_kit_vllm.testing import protocol
from grpo_kit_vllm.testing.vllm_rules import VLLM_RULES

HEAVY = ("torch", "transformers", "numpy", "PIL")
PROMPTS = [[3, 12, 4, 15], [5, 6, 12, 7, 15]]  # as test_test_server.py's
# The tiny model test_test_server.py serves, as far as the rules read it.
TINY = protocol.ServedModel(
    name="tiny", max_model_len=128, vocab_size=32, sampling_defaults={}, extra_eos_ids=frozenset(), image_token=None
)


def fake_tokenizer(text: str, add_special_tokens: bool) -> dict:
    """One token per character: enough for the rules, which read token ids."""
    return {"input_ids": [ord(character) % TINY.vocab_size for character in text]}


@pytest.mark.parametrize("module", ["protocol", "responses"])
def test_the_rules_and_answers_load_nothing_heavy(module):
    """As tests/test_imports.py checks the CLI: a fresh interpreter imports the module and lists what came with it."""
    code = f"""
        import json, sys
        import grpo_kit_vllm.testing.{module}
        print("HEAVY=" + json.dumps([name for name in {HEAVY!r} if name in sys.modules]))
    """
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "HEAVY=[]"


@pytest.mark.parametrize("rule", VLLM_RULES.values(), ids=VLLM_RULES.keys())
def test_the_rules_refuse_what_vllm_refuses_with_its_message(rule):
    with pytest.raises(protocol.RequestError) as refused:
        protocol.parse_completion({"prompt": PROMPTS, "max_tokens": 2} | rule.body, TINY, fake_tokenizer)
    assert refused.value.status == rule.status, rule.source
    assert refused.value.message.startswith(rule.message), (rule.source, refused.value.message)


def test_the_rules_accept_what_vllm_accepts():
    request = protocol.parse_completion({"prompt": "1+2=", "temperature": 0.005, "unknown": 1}, TINY, fake_tokenizer)
    assert request.prompts == [fake_tokenizer("1+2=", True)["input_ids"]]
    assert (request.temperature, request.max_tokens, request.n) == (protocol.MIN_TEMPERATURE, 16, 1)


def test_structured_outputs_take_one_regex_and_refuse_what_this_server_cannot_honour():
    def parse(structured):
        return protocol.parse_completion({"prompt": PROMPTS, "structured_outputs": structured}, TINY, fake_tokenizer)

    assert parse({"regex": "[0-9]+"}).regex == "[0-9]+"
    assert parse(None).regex is None
    for structured, message in (
        ({"choice": ["1", "2"]}, "other than one `regex` is not supported"),
        ({"regex": "[0-9]+", "json": {}}, "other than one `regex` is not supported"),
        ({"regex": "[0-9"}, "Invalid regex in structured_outputs"),
    ):
        with pytest.raises(protocol.RequestError, match=message) as refused:
            parse(structured)
        assert refused.value.status == HTTPStatus.BAD_REQUEST and refused.value.param == "structured_outputs"


def test_an_error_has_vllms_shape():
    error = protocol.RequestError("Generation is paused.", HTTPStatus.SERVICE_UNAVAILABLE)
    assert json.loads(json.dumps(error.body())) == {
        "error": {"message": "Generation is paused.", "type": "ServiceUnavailableError", "param": None, "code": 503}
    }

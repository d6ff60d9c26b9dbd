"""The judge reward asks the CPU vLLM test server (`python -m grpo_kit_vllm.testing.server`) through both of its
routes, as it asks `vllm serve`: the request is one vLLM accepts, and the answer is read where vLLM puts it."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing.models import build_tiny_model

CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("judge-model"), chat_template=CHAT_TEMPLATE)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("judge-server") / "server.log"
    with open(log, "wb") as output:
        command = [sys.executable, "-m", "grpo_kit_vllm.testing.server", str(model_dir), "--port", str(port)]
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            assert process.poll() is None, f"the test server exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the test server did not answer /health within 120 s"
            time.sleep(0.2)
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_judge_reads_the_test_servers_answers(server_url, api):
    with urllib.request.urlopen(f"{server_url}/v1/models", timeout=10) as response:
        model = json.loads(response.read())["data"][0]["id"]
    options = {"base_url": server_url, "model": model, "api": api, "template": "{prompt}{completion}"}
    options |= {"score_pattern": r"(\d)", "score_max": 9, "max_tokens": 8, "retries": 0}
    judge = Registry(plugin_manager()).build("reward", "judge", options)
    assert isinstance(judge.answer("1+2=3"), str)  # a random tiny model: what it says is noise, but it answers
    scores = judge(["1+2="] * 4, ["3"] * 4, [[1]] * 4)
    assert all(0.0 <= score <= 1.0 for score in scores)

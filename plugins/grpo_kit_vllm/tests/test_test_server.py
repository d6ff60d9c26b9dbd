"""The CPU test server (grpo_kit_vllm.testing.server) answers as vLLM 0.33 does, in a child process on a tiny model.

The test process plays the client over HTTP and, for weight syncs, the trainer: rank 0 of a gloo group.
"""

import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit.testing.models import build_tiny_model
from grpo_kit_vllm import transport
from grpo_kit_vllm.alongside import Background
from grpo_kit_vllm.testing.http import call, free_port
from grpo_kit_vllm.testing.vllm_rules import VLLM_RULES

PROMPTS = [[3, 12, 4, 15], [5, 6, 12, 7, 15]]  # "1+2=" and "34+5=" in the embedded tokenizer: different lengths
SMALL_BUFFER = 4096  # bytes: the tiny model's weights then travel in several packed chunks


def complete(url: str, **fields) -> dict:
    status, answer = call(url, "/v1/completions", fields)
    assert status == 200, answer
    return answer


class ServerProcess:
    """`python -m grpo_kit_vllm.testing.server MODEL --port PORT`, as a user or a run starts it."""

    def __init__(self, model_dir: Path, log: Path):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        with open(log, "wb") as output:
            port = self.url.rsplit(":", 1)[1]
            command = [sys.executable, "-m", "grpo_kit_vllm.testing.server", str(model_dir), "--port", port]
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not self.healthy():
            assert self.process.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no answer on /health within 120 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200 and response.read() == b""
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        returncode = self.process.wait(timeout=30)
        assert returncode == 0, f"SIGTERM should end the server cleanly:\n{self.log.read_text()[-3000:]}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("test-server-model"))


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def eos(model_dir) -> int:
    return AutoTokenizer.from_pretrained(model_dir).eos_token_id


@pytest.fixture(scope="module")
def url(model_dir, tmp_path_factory):
    """A server whose weights stay those of `model_dir`."""
    server = ServerProcess(model_dir, tmp_path_factory.mktemp("server") / "server.log")
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def sync_url(model_dir, tmp_path_factory):
    """A server that the weight-sync tests send other weights."""
    server = ServerProcess(model_dir, tmp_path_factory.mktemp("sync-server") / "server.log")
    yield server.url
    server.stop()


def test_models_and_world_size(url, model_dir):
    status, models = call(url, "/v1/models")
    assert status == 200 and isinstance(models["data"][0].pop("created"), int)
    assert models == {
        "object": "list",
        "data": [
            {
                "id": str(model_dir),  # the path the server was given, as vllm serve names a model
                "object": "model",
                "owned_by": "vllm",
                "root": str(model_dir),
                "parent": None,
                "max_model_len": 128,  # the tiny model's max_position_embeddings
                "permission": [],
            }
        ],
    }
    assert call(url, "/get_world_size") == (200, {"world_size": 1})
    assert call(url, "/is_paused") == (200, {"is_paused": False})
    assert call(url, "/weight_info") == (200, {"weight_version": "default"})  # vLLM's label before any update


def test_completions_come_in_vllms_shape_ordered_by_prompt_then_sample(url, model_dir):
    answer = complete(url, model=str(model_dir), prompt=PROMPTS, n=3, max_tokens=4, return_token_ids=True)

    assert answer["id"].startswith("cmpl-") and answer["object"] == "text_completion"
    assert answer["model"] == str(model_dir) and isinstance(answer["created"], int)
    choices = answer["choices"]
    assert [choice["index"] for choice in choices] == list(range(6))
    assert [choice["prompt_token_ids"] for choice in choices] == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    for choice in choices:
        assert set(choice) >= {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids"}
        assert choice["logprobs"] is None and 1 <= len(choice["token_ids"]) <= 4
    completion_tokens = sum(len(choice["token_ids"]) for choice in choices)
    prompt_tokens = len(PROMPTS[0]) + len(PROMPTS[1])  # each prompt once, whatever n
    assert answer["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def test_eos_ends_a_completion_and_is_kept_while_max_tokens_cuts_the_others(url, eos):
    choices = complete(url, prompt=PROMPTS[0], n=16, max_tokens=8, seed=0, return_token_ids=True)["choices"]

    finish_reasons = {choice["finish_reason"] for choice in choices}
    assert finish_reasons == {"stop", "length"}, "a random model samples EOS within 8 tokens about half the time"
    for choice in choices:
        ids = choice["token_ids"]
        assert eos not in ids[:-1] and choice["stop_reason"] is None
        if choice["finish_reason"] == "stop":
            assert ids[-1] == eos and len(ids) <= 8
        else:
            assert ids[-1] != eos and len(ids) == 8


def test_a_seed_repeats_a_request(url):
    request = {"prompt": PROMPTS, "n": 4, "max_tokens": 8, "seed": 7, "return_token_ids": True}
    first, second = (complete(url, **request)["choices"] for _ in range(2))
    assert [choice["token_ids"] for choice in first] == [choice["token_ids"] for choice in second]


def test_stop_token_ids_end_a_completion_with_that_token_as_stop_reason(url):
    stop = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # the digits: nearly every completion meets one early
    answer = complete(url, prompt=PROMPTS[1], n=8, max_tokens=20, seed=0, stop_token_ids=stop, return_token_ids=True)
    stopped = [choice for choice in answer["choices"] if choice["stop_reason"] is not None]
    assert stopped
    for choice in stopped:
        assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == choice["stop_reason"] in stop


def test_log_probs_are_the_sampled_tokens_one_each(url):
    choices = complete(url, prompt=PROMPTS, n=4, max_tokens=6, logprobs=0, return_token_ids=True)["choices"]

    for choice in choices:
        ids, logprobs = choice["token_ids"], choice["logprobs"]
        values = logprobs["token_logprobs"]
        assert len(values) == len(ids) == len(logprobs["tokens"]) == len(logprobs["top_logprobs"])
        assert all(math.isfinite(value) and value <= 0 for value in values)
        # logprobs=0: each position lists the sampled token alone
        assert [list(top.values()) for top in logprobs["top_logprobs"]] == [[value] for value in values]
        assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(logprobs["text_offset"])


def test_log_probs_are_of_the_distribution_sampled_from(url):
    """vLLM's processed_logprobs: after top-k, so with top_k=1 every sampled token had all the probability."""
    answer = complete(url, prompt=PROMPTS, n=2, max_tokens=5, top_k=1, logprobs=2, return_tokens_as_token_ids=True)

    for choice in answer["choices"]:
        logprobs = choice["logprobs"]
        assert logprobs["token_logprobs"] == [0.0] * len(logprobs["tokens"])
        assert all(token.startswith("token_id:") for token in logprobs["tokens"])
        # the sampled token first, then the top 2: one of which it is, the other filtered out (vLLM's -9999 for -inf)
        assert [list(top.values()) for top in logprobs["top_logprobs"]] == [[0.0, -9999.0]] * len(logprobs["tokens"])


@torch.no_grad()
def test_prompt_log_probs_are_the_models_own_scores_of_each_prompt_token(url, model):
    answer = complete(url, prompt=PROMPTS, n=2, max_tokens=1, prompt_logprobs=1)
    for index, choice in enumerate(answer["choices"]):
        prompt = PROMPTS[index // 2]
        entries = choice["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(prompt)
        expected = model(torch.tensor([prompt])).logits[0, :-1].log_softmax(-1)  # (T-1, V)
        for position, (entry, token) in enumerate(zip(entries[1:], prompt[1:])):
            own = entry[str(token)]  # keyed by the token id, as vLLM keys them
            assert abs(own["logprob"] - expected[position, token].item()) < 1e-5
            assert own["rank"] == int((expected[position] > expected[position, token]).sum()) + 1
            assert own["decoded_token"] and len(entry) <= 2 and min(item["rank"] for item in entry.values()) == 1


def test_the_tokens_route_ranks_each_token_and_spans_its_weight_version(url, model_dir):
    body = {"model": str(model_dir), "token_ids": PROMPTS[0], "sampling_params": {"max_tokens": 4, "logprobs": 2}}
    status, answer = call(url, "/inference/v1/generate", body)
    assert status == 200, answer
    (choice,) = answer["choices"]
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": len(choice["token_ids"])}]
    for entry in choice["logprobs"]["content"]:
        ranks = {item["token_id"]: item["rank"] for item in entry["top_logprobs"]}
        assert entry["rank"] >= 1 and ranks[entry["token_id"]] == entry["rank"] and 1 in ranks.values()


def test_top_k_1_and_temperature_0_decode_as_the_model_does_greedily(url, model, eos):
    expected = []
    for prompt in PROMPTS:  # one at a time: the server's left padding must not change the result
        ids = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=10, pad_token_id=0, eos_token_id=eos
        )
        completion = ids[0, len(prompt) :].tolist()
        expected.append(completion[: completion.index(eos) + 1] if eos in completion else completion)

    top_k_1 = complete(url, prompt=PROMPTS, n=2, max_tokens=10, return_token_ids=True, top_k=1)["choices"]
    assert [choice["token_ids"] for choice in top_k_1] == [expected[0]] * 2 + [expected[1]] * 2
    greedy = complete(url, prompt=PROMPTS, max_tokens=10, return_token_ids=True, temperature=0)["choices"]  # n=1
    assert [choice["token_ids"] for choice in greedy] == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": [[3] * 129]}, "input_tokens"),  # longer than max_position_embeddings=128
        ({"prompt": PROMPTS, "max_tokens": 500}, "max_tokens"),
        ({"prompt": [[3, 99]]}, "prompt"),  # no such token
        ({"prompt": []}, "prompt"),
        ({"prompt": PROMPTS, "stream": True}, "stream"),
        ({"prompt": PROMPTS, "stop": ["="]}, "stop"),  # vLLM has it; this server refuses rather than ignores it
        ({"prompt": PROMPTS, "top_p": 0}, "top_p"),
    ],
)
def test_bad_requests_get_a_400_in_vllms_error_shape(url, body, param):
    status, answer = call(url, "/v1/completions", body)
    assert status == 400 and set(answer) == {"error"}
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", param, 400)


@pytest.mark.parametrize("rule", VLLM_RULES.values(), ids=VLLM_RULES.keys())
def test_the_server_refuses_what_vllm_refuses_with_its_message(url, rule):
    status, answer = call(url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2} | rule.body)
    assert status == rule.status, (rule.source, answer)
    assert answer["error"]["message"].startswith(rule.message), (rule.source, answer["error"]["message"])


def test_the_server_accepts_what_vllm_accepts(url):
    """Fields vLLM does not know are ignored (OpenAIBaseModel: extra="allow"); a temperature between 0 and 0.01 is
    raised to 0.01 (SamplingParams.__post_init__), not refused; the prompt limit holds for lists of prompts only."""
    complete(url, prompt=PROMPTS, max_tokens=1, some_field_vllm_does_not_know=1, temperature=0.005)
    complete(url, prompt=[[3]] * 1024, max_tokens=1)
    complete(url, prompt=[3] * 100, max_tokens=1)  # one prompt of 100 token ids, not 100 prompts


def test_server_info_says_what_a_trainer_needs_before_the_rendezvous(url):
    status, answer = call(url, "/server_info?config_format=json")
    assert status == 200 and answer["vllm_config"]["weight_transfer_config"] == {"backend": "gloo"}
    assert answer["vllm_env"]["VLLM_MAX_COMPLETION_PROMPTS"] == 1024
    assert isinstance(call(url, "/server_info")[1]["vllm_config"], str)  # vLLM's default format is text


def test_unknown_routes_and_models_get_a_404(url):
    assert call(url, "/v1/embeddings", {}) == (
        404,
        {"error": {"message": "Not Found", "type": "NotFoundError", "param": None, "code": 404}},
    )
    status, answer = call(url, "/v1/completions", {"prompt": PROMPTS, "model": "other"})
    assert status == 404 and answer["error"]["type"] == "NotFoundError" and "`other`" in answer["error"]["message"]


def test_paused_it_refuses_completions_until_resumed_or_holds_them_in_keep_mode(url):
    try:
        assert call(url, "/pause", {}) == (200, {"status": "paused"})  # mode abort, vLLM's default
        assert call(url, "/is_paused") == (200, {"is_paused": True})
        status, answer = call(url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2})
        assert status == 503 and answer["error"]["type"] == "ServiceUnavailableError"
        assert call(url, "/resume", {}) == (200, {"status": "resumed"})
        complete(url, prompt=PROMPTS, max_tokens=2)

        assert call(url, "/pause?mode=keep", {}) == (200, {"status": "paused"})
        # No `with` around the pool: on a failure below, nothing may wait for the held request before `finally`.
        held = ThreadPoolExecutor(1).submit(call, url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2})
        time.sleep(0.5)
        assert not held.done(), "in keep mode a completion waits for /resume"
        call(url, "/resume", {})
        assert held.result(timeout=60)[0] == 200
    finally:
        call(url, "/resume", {})


def test_weight_routes_refuse_nccl_and_updates_out_of_order(url):
    nccl = {"nccl_unique_id_b64": "AAAA", "rank_offset": 1, "world_size": 2, "packed": True}
    status, answer = call(url, "/init_weight_transfer_engine", {"init_info": nccl})
    assert status == 400 and "generation.weight_transport=gloo" in answer["error"]["message"]
    assert call(url, "/start_weight_update", {})[0] == 500  # no trainer has joined: vLLM's worker raises
    assert call(url, "/update_weights", {"update_info": {"names": [], "dtype_names": [], "shapes": []}})[0] == 500
    assert call(url, "/finish_weight_update", {"weight_version": "1"})[0] == 500


class Trainer:
    """The test process as the trainer: rank 0 of the weight-transfer group, driving syncs as the client does."""

    def __init__(self, url: str, packed: bool = True):
        self.url, self.packed = url, packed
        port = free_port()
        init_info = {
            "master_address": "127.0.0.1",
            "master_port": port,
            "rank_offset": 1,
            "world_size": 2,
            "packed": packed,
            "packed_buffer_size_bytes": SMALL_BUFFER,
            "packed_num_buffers": 2,
        }
        with ThreadPoolExecutor(1) as pool:  # the server answers once both ends have joined
            answer = pool.submit(call, url, "/init_weight_transfer_engine", {"init_info": init_info})
            self.group = transport.GlooGroup("127.0.0.1", port, rank=0, world_size=2, timeout=60)
            assert answer.result() == (200, {"message": "Weight transfer initialized"})

    def sync(self, named: list[tuple[str, torch.Tensor]], version: str, announce: bool = True) -> tuple[int, dict]:
        """One round: pause, start, update while broadcasting, finish, resume. The answer to /update_weights.

        The broadcast runs in the background: a server that refuses the round receives none of it."""
        metas = [transport.TensorMeta.of(name, tensor) for name, tensor in named] if announce else []
        tensors = [tensor.contiguous() for _, tensor in named]
        assert call(self.url, "/pause?mode=wait", {}) == (200, {"status": "paused"})
        assert call(self.url, "/start_weight_update", {}) == (200, {"message": "Weight update started"})
        if self.packed:
            sending = Background(lambda: transport.send(self.group, tensors, "cpu", SMALL_BUFFER))
        else:
            sending = Background(lambda: [self.group.broadcast(tensor) for tensor in tensors])
        answer = call(self.url, "/update_weights", {"update_info": transport.update_info(metas)})
        if answer[0] == 200:
            assert sending.done.wait(60) and sending.error is None, sending.error
            assert call(self.url, "/finish_weight_update", {"weight_version": version}) == (
                200,
                {"message": "Weight update finished"},
            )
        assert call(self.url, "/resume", {}) == (200, {"status": "resumed"})
        return answer

    def close(self) -> None:
        assert call(self.url, "/shutdown_weight_transfer_engine", {}) == (200, {"message": "Weight transfer shut down"})
        self.group.close()


def perturbed(model_dir: Path, seed: int):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator))
    return model


def server_checksums(url: str) -> dict[str, str]:
    status, answer = call(url, "/weight_checker", {"action": "checksum"})
    assert status == 200, answer
    return answer["checksums"]


def test_weight_syncs_land_packed_and_reuse_the_last_metadata(sync_url, model_dir):
    trainer = Trainer(sync_url, packed=True)
    try:
        first = perturbed(model_dir, seed=1)
        named = list(first.state_dict().items())  # the tied lm_head.weight too
        assert sum(tensor.nbytes for _, tensor in named) > 3 * SMALL_BUFFER, "the round should take several chunks"
        assert trainer.sync(named, "1") == (200, {"message": "Weights updated"})
        assert server_checksums(sync_url) == transport.digests(first.named_parameters())
        assert call(sync_url, "/weight_info") == (200, {"weight_version": "1"})
        answer = complete(sync_url, prompt=PROMPTS[0], max_tokens=3, return_token_ids=True, return_weight_versions=True)
        choice = answer["choices"][0]
        assert choice["weight_versions"] == [{"version": "1", "start": 0, "end": len(choice["token_ids"])}]

        second = perturbed(model_dir, seed=2)
        named = list(second.state_dict().items())
        assert trainer.sync(named, "2", announce=False) == (200, {"message": "Weights updated"})
        assert server_checksums(sync_url) == transport.digests(second.named_parameters())
        assert call(sync_url, "/weight_info") == (200, {"weight_version": "2"})
    finally:
        trainer.close()


def test_a_round_with_unknown_or_misshapen_weights_is_refused_whole_and_spends_the_server(model_dir, tmp_path):
    """As vLLM: the round is answered 500, and the server's next completion is its engine's death."""
    server = ServerProcess(model_dir, tmp_path / "server.log")
    trainer = Trainer(server.url, packed=True)
    try:
        model = perturbed(model_dir, seed=3)
        assert trainer.sync(list(model.state_dict().items()), "3") == (200, {"message": "Weights updated"})
        before = server_checksums(server.url)

        named = list(perturbed(model_dir, seed=4).state_dict().items())
        named[0] = ("model.no_such_weight", named[0][1])
        named[1] = (named[1][0], named[1][1].reshape(-1))
        status, answer = trainer.sync(named, "4")  # answered while the trainer's broadcast has no receiver

        assert status == 500 and answer["error"]["type"] == "InternalServerError"
        assert "model.no_such_weight" in answer["error"]["message"] and named[1][0] in answer["error"]["message"]
        assert server_checksums(server.url) == before, "no weight of a refused round is loaded"
        assert call(server.url, "/weight_info") == (200, {"weight_version": "3"})
        assert call(server.url, "/start_weight_update", {})[0] == 500, "the refused round spent the group"
        status, answer = call(server.url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2})
        assert status == 500 and answer["error"]["message"].startswith("EngineCore encountered an issue")
        assert server.process.wait(timeout=60) == 0  # vLLM's server, too, exits with 0 once its engine died
    finally:
        trainer.group.close()
        server.process.kill()


def test_unpacked_weights_arrive_one_broadcast_each(sync_url, model_dir):
    trainer = Trainer(sync_url, packed=False)
    try:
        model = perturbed(model_dir, seed=5)
        assert trainer.sync(list(model.state_dict().items()), "6") == (200, {"message": "Weights updated"})
        assert server_checksums(sync_url) == transport.digests(model.named_parameters())
    finally:
        trainer.close()


def test_the_weight_checker_compares_and_resets(sync_url, model):
    baseline = server_checksums(sync_url)
    assert call(sync_url, "/weight_checker", {"action": "compare", "baseline": baseline}) == (
        200,
        {"match": True, "mismatches": []},
    )
    assert call(sync_url, "/weight_checker", {"action": "reset"}) == (200, {"status": "reset"})
    status, answer = call(sync_url, "/weight_checker", {"action": "compare", "baseline": baseline})
    assert status == 200 and answer == {"match": False, "mismatches": sorted(baseline)}
    zeros = ((name, torch.zeros_like(parameter)) for name, parameter in model.named_parameters())
    assert server_checksums(sync_url) == transport.digests(zeros)
    assert call(sync_url, "/weight_checker", {"action": "compare"})[0] == 400  # compare needs a baseline


def test_generation_goes_on_while_the_server_waits_for_the_trainer_to_join(sync_url):
    port = free_port()
    info = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2}
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(call, sync_url, "/init_weight_transfer_engine", {"init_info": info})
        time.sleep(0.3)
        try:
            complete(sync_url, prompt=PROMPTS, max_tokens=2)
            waiting = not joining.done()
        finally:  # join in any case: a server left waiting would hold up the other weight routes
            group = transport.GlooGroup("127.0.0.1", port, rank=0, world_size=2, timeout=60)
        assert joining.result(timeout=60) == (200, {"message": "Weight transfer initialized"})
    assert waiting, "the server should still have been waiting for the trainer"
    assert call(sync_url, "/shutdown_weight_transfer_engine", {}) == (200, {"message": "Weight transfer shut down"})
    group.close()


def init_info(port: int) -> dict:
    return {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "packed": True}


def test_the_weight_transfer_belongs_to_the_trainer_that_opened_it(sync_url):
    first = Trainer(sync_url)
    try:
        status, answer = call(sync_url, "/init_weight_transfer_engine", {"init_info": init_info(free_port())})
        assert status == 409 and "belongs to another trainer" in answer["error"]["message"]
        assert call(sync_url, "/start_weight_update", {}) == (200, {"message": "Weight update started"})
        assert call(sync_url, "/finish_weight_update", {}) == (200, {"message": "Weight update finished"})
    finally:
        first.close()
    second = Trainer(sync_url)  # the first let go: the transfer is free again
    second.close()


# A trainer that opens the transfer, pauses the server, starts a round and then stays there until it is killed.
ABANDONING_TRAINER = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
from grpo_kit_vllm import transport
from grpo_kit_vllm.testing.http import call
url, port = sys.argv[1], int(sys.argv[2])
info = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2}
with ThreadPoolExecutor(1) as pool:
    answer = pool.submit(call, url, "/init_weight_transfer_engine", {"init_info": info})
    group = transport.GlooGroup("127.0.0.1", port, rank=0, world_size=2, timeout=60)
    assert answer.result()[0] == 200, answer.result()
assert call(url, "/pause?mode=wait", {})[0] == 200
assert call(url, "/start_weight_update", {})[0] == 200
print("paused", flush=True)
time.sleep(600)
"""


def test_a_sync_whose_trainer_died_is_lifted_for_the_others(sync_url):
    """A trainer killed mid-sync leaves vLLM paused for good; here its pause and its round end with it."""
    command = [sys.executable, "-c", ABANDONING_TRAINER, sync_url, str(free_port())]
    trainer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline().strip() == "paused"
        assert call(sync_url, "/is_paused") == (200, {"is_paused": True})
        assert call(sync_url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2})[0] == 503
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 10
        while call(sync_url, "/is_paused")[1]["is_paused"]:
            assert time.monotonic() < deadline, "the dead trainer's pause should have expired"
            time.sleep(0.2)
        complete(sync_url, prompt=PROMPTS, max_tokens=2)
        survivor = Trainer(sync_url)  # the round and the transfer ended with their trainer
        survivor.close()
    finally:
        trainer.kill()
        trainer.wait()

"""The client, and the test server it is otherwise tested against, held to a real vLLM: vllm-cpu 0.32 on this CPU.

    pytest -m vllm_real plugins/grpo_kit_vllm/tests/test_real_vllm.py

grpo_kit_vllm/testing/vllm_cpu.py builds vLLM's environment once (3 minutes, then reused). Every server here is
started the way `generation.launch=vllm` starts one, with `generation.vllm_python` at that environment's Python, and
receives weights through grpo_kit_vllm's gloo engine. The model is an untied tiny Qwen2 whose heads vLLM's CPU
attention takes (size 32). One server is shared, and started anew after a test that spends it. Without the
environment the suite skips, or fails in CI (CI=true), with the reason.
"""

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import psutil
import pytest
import torch
from accelerate import Accelerator
from omegaconf import MISSING
from transformers import AutoModelForCausalLM, AutoTokenizer

import grpo_kit
from grpo_kit.contract.errors import ConfigError, GenerationUnavailable
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing.models import build_tiny_model
from grpo_kit.testing.runs import tiny_run
from grpo_kit_vllm import launch, transport
from grpo_kit_vllm.alongside import Background
from grpo_kit_vllm.client import ServerClient, ServerError
from grpo_kit_vllm.config import VLLMServerConfig
from grpo_kit_vllm.launch import LaunchedServer, vllm_serve_command, vllm_server_environment
from grpo_kit_vllm.server_generation import VLLMServerGeneration
from grpo_kit_vllm.testing import vllm_cpu
from grpo_kit_vllm.testing.http import call, free_port
from grpo_kit_vllm.testing.vllm_rules import VLLM_RULES

pytestmark = [pytest.mark.slow, pytest.mark.vllm_real]

PROMPTS = [[3, 12, 4, 15], [5, 6, 12, 7, 15]]  # "1+2=" and "34+5=" in the embedded tokenizer
SCORED = [[3, 12, 4, 15, 7, 8, 9], [5, 6, 12, 7, 15, 9, 10, 11, 2]]  # prompts whose every token the server scores


class Server:
    """A server started as a run starts one, in its own process group; started again once it has exited."""

    def __init__(self, command_for, folder: Path, env: dict[str, str]):
        self.command_for, self.folder, self.env = command_for, folder, env
        self.launched: LaunchedServer | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        if self.launched is None or self.launched.exited():
            self._start()
        return self._url

    def _start(self) -> None:
        self.starts += 1
        self._url = f"http://127.0.0.1:{free_port()}"
        log = self.folder / f"server-{self.starts}.log"
        self.launched = LaunchedServer(self.command_for(self._url), log, self.env)
        deadline = time.monotonic() + 300
        while not ServerClient(self._url, 5, 0).is_healthy():
            assert not self.launched.exited(), f"the server exited:\n{self.launched.log_tail(40)}"
            assert time.monotonic() < deadline, f"no answer on /health within 300 s:\n{self.launched.log_tail(40)}"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.launched is not None:
            self.launched.stop()


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return vllm_cpu.ensure_environment()
    except vllm_cpu.EnvironmentUnavailable as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs the real-vLLM suite, but its environment cannot be built: {error}", pytrace=False)
        pytest.skip(f"no vllm-cpu environment: {error}")


def tiny_vllm_model(directory: Path, tied: bool = False) -> Path:
    """Head size 32 (hidden 64, two heads), which vLLM's CPU attention takes; the test models' 8 it does not."""
    size = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)
    return build_tiny_model(directory, tie_word_embeddings=tied, **size)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_vllm_model(tmp_path_factory.mktemp("real-vllm-model"))


def vllm_server(python: Path, model: Path, folder: Path) -> Server:
    return Server(
        lambda url: vllm_serve_command(str(model), url, "gloo", str(python)),
        folder,
        vllm_server_environment("gloo", {}),
    )


@pytest.fixture(scope="module")
def real(vllm_python, model_dir, tmp_path_factory):
    server = vllm_server(vllm_python, model_dir, tmp_path_factory.mktemp("real-vllm"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stand_in(model_dir, tmp_path_factory):
    server = Server(
        lambda url: launch.test_server_command(str(model_dir), url), tmp_path_factory.mktemp("stand-in"), {}
    )
    yield server
    server.stop()


@pytest.mark.parametrize("rule", VLLM_RULES.values(), ids=VLLM_RULES.keys())
def test_the_real_server_refuses_what_the_test_server_refuses(real, rule):
    status, answer = call(real.url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2} | rule.body)
    assert status == rule.status, (rule.source, answer)
    assert answer["error"]["message"].startswith(rule.message_0_32 or rule.message), answer["error"]["message"]


def exchanges(url: str, model: str) -> dict[str, tuple[int, object]]:
    """A scripted conversation of a client with a server: each exchange's status and answer."""
    sampled = {"model": model, "prompt": PROMPTS, "n": 2, "max_tokens": 3, "logprobs": 0, "return_token_ids": True}
    posts = {
        "completions, sampled, with log-probs": ("/v1/completions", sampled),
        "completions, greedy": ("/v1/completions", {"prompt": PROMPTS, "temperature": 0, "max_tokens": 3}),
        "completions, stop token ids": ("/v1/completions", {"prompt": PROMPTS[1], "stop_token_ids": [2, 3, 4]}),
        "completions, prompt log-probs": ("/v1/completions", {"prompt": SCORED, "max_tokens": 1, "prompt_logprobs": 0}),
        "tokens route": (
            "/inference/v1/generate",
            {"model": model, "token_ids": PROMPTS[0], "sampling_params": {"max_tokens": 2, "logprobs": 0}},
        ),
        "an unknown route": ("/v1/embeddings", {}),
        "an update before its start": ("/update_weights", {"update_info": transport.update_info([])}),
        "a finish without a start": ("/finish_weight_update", {"weight_version": "1"}),
    }
    gets = ["/v1/models", "/get_world_size", "/is_paused", "/weight_info", "/server_info?config_format=json"]
    answers = {path: call(url, path) for path in gets}
    answers |= {name: call(url, path, body) for name, (path, body) in posts.items()}
    answers["pause"] = call(url, "/pause?mode=wait", {})
    answers["is paused, paused"] = call(url, "/is_paused")
    with ThreadPoolExecutor(1) as pool:
        paused = pool.submit(call, url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2})
        time.sleep(1)
        answers["resume"] = call(url, "/resume", {})
        answers["a completion while paused"] = paused.result(timeout=60)
    return answers


def shape(value, keyed_by_token: bool = False):
    """What a client can rely on in an answer: its keys, nested, and the kind of each value. The log-prob maps of
    `top_logprobs` and `prompt_logprobs` are keyed by the tokens themselves: their keys are data, not shape."""
    if isinstance(value, dict):
        if keyed_by_token and "logprob" not in value:
            return {"<token>": shape(next(iter(value.values())))} if value else {}
        return {key: shape(item, key in ("top_logprobs", "prompt_logprobs")) for key, item in value.items()}
    if isinstance(value, list):
        present = [item for item in value if item is not None]  # prompt_logprobs opens with None
        return [shape(present[0], keyed_by_token)] if present else []
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def missing(stand_in, real, where: str = "") -> list[str]:
    """The parts of the test server's answer that the real one lacks or gives as another kind of value."""
    if isinstance(stand_in, dict) and isinstance(real, dict):
        return [
            gap
            for key in stand_in
            if not (key in KEYS_NEW_IN_0_33 and key not in real)
            for gap in missing(stand_in[key], real.get(key, "absent"), f"{where}.{key}")
        ]
    if isinstance(stand_in, list) and isinstance(real, list):
        return missing(stand_in[0], real[0], f"{where}[0]") if stand_in and real else []
    return [] if stand_in == real else [f"{where}: {stand_in} here, {real} in vLLM"]


# Where the two differ on purpose: vLLM 0.32's behaviour against the 0.33 source the test server follows.
KEYS_NEW_IN_0_33 = {"weight_versions"}  # of a completion's choice (entrypoints/openai/completion/protocol.py)
VERSION_DIFFERENCES = {
    "a completion while paused": (
        (503, 200),
        "0.33 refuses a new request while paused in abort and wait modes (v1/engine/core.py: "
        "_reject_add_while_paused); 0.32 queues it and answers after /resume",
    ),
}


def test_the_test_server_answers_a_scripted_conversation_as_the_real_vllm_does(real, stand_in, model_dir):
    ours, theirs = exchanges(stand_in.url, str(model_dir)), exchanges(real.url, str(model_dir))
    gaps = []
    for name, (status, answer) in ours.items():
        real_status, real_answer = theirs[name]
        if name in VERSION_DIFFERENCES:
            statuses, reason = VERSION_DIFFERENCES[name]
            assert (status, real_status) == statuses, f"{name}: no longer as recorded ({reason})"
            continue
        if status != real_status:
            gaps.append(f"{name}: HTTP {status} here, {real_status} in vLLM: {answer} / {real_answer}")
        elif status == 200:
            gaps += [f"{name}{gap}" for gap in missing(shape(answer), shape(real_answer))]
    assert not gaps, "\n".join(gaps)


def server_log_probs(url: str, model: str) -> list[list[float]]:
    """The server's log-prob of every token of SCORED after the first (vLLM's `prompt_logprobs`)."""
    status, answer = call(
        url, "/v1/completions", {"model": model, "prompt": SCORED, "max_tokens": 1, "prompt_logprobs": 0}
    )
    assert status == 200, answer
    return [
        [entry[str(token)]["logprob"] for entry, token in zip(choice["prompt_logprobs"][1:], prompt[1:])]
        for choice, prompt in zip(answer["choices"], SCORED)
    ]


@torch.no_grad()
def trainer_log_probs(model: torch.nn.Module) -> list[list[float]]:
    rows = []
    for prompt in SCORED:
        ids = torch.tensor([prompt])
        logps = model(ids).logits.float().log_softmax(-1)[0, :-1]  # (T-1, V)
        rows.append(logps.gather(-1, ids[0, 1:, None])[:, 0].tolist())
    return rows


def largest_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


@dataclass
class LogProbsConfig:
    url: str = MISSING


class LogProbsFollow:
    """After every step, so after every weight sync, the server scores SCORED as the trainer's weights do."""

    gaps: ClassVar[list[float]] = []
    scores: ClassVar[list[list[list[float]]]] = []  # the server's, after each sync

    def __init__(self, config: LogProbsConfig):
        self.url = config.url

    @grpo_kit.hookimpl
    def on_step_end(self, run, step, metrics):
        model = Accelerator(cpu=True).unwrap_model(run.model)
        model_id = call(self.url, "/v1/models")[1]["data"][0]["id"]
        self.scores.append(server_log_probs(self.url, model_id))
        self.gaps.append(largest_gap(self.scores[-1], trainer_log_probs(model)))
        assert call(self.url, "/weight_info") == (200, {"weight_version": str(step)})


class LogProbsPlugin:
    @grpo_kit.hookimpl
    def register_hooks(self, register):
        register("log_probs_follow", LogProbsFollow, LogProbsConfig)


def test_after_every_sync_the_real_server_scores_as_the_trainers_weights(real, model_dir, tmp_path):
    """Three steps; a sequence-level rollout correction from the server's own log-probs: on-policy, its ratio is 1."""
    manager = plugin_manager()
    manager.register(LogProbsPlugin())
    registry = Registry(manager)
    LogProbsFollow.gaps.clear()
    LogProbsFollow.scores.clear()
    url = real.url
    cfg = grpo_kit.compose(
        tiny_run(
            model_dir,
            "generation=vllm_server",
            f"generation.base_url={url}",
            "rollout_correction=sequence_mask",
            "+reward=accuracy",
            "+hook=log_probs_follow",
            f"hook.log_probs_follow.url={url}",
        ),
        registry=registry,
    )
    grpo_kit.train(cfg, tmp_path / "run", registry)
    print("largest |server - trainer| log-prob after each sync:", LogProbsFollow.gaps)
    assert len(LogProbsFollow.gaps) == 3 and max(LogProbsFollow.gaps) < 1e-4
    untrained = trainer_log_probs(AutoModelForCausalLM.from_pretrained(model_dir))
    moved = largest_gap(LogProbsFollow.scores[-1], untrained)
    print(f"largest change of the server's log-probs over the run: {moved:.4f}")
    assert moved > 1e-3, "the weights should have moved: a server that kept its first weights would pass unseen"
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    ratios = [
        line["sampling/importance_sampling_ratio/mean"]
        for line in lines
        if "sampling/importance_sampling_ratio/mean" in line
    ]
    print("sequence_mask ratio means:", ratios)
    assert len(ratios) == 3 and all(abs(ratio - 1) < 1e-3 for ratio in ratios)


def started(model, model_dir: Path, **options) -> VLLMServerGeneration:
    generation = VLLMServerGeneration(VLLMServerConfig(**options))
    generation.start(model, AutoTokenizer.from_pretrained(model_dir), Accelerator(cpu=True))
    return generation


def test_a_completion_asked_while_the_real_server_is_paused_waits_for_resume(real, model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generation = started(model, model_dir, base_url=real.url, retries=0, max_completion_length=2)
    try:
        assert call(real.url, "/pause?mode=wait", {}) == (200, {"status": "paused"})
        try:
            asked = ThreadPoolExecutor(1).submit(generation.generate_in_background, [PROMPTS[0]])
            time.sleep(2)
            assert not asked.done(), "vLLM 0.32 holds the request until /resume"
        finally:
            call(real.url, "/resume", {})
        assert asked.result(timeout=60).completion_ids.shape[0] == 1
    finally:
        generation.close()


def test_the_real_server_keeps_completions_within_the_regex_the_client_sends(real, model_dir):
    """generation.structured_outputs_regex in vLLM's own `structured_outputs` field: the real server honours it
    (xgrammar by default), as the test server does (test_server_mode.py)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pattern = "[13579]{2,4}"
    generation = started(
        model,
        model_dir,
        base_url=real.url,
        num_generations=8,
        max_completion_length=6,
        structured_outputs_regex=pattern,
    )
    try:
        completions = generation.generate([PROMPTS[0]] * 8 + [PROMPTS[1]] * 8)
    finally:
        generation.close()
    for ids, mask in zip(completions.completion_ids, completions.completion_mask):
        tokens = ids[mask.bool()].tolist()
        assert tokens[-1] == tokenizer.eos_token_id, "the pattern ends within max_completion_length: EOS ends it"
        assert re.fullmatch(pattern, tokenizer.decode(tokens[:-1])), tokenizer.decode(tokens)


def test_the_gloo_engine_refuses_a_second_trainer_while_the_first_holds_the_transfer(real, model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    first = started(model, model_dir, base_url=real.url, retries=0, max_completion_length=2)
    try:
        with pytest.raises(ServerError) as refused:
            started(model, model_dir, base_url=real.url, retries=0, max_completion_length=2)
        print("the second trainer was told:", refused.value)
        assert refused.value.status == 500
    finally:
        first.close()
    started(model, model_dir, base_url=real.url, retries=0, max_completion_length=2).close()  # free again


def test_vllm_cpu_keeps_a_tied_head_stale_after_a_sync_so_the_client_refuses_tied_models(vllm_python, tmp_path):
    """The evidence behind server_info.check_tied_head: should a vllm-cpu release fix it, this test fails."""
    model_dir = tiny_vllm_model(tmp_path / "tied", tied=True)
    server = vllm_server(vllm_python, model_dir, tmp_path)
    try:
        url = server.url
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        with pytest.raises(ConfigError, match="keeps a tied LM head"):
            started(model, model_dir, base_url=url)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)) * 0.1)
        sync_without_the_client(url, model)
        gap = largest_gap(server_log_probs(url, str(model_dir)), trainer_log_probs(model))
        print(f"tied head: largest |server - trainer| log-prob after a sync: {gap:.3f}")
        assert gap > 0.05
    finally:
        server.stop()


def sync_without_the_client(url: str, model: torch.nn.Module) -> None:
    """One weight sync driven by hand over vLLM's routes, as the client would drive it without its checks."""
    port = free_port()
    init = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "packed": True}
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(call, url, "/init_weight_transfer_engine", {"init_info": init})
        group = transport.GlooGroup("127.0.0.1", port, rank=0, world_size=2, timeout=60)
        assert joined.result()[0] == 200
    named = list(model.named_parameters())
    metas = [transport.TensorMeta.of(name, tensor) for name, tensor in named]
    assert call(url, "/pause?mode=wait", {})[0] == 200 and call(url, "/start_weight_update", {})[0] == 200
    sending = Background(lambda: transport.send(group, [tensor.detach() for _, tensor in named], "cpu"))
    assert call(url, "/update_weights", {"update_info": transport.update_info(metas)})[0] == 200
    assert sending.done.wait(60) and sending.error is None
    assert call(url, "/finish_weight_update", {"weight_version": "1"})[0] == 200
    assert call(url, "/resume", {})[0] == 200
    group.close()


def launched_server_pid(port: int) -> int:
    """The vLLM server that listens on `port`, launched by this process (the shared one is another child)."""
    for child in psutil.Process().children():
        try:
            command = child.cmdline()
            if child.status() != psutil.STATUS_ZOMBIE and "vllm.entrypoints" in " ".join(command):
                if command[command.index("--port") + 1] == str(port):
                    return child.pid
        except (psutil.NoSuchProcess, ValueError, IndexError):
            continue
    raise AssertionError(f"no vLLM server of this process listens on port {port}")


def test_a_real_server_killed_mid_sync_stops_the_run_saved_and_resuming_launches_a_new_one(
    vllm_python, model_dir, tmp_path, monkeypatch
):
    """generation.launch=vllm with vllm-cpu: the run starts its own server, which dies between /start_weight_update
    and /update_weights of step 2's sync; the run stops with a checkpoint, and its resume starts a new server."""
    port = free_port()
    options = [
        "generation=vllm_server",
        "generation.launch=vllm",
        f"generation.vllm_python={vllm_python}",
        f"generation.base_url=http://127.0.0.1:{port}",
        "generation.retries=1",
        "generation.request_timeout=60",
        "+reward=accuracy",
    ]
    run_dir = tmp_path / "run"
    updates = []
    post = ServerClient.post

    def killing_post(client, path, body=None, timeout=None):
        if path == "/update_weights":
            updates.append(path)
            if len(updates) == 3:  # step 0's sync at the start, then steps 1 and 2
                os.killpg(launched_server_pid(port), signal.SIGKILL)
        return post(client, path, body, timeout)

    monkeypatch.setattr(ServerClient, "post", killing_post)
    with pytest.raises(GenerationUnavailable, match="A checkpoint of step 2 is saved") as stopped:
        grpo_kit.train(grpo_kit.compose(tiny_run(model_dir, "trainer.max_steps=4", *options)), run_dir)
    assert "trainer.resume=auto" in str(stopped.value)
    monkeypatch.setattr(ServerClient, "post", post)

    resumed = grpo_kit.compose(tiny_run(model_dir, "trainer.max_steps=4", "trainer.resume=auto", *options))
    grpo_kit.train(resumed, run_dir)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 4
    assert (run_dir / "generation_server.log").read_text().count("Application startup complete") == 2


def test_a_refused_update_spends_the_real_server_and_the_run_stops_saying_so(real, model_dir):
    """vLLM leaves its layers half reloaded after a failed round: its next completion fails and its process exits.
    (Last in this file: it spends the shared server.)"""
    url = real.url
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.model.register_parameter("extra_scale", torch.nn.Parameter(torch.ones(64)))
    with pytest.raises(GenerationUnavailable, match="no module or parameter named 'extra_scale'") as error:
        started(model, model_dir, base_url=url, request_timeout=60)
    assert "cannot generate again: restart the server" in str(error.value)
    assert call(url, "/resume", {})[0] == 200  # the failed sync left it paused, holding every request
    status, answer = call(url, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 2})
    assert status == 500 and answer["error"]["message"].startswith("EngineCore encountered an issue")
    assert real.launched.process.wait(timeout=60) == 0  # as the test server does

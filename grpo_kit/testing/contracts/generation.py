"""The generation suite (grpo_kit/contract/kinds.py: Generation): a backend on a tiny random model."""

import copy
import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import pytest
import torch

from grpo_kit.contract.eos import eos_token_ids
from grpo_kit.contract.kinds import Completions, PromptImages, declared
from grpo_kit.testing.contracts.plugin import PluginContract


class GenerationContract(PluginContract):
    """A generation backend (kinds.py: Generation) on a tiny random model with the embedded tokenizer.

    The default options sample hot and short, so that some completions end with EOS and some are cut off. The
    model's generation config lists a second EOS id besides the tokenizer's, as Qwen2.5/Qwen3 Instruct's do: a
    backend must end a completion at the first of either (`grpo_kit.eos_token_ids`).
    `reports_sampling_logprobs = False` for a backend that cannot report its own log-probs.
    """

    kind = "generation"
    options: ClassVar[dict] = {"max_completion_length": 6, "temperature": 3.0}
    prompts: ClassVar[Sequence[str]] = ("1+2=", "34+5=") * 32
    reports_sampling_logprobs: ClassVar[bool] = True

    @pytest.fixture(scope="class")
    @classmethod
    def model_and_tokenizer(cls, tmp_path_factory):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpo_kit.testing.models import build_tiny_model

        directory = build_tiny_model(tmp_path_factory.mktemp("generation-contract-model"))
        model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("5")]
        return model, tokenizer

    @pytest.fixture(scope="class")
    @classmethod
    def started(cls, plugin, model_and_tokenizer):
        from accelerate import Accelerator

        model, tokenizer = model_and_tokenizer
        plugin.start(model, tokenizer, Accelerator(cpu=True))
        yield plugin
        plugin.close()

    @pytest.fixture(scope="class")
    @classmethod
    def generated(cls, started, model_and_tokenizer) -> Completions:
        _, tokenizer = model_and_tokenizer
        torch.manual_seed(0)
        return started.generate([tokenizer(p, add_special_tokens=False).input_ids for p in cls.prompts])

    def test_one_completion_per_prompt(self, generated, plugin_config):
        n, limit = len(self.prompts), plugin_config.max_completion_length
        ids, mask, truncated = generated.completion_ids, generated.completion_mask, generated.is_truncated
        assert ids.dim() == 2 and ids.shape[0] == n, f"completion_ids: expected ({n}, T), got {tuple(ids.shape)}"
        assert ids.shape[1] <= limit, f"{ids.shape[1]} tokens, more than max_completion_length={limit}"
        assert mask.shape == ids.shape, f"completion_mask {tuple(mask.shape)} differs from ids {tuple(ids.shape)}"
        assert truncated.shape == (n,) and truncated.dtype == torch.bool, "is_truncated: a (N,) bool tensor"

    def test_mask_covers_up_to_and_including_the_first_eos(self, generated, model_and_tokenizer):
        eos = torch.tensor(eos_token_ids(*model_and_tokenizer))
        ends = []
        for row, (ids, mask) in enumerate(zip(generated.completion_ids, generated.completion_mask)):
            eos_positions = torch.isin(ids, eos).nonzero().view(-1)
            end = eos_positions[0].item() + 1 if len(eos_positions) else len(ids)
            assert mask[:end].all() and not mask[end:].any(), f"completion {row}: ids {ids.tolist()}, mask {mask}"
            ends.append(ids[end - 1].item())
        assert set(eos.tolist()) <= set(ends), f"hot sampling should end completions at every EOS id {eos.tolist()}"

    def test_truncation_flags_agree_with_the_tokens(self, generated, model_and_tokenizer, plugin_config):
        # TRL's rule: cut off where the last token is neither an EOS nor the pad token.
        finishing = set(eos_token_ids(*model_and_tokenizer)) | {model_and_tokenizer[1].pad_token_id}
        for row, (ids, mask, truncated) in enumerate(
            zip(generated.completion_ids, generated.completion_mask, generated.is_truncated)
        ):
            last = ids[mask.bool()][-1].item()
            assert bool(truncated) == (last not in finishing), (
                f"completion {row}: is_truncated={bool(truncated)}, last token {last} (EOS or pad: {sorted(finishing)})"
            )
            if truncated:
                assert int(mask.sum()) == plugin_config.max_completion_length, f"completion {row} stopped early"
        assert generated.is_truncated.any() and not generated.is_truncated.all(), (
            "hot sampling from a random model should both end some completions and cut others off"
        )

    def test_reports_the_samplers_log_probs(self, started, model_and_tokenizer):
        if not self.reports_sampling_logprobs:
            pytest.skip("reports_sampling_logprobs = False: rollout corrections cannot be used with this backend")
        tokenizer = model_and_tokenizer[1]
        out = started.generate(
            [tokenizer(p, add_special_tokens=False).input_ids for p in self.prompts[:8]], with_logprobs=True
        )
        logps = out.sampling_per_token_logps
        assert logps is not None and logps.shape == out.completion_ids.shape, "with_logprobs=True: a (N, T) tensor"
        active = logps[out.completion_mask.bool()]
        assert torch.isfinite(active).all() and (active <= 1e-5).all(), f"log-probs of sampled tokens: {active}"

    def test_takes_new_weights(self, contract_case, plugin_config, model_and_tokenizer):
        """After `update_weights(model, step)`, completions come from the model's new weights. An optimizer step changes
        them in place; here every parameter moves. With top_k=1 any backend decodes greedily, so its completions
        must be those the model itself decodes greedily: with the old weights before, with the new ones after."""
        from accelerate import Accelerator

        model = copy.deepcopy(model_and_tokenizer[0])  # changed below: the class's other tests keep the original
        tokenizer = model_and_tokenizer[1]
        prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in dict.fromkeys(self.prompts)]
        limit = plugin_config.max_completion_length
        greedy = contract_case.registry.build(
            contract_case.kind, contract_case.name, dataclasses.replace(plugin_config, top_k=1)
        )
        greedy.start(model, tokenizer, Accelerator(cpu=True))
        try:
            old = _greedy_completions(model, tokenizer, prompt_ids, limit)
            assert _completion_tokens(greedy.generate(prompt_ids)) == old, (
                f"with top_k=1, completions should be the model's greedy ones: {old}"
            )
            with torch.no_grad():
                generator = torch.Generator().manual_seed(0)
                for parameter in model.parameters():
                    parameter.add_(torch.randn(parameter.shape, generator=generator).to(parameter))
            new = _greedy_completions(model, tokenizer, prompt_ids, limit)
            assert new != old, "changing every weight should change the greedy completions of this test's prompts"
            greedy.update_weights(model, step=1)
            assert _completion_tokens(greedy.generate(prompt_ids)) == new, (
                f"after update_weights, completions should follow the new weights ({new}), not the old ({old})"
            )
        finally:
            greedy.close()

    def test_images_reach_the_sampler(self, contract_case, plugin_config, tmp_path_factory):
        """A backend that declares `accepts_images` samples from the prompts' images: with top_k=1 its completions
        are those a tiny Qwen2-VL decodes greedily from the same prompts and pixels, and they change with the
        image (the same prompt with two different images)."""
        plugin = contract_case.registry.build(
            contract_case.kind, contract_case.name, dataclasses.replace(plugin_config, top_k=1)
        )
        if not declared(plugin, "generation", "accepts_images"):
            pytest.skip("the backend does not declare accepts_images: runs with images refuse it")
        from accelerate import Accelerator
        from PIL import Image
        from transformers import AutoModelForImageTextToText

        from grpo_kit.embedded.vision import ImageOnlyQwen2VLProcessor
        from grpo_kit.rollout.images import ImagePrompts
        from grpo_kit.testing.models import build_tiny_vision_model

        directory = build_tiny_vision_model(tmp_path_factory.mktemp("generation-contract-vision-model"))
        model = AutoModelForImageTextToText.from_pretrained(directory).eval()
        processor = ImageOnlyQwen2VLProcessor.from_pretrained(directory)
        question = [{"role": "user", "content": "how many squares?"}]
        noise = torch.Generator().manual_seed(0)
        pictures = [
            Image.fromarray(torch.randint(0, 256, (56, 56, 3), generator=noise, dtype=torch.uint8).numpy())
            for _ in range(6)
        ]
        rows = [{"prompt": question, "image": picture} for picture in pictures]
        prompt_ids, images = ImagePrompts(processor, "a tiny Qwen2-VL").encode(rows)
        plugin.start(model, processor.tokenizer, Accelerator(cpu=True))
        try:
            completions = _completion_tokens(plugin.generate(prompt_ids, images=images))
        finally:
            plugin.close()
        expected = _greedy_completions(
            model, processor.tokenizer, prompt_ids, plugin_config.max_completion_length, images
        )
        assert completions == expected, f"with top_k=1, the model's greedy completions from these images: {expected}"
        assert len({tuple(tokens) for tokens in completions}) > 1, (
            f"one prompt with {len(pictures)} different images gave the same completions {completions}: the images "
            "do not reach the sampler"
        )


def _greedy_completions(model, tokenizer, prompt_ids, max_completion_length, images=None) -> list[list[int]]:
    """The model's own greedy completions (transformers' generate, one prompt at a time), up to the first EOS."""
    eos = eos_token_ids(model, tokenizer)
    completions = []
    for row, ids in enumerate(prompt_ids):
        input_ids = torch.tensor([ids], device=model.device)
        with_images = {} if images is None else _row_images(images, row).forward_kwargs(model, input_ids)
        out = model.generate(
            input_ids,
            do_sample=False,
            max_new_tokens=max_completion_length,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            **with_images,
        )
        completion = out[0, len(ids) :].tolist()
        ends = [position for position, token in enumerate(completion) if token in eos]
        completions.append(completion[: ends[0] + 1] if ends else completion)
    return completions


def _completion_tokens(completions: Completions) -> list[list[int]]:
    """Each completion's active tokens."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(completions.completion_ids, completions.completion_mask)]


def _row_images(images: PromptImages, row: int) -> PromptImages:
    """The images of prompt `row` alone (Qwen2-VL's layout: each image's grid, and its patches in order)."""
    grids = images.model_inputs["image_grid_thw"]  # (images, 3)
    first = sum(len(row_images) for row_images in images.images[:row])
    count = len(images.images[row])
    patches = grids.prod(dim=-1)  # (images,)
    start, stop = int(patches[:first].sum()), int(patches[: first + count].sum())
    return PromptImages(
        [images.images[row]],
        {
            "pixel_values": images.model_inputs["pixel_values"][start:stop],
            "image_grid_thw": grids[first : first + count],
        },
    )

"""What autocast's cast cache can and cannot do to a sampler that casts the weights once per generation batch
(benchmarks/gpu/README.md, "the held autocast").

autocast keeps its bf16 cast of each float32 leaf weight until the outermost autocast exits, and reads the weight
through that cast until then: an optimizer step that updates the weight in place is not seen by a forward inside
the same outermost autocast. A sampler that holds one autocast around its loop (the reverted design) and one that
multiplies by copies under a held autocast (cast_once.py) both close theirs when the batch is sampled, so the
training step that follows casts afresh; only an autocast left open across the training step leaks the sampler's
casts into it, and silently (finite losses, stale weights), which the bf16 runs of tests/test_cuda.py could not
have caught.
"""

import contextlib

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers import AutoModelForCausalLM

from grpo_kit_transformers.cast_once import weights_cast_once

SAMPLERS = ["cast_once", "one autocast held around the loop", "an autocast left open"]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_only_an_autocast_left_open_lets_the_sampler_s_casts_outlive_an_optimizer_step(tiny_model, sampler):
    AcceleratorState._reset_state()  # an earlier test's Accelerator in this process may have chosen another precision
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.5))
    inner = accelerator.unwrap_model(model)  # as generation.py samples with it: accelerate's autocast on its forward
    ids = torch.randint(2, 16, (2, 6), generator=torch.Generator().manual_seed(0))
    held = weights_cast_once(inner, "cpu", torch.bfloat16) if sampler == "cast_once" else torch.autocast("cpu")
    with contextlib.ExitStack() as left_open:
        if sampler == "an autocast left open":
            left_open.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        with torch.no_grad(), held:
            sampled = inner(input_ids=ids).logits  # a decode step
        model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()  # a training step
        optimizer.step()
        after_the_step = model(input_ids=ids).logits
    fresh = model(input_ids=ids).logits  # no autocast open around it: the updated weights cast afresh
    assert not torch.equal(fresh, sampled)  # the step moved the weights
    # Left open, the linear layers still read the casts made while sampling (embeddings and norms, never cast, do
    # read their updated weights).
    assert torch.equal(after_the_step, fresh) == (sampler != "an autocast left open")

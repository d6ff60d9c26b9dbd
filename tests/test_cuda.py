"""On one CUDA GPU: the log-prob paths (full, chunked, tiled, Liger's Triton kernels) agree there as they do on the CPU,
and a run trains in bf16 with each. They skip without CUDA (benchmarks/gpu/run.sh runs them on a lent GPU machine)."""

import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.testing import tiny_run
from grpo_kit.testing.micro_batches import add_reference_quantities, loss_and_gradients, random_micro_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
needs_liger = pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")


def on_cuda(batch: dict) -> dict:
    return {name: tensor.cuda() for name, tensor in batch.items()}


@pytest.mark.parametrize("logits", ["chunked", "tiled", pytest.param("liger", marks=needs_liger)])
def test_each_memory_saving_path_computes_the_full_paths_loss_and_gradients(registry, tiny_model, logits):
    cfg = grpo_kit.compose(["+loss=dapo", "algorithm.beta=0.04"], registry)
    objective = grpo_kit.build_objective(cfg, registry)
    plain = PolicyLoss(objective, 1.0, False)
    saver = PolicyLoss(objective, 1.0, False, logits=logits, chunk_size=5)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).cuda()
    batch = on_cuda(random_micro_batch(model.config.vocab_size))
    with torch.no_grad():
        batch = add_reference_quantities(batch, plain.logps(model, batch)[0].cpu(), old=True, ref=True)
    batch = on_cuda(batch)
    (loss, grads, _), (other_loss, other_grads, _) = (loss_and_gradients(p, model, batch) for p in (plain, saver))
    assert saver.last_path == logits
    torch.testing.assert_close(other_loss, loss, atol=1e-5, rtol=1e-4)
    for name, grad in grads.items():
        torch.testing.assert_close(other_grads[name], grad, atol=1e-5, rtol=1e-3, msg=name)


@pytest.mark.parametrize("logits", ["full", "chunked", "tiled", pytest.param("liger", marks=needs_liger)])
def test_a_run_trains_in_bf16_on_the_gpu(digits_registry, tiny_model, tmp_path, logits):
    overrides = tiny_run(tiny_model, "+reward=digits", "trainer.mixed_precision=bf16", f"model.logits={logits}")
    run_dir = grpo_kit.train(grpo_kit.compose(overrides, digits_registry), tmp_path / "run", digits_registry)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(line["loss"])) for line in lines)

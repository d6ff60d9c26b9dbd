"""Packed vs padded passes on a mixed-length batch: seconds per forward + backward, and the ratio.

    OMP_NUM_THREADS=2 python benchmarks/packing.py [--hidden 256] [--layers 4] [--rows 32] [--repeats 3]

A Qwen2-shaped model built here (random weights, SDPA), prompts of 20-200 tokens (left-padded) and completions of
8-256 (right-padded), as the race's W4 shapes them; the same micro-batch through the chunked logits path, once
padded and once packed (trainer.packing).
"""

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.model.fast.switches import SpeedUps, use_speed_ups
from grpo_kit.model.logprobs import per_token_logps_and_entropies


def mixed_batch(rows: int, vocab: int, generator: torch.Generator) -> MicroBatch:
    prompt_lengths = torch.randint(20, 201, (rows,), generator=generator)
    completion_lengths = torch.randint(8, 257, (rows,), generator=generator)
    prompt_width, width = int(prompt_lengths.max()), int(completion_lengths.max())
    prompt_mask = (torch.arange(prompt_width) >= prompt_width - prompt_lengths[:, None]).long()
    completion_mask = (torch.arange(width) < completion_lengths[:, None]).long()
    return MicroBatch(
        prompt_ids=torch.randint(1, vocab, (rows, prompt_width), generator=generator) * prompt_mask,
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(1, vocab, (rows, width), generator=generator) * completion_mask,
        completion_mask=completion_mask,
        advantages=torch.zeros(rows),  # a pass's log-probs read none
    )


def seconds(model, batch, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        logps, _ = per_token_logps_and_entropies(model, batch, 1.0, chunk_size=1024)
        (logps * batch.completion_mask).sum().backward()
        times.append(time.perf_counter() - started)
    return min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(args.hidden // 128, 1),
        max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(config).train()
    batch = mixed_batch(args.rows, args.vocab, torch.Generator().manual_seed(0))
    real = int(batch.prompt_mask.sum() + batch.completion_mask.sum())
    padded_tokens = batch.prompt_mask.numel() + batch.completion_mask.numel()
    padded = seconds(model, batch, args.repeats)
    use_speed_ups(model, SpeedUps(packing=True))
    packed = seconds(model, batch, args.repeats)
    print(f"rows {args.rows}, real tokens {real}, padded tokens {padded_tokens} ({padded_tokens / real:.2f}x)")
    print(f"padded: {padded:.3f} s   packed: {packed:.3f} s   packed / padded: {packed / padded:.2f}")


if __name__ == "__main__":
    main()

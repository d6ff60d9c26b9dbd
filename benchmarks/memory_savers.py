"""Peak memory and time of a training step under each memory saver, as ratios to the plain step.

    python benchmarks/memory_savers.py            # a 4-layer, 512-wide model, 16 sequences of 512 tokens, on CPU

Each setting runs in a fresh process (peak resident memory is per process): the model is loaded through
grpo_kit's own `load_model` with the setting, and takes optimizer steps on the policy-gradient part of the loss.
The first step is a warm-up; the time is the mean of the others. "peak" is the process's peak resident memory
minus its memory after loading the model, so it counts activations, gradients and optimizer state.
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

SETTINGS = {
    "plain": {},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "lora": {"lora": {"enabled": True}},
    "lora + gradient_checkpointing": {"lora": {"enabled": True}, "gradient_checkpointing": True},
    "bf16 autocast": {"mixed_precision": "bf16"},
}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(model_dir: str, setting: dict, batch: int, length: int, steps: int) -> dict:
    import torch
    from accelerate import Accelerator

    from grpo_kit.config.schema import LoraConfig, ModelConfig
    from grpo_kit.contract.micro_batch import MicroBatch
    from grpo_kit.model.loading import load_model
    from grpo_kit.model.logprobs import per_token_logps_and_entropies

    lora = LoraConfig(**setting.get("lora", {}))
    config = ModelConfig(
        name_or_path=model_dir, gradient_checkpointing=setting.get("gradient_checkpointing", False), lora=lora
    )
    model, _ = load_model(config)
    accelerator = Accelerator(mixed_precision=setting.get("mixed_precision", "no"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    torch.manual_seed(0)
    vocab = accelerator.unwrap_model(model).config.vocab_size
    advantages = torch.randn(batch, 1)  # (B, 1)
    batch_tensors = MicroBatch(
        prompt_ids=torch.randint(2, vocab, (batch, 32)),
        prompt_mask=torch.ones(batch, 32, dtype=torch.long),
        completion_ids=torch.randint(2, vocab, (batch, length)),  # (B, T)
        completion_mask=torch.ones(batch, length, dtype=torch.long),
        advantages=advantages.view(-1),
    )
    loaded = peak_rss_mib()
    seconds = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        per_token_logps, _ = per_token_logps_and_entropies(model, batch_tensors, temperature=1.0)
        loss = -(per_token_logps * advantages).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - started)
    return {"peak_mib": peak_rss_mib() - loaded, "seconds": sum(seconds[1:]) / steps}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one setting, in a child process
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        result = measure(args.model_dir, SETTINGS[args.measure], args.batch, args.length, args.steps)
        print(json.dumps(result))
        return

    from grpo_kit.testing import build_tiny_model

    with tempfile.TemporaryDirectory() as model_dir:
        # The character tokenizer's vocabulary is tiny; a real vocabulary would add the same logits cost everywhere.
        build_tiny_model(
            model_dir,
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=args.length + 64,
        )
        results = {}
        for name in SETTINGS:
            command = [
                sys.executable,
                __file__,
                "--measure",
                name,
                "--model-dir",
                model_dir,
                "--batch",
                str(args.batch),
                "--length",
                str(args.length),
                "--steps",
                str(args.steps),
            ]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[name] = json.loads(output.strip().splitlines()[-1])
    plain = results["plain"]
    print(f"{args.layers} layers x {args.hidden} wide, {args.batch} sequences of 32 + {args.length} tokens, CPU")
    print(f"{'setting':32} {'peak MiB':>9} {'x plain':>8} {'s/step':>8} {'x plain':>8}")
    for name, result in results.items():
        print(
            f"{name:32} {result['peak_mib']:9.0f} {result['peak_mib'] / plain['peak_mib']:8.2f} "
            f"{result['seconds']:8.2f} {result['seconds'] / plain['seconds']:8.2f}"
        )


if __name__ == "__main__":
    main()

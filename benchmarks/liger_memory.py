"""Peak memory and seconds of one micro-batch's forward and backward pass, with the (B, T, V) logits (model.logits=full)
and without them (chunked, tiled, liger), as ratios to the plain path.

    python benchmarks/liger_memory.py                 # vocab 151,936 (Qwen2), T = 1,024, B = 4, on CPU: ~13 GB free
    python benchmarks/liger_memory.py --vocab 32000   # a quicker, smaller run
    python benchmarks/liger_memory.py --device cuda   # on a GPU: peak allocated CUDA memory instead

The model is a Qwen2 with Qwen2's vocabulary and a tiny width (hidden 64, 2 layers), built from a seed in memory, so
the LM head's logits are nearly all of the memory. The objective is dapo with a KL term (beta 0.04) and off-policy
old log-probs; the reference and old log-probs are given, so what is measured is exactly `PolicyLoss` on one
micro-batch, then `loss.backward()`. Each setting runs in a fresh process: "peak" is the child process's peak
resident memory (ru_maxrss) minus its resident memory just before the first step, so it counts what the step adds
(logits, activations, gradients), not the model and batch. The first step is a warm-up; the time is the mean of the
others. With --device cuda, "peak" is torch.cuda.max_memory_allocated minus the memory allocated before the
first step. liger needs liger-kernel (pip install -e '.[liger]'); it is skipped, with a note, without it.
"""

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import time

SETTINGS = ("full", "chunked", "tiled", "liger")


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(setting: str, args) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import grpo_kit
    from grpo_kit.objective.policy_loss import PolicyLoss

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.prompt + args.length,
        tie_word_embeddings=True,
    )
    device = torch.device(args.device)
    model = Qwen2ForCausalLM(config).to(device).train()
    cfg = grpo_kit.compose(["+loss=dapo", "algorithm.beta=0.04"])
    policy_loss = PolicyLoss(grpo_kit.build_objective(cfg), 1.0, False, logits=setting, chunk_size=args.chunk_size)
    batch_size, length = args.batch, args.length
    generator = torch.Generator().manual_seed(1)
    batch = grpo_kit.MicroBatch(
        prompt_ids=torch.randint(args.vocab, (batch_size, args.prompt), generator=generator),
        prompt_mask=torch.ones(batch_size, args.prompt, dtype=torch.long),
        completion_ids=torch.randint(args.vocab, (batch_size, length), generator=generator),
        completion_mask=torch.ones(batch_size, length, dtype=torch.long),
        advantages=torch.randn(batch_size, generator=generator),
        # log-probs of a random token under a near-uniform distribution, and two other policies near it
        old_per_token_logps=-12.0 + 0.1 * torch.randn(batch_size, length, generator=generator),
        ref_per_token_logps=-12.0 + 0.1 * torch.randn(batch_size, length, generator=generator),
    )
    batch.completion_mask[:, length - length // 8 :] = 0  # some padding
    reduction = grpo_kit.Reduction.whole_batch(batch.completion_mask, policy_loss.objective.max_completion_length)
    batch = batch.to(device)
    cuda = device.type == "cuda"
    baseline = torch.cuda.memory_allocated(device) / 2**20 if cuda else resident_mib()
    seconds = []
    for _ in range(args.steps + 1):
        started = time.perf_counter()
        out = policy_loss(model, batch, reduction)
        out.loss.backward()
        if cuda:
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
        del out
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else peak_mib()
    return {"path": policy_loss.last_path, "peak_mib": peak - baseline, "seconds": sum(seconds[1:]) / args.steps}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--length", type=int, default=1024, help="completion tokens T")
    parser.add_argument("--batch", type=int, default=4, help="completions B in the micro-batch")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=1024, help="model.logits_chunk_size")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (peak allocated CUDA memory)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: one setting, in a child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args)))
        return

    print(
        f"vocab {args.vocab:,}, T = {args.length:,}, B = {args.batch}, prompt {args.prompt}, hidden {args.hidden}, "
        f"{args.layers} layers, chunk {args.chunk_size}, {args.device}; one float32 (B, T, V) tensor is "
        f"{args.batch * args.length * args.vocab * 4 / 2**20:,.0f} MiB"
    )
    results = {}
    for setting in args.settings:
        if setting == "liger" and importlib.util.find_spec("liger_kernel") is None:
            print("liger: skipped, liger-kernel is not installed (pip install -e '.[liger]')")
            continue
        child = [sys.executable, __file__, "--measure", setting, *sys.argv[1:]]
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{setting}: failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
            continue
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])
    plain = results.get("full")
    print(f"{'setting':<10}{'path':<10}{'peak MiB':>12}{'s / micro-batch':>18}{'peak / full':>14}{'time / full':>14}")
    for setting, result in results.items():
        ratios = ("", "")
        if plain:
            ratios = (f"{result['peak_mib'] / plain['peak_mib']:.3f}", f"{result['seconds'] / plain['seconds']:.2f}")
        print(
            f"{setting:<10}{result['path']:<10}{result['peak_mib']:>12,.0f}{result['seconds']:>18.2f}"
            f"{ratios[0]:>14}{ratios[1]:>14}"
        )
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"device": args.device, "vocab": args.vocab, "results": results}, file, indent=1)


if __name__ == "__main__":
    main()

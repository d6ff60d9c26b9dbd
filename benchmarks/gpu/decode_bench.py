"""Decode speed of each sampling loop on Qwen2.5-0.5B's shape: the prompts' pass, and milliseconds per decode step cold
and warm, with peak memory, every loop in a fresh process of its own.

    python benchmarks/gpu/decode_bench.py --device cuda                  # the GPU check (speed.sh): ~2 minutes
    python benchmarks/gpu/decode_bench.py --shape narrow --vocab 4096 --new-tokens 8   # a CPU's dry run

The model is built untrained from a config (no download), float32 weights, and sampled as the race's sides sample it
under bf16 mixed precision (accelerate's `prepare`, whose forward runs in autocast): 32 rows, prompts of 110 tokens of
which half are left-padded by a third, 128 new tokens, EOS suppressed so that every row runs every step, top-k off.

- generate: `model.generate` on the prepared model, as TRL calls it;
- generate_no_cudnn: the same with cuDNN's attention turned off (torch prefers it for masked bf16 attention at head
  size 64, and plans it once per shape, while `generate`'s key length grows at every step);
- lean: grpo_kit's lean loop (grpo_kit_transformers.sampling), its weights cast once per call, as the backend runs it;
- static: grpo_kit's static loop (grpo_kit_transformers.static), likewise: a CUDA graph replayed on CUDA.

In each process: a first call of `--new-tokens` tokens (cold: the first shapes, plans, graph), a call of 1 token (the
prompts' pass and one draw, warm: "prefill"), then `--new-tokens` again (warm). Milliseconds per step are each long
call's time less the prefill's, over the steps after the first token. "peak" is the peak allocated CUDA memory of the
warm call above the memory allocated before it (the KV cache, activations, the weights' cast copy), and "total" the
process's peak (the model's float32 weights included). On a CPU the peaks are not measured.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from race import REAL_SHAPES, REAL_VOCAB  # noqa: E402 (race's top level imports only the standard library)

# "narrow": Qwen2.5-0.5B's depth, heads and vocabulary at a width a CPU runs fast.
SHAPES = REAL_SHAPES | {
    "narrow": dict(hidden_size=112, intermediate_size=128, num_hidden_layers=24, num_attention_heads=14)
}
LOOPS = ("generate", "generate_no_cudnn", "lean", "static")


def build(shape: str, vocab: int, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        **SHAPES[shape],
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=vocab - 1,
        pad_token_id=vocab - 2,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).eval()


def sampler(loop: str, model, device: str, precision: str):
    """`loop` as a function of (prompt_ids, attention_mask, generation_config), on the model as a run prepares it."""
    from accelerate import Accelerator

    from grpo_kit_transformers.cast_once import autocast_dtype, weights_cast_once
    from grpo_kit_transformers.sampling import sample
    from grpo_kit_transformers.static import StaticDecoder

    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=precision)
    prepared = accelerator.unwrap_model(accelerator.prepare(model))  # the forward wrapped as grpo_kit's policy's
    if loop.startswith("generate"):
        if loop == "generate_no_cudnn":
            torch.backends.cuda.enable_cudnn_sdp(False)
        return lambda ids, mask, config: prepared.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    draw = sample if loop == "lean" else StaticDecoder().sample
    cast_dtype = autocast_dtype(accelerator)

    def run(ids, mask, config):
        with weights_cast_once(prepared, device, cast_dtype):
            return draw(prepared, ids, mask, config)

    return run


def measure(args) -> dict:
    from transformers import GenerationConfig

    model = build(args.shape, args.vocab, args.device)
    run = sampler(args.child, model, args.device, args.precision)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(256, (args.batch, args.prompt), generator=generator).to(args.device)
    mask = torch.ones_like(ids)
    mask[: args.batch // 2, : args.prompt // 3] = 0  # half the prompts left-padded, as in a batch of mixed lengths
    cuda = args.device == "cuda"

    def timed(tokens: int) -> tuple[float, float | None]:  # seconds, and the peak MiB above the start
        config = GenerationConfig(
            max_new_tokens=tokens,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            pad_token_id=args.vocab - 2,
            eos_token_id=args.vocab - 1,
            suppress_tokens=[args.vocab - 1],  # every row runs every step
            disable_compile=True,
        )
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        started = time.perf_counter()
        with torch.no_grad():
            run(ids, mask, config)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        return seconds, (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else None

    cold, _ = timed(args.new_tokens)
    total_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    prefill, _ = timed(1)
    warm, peak = timed(args.new_tokens)
    if cuda:
        total_peak = max(total_peak, torch.cuda.max_memory_allocated() / 2**20)
    steps = args.new_tokens - 1
    return {
        "prefill_ms": 1e3 * prefill,
        "cold_ms_per_step": 1e3 * (cold - prefill) / steps,
        "warm_ms_per_step": 1e3 * (warm - prefill) / steps,
        "peak_mib": peak,
        "total_peak_mib": total_peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="0.5b")
    parser.add_argument("--vocab", type=int, default=REAL_VOCAB)
    parser.add_argument("--batch", type=int, default=32, help="rows sampled together (W4gpu: 32)")
    parser.add_argument("--prompt", type=int, default=110, help="prompt tokens (W4's: 20-200)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens of the long calls")
    parser.add_argument("--precision", choices=("bf16", "no"), default="bf16", help="accelerate's mixed precision")
    parser.add_argument("--loops", default=",".join(LOOPS), help=f"comma-separated, of: {', '.join(LOOPS)}")
    parser.add_argument("--timeout", type=float, default=90, help="seconds each loop's process may take")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: the loop this process measures
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args)))
        return
    loops = [loop.strip() for loop in args.loops.split(",")]
    if set(loops) - set(LOOPS):
        parser.error(f"--loops {args.loops}: choose from {', '.join(LOOPS)}")
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"decode_bench: {args.shape} {SHAPES[args.shape]}, vocab {args.vocab}, {args.batch} rows, prompts of "
        f"{args.prompt} (half left-padded), {args.new_tokens} new tokens, {args.precision}, {device_name}",
        flush=True,
    )
    results = {}
    for loop in loops:
        command = [sys.executable, __file__, "--child", loop] + [
            f"--{name.replace('_', '-')}={value}"
            for name, value in vars(args).items()
            if name in ("device", "shape", "vocab", "batch", "prompt", "new_tokens", "precision")
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            results[loop] = {"error": f"over {args.timeout:.0f} s"}
        else:
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                results[loop] = json.loads(lines[-1])
            else:
                results[loop] = {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        print(f"  {loop}: {results[loop]}", flush=True)
    header = f"{'prefill ms':>11} {'cold ms/step':>13} {'warm ms/step':>13} {'peak MiB':>9} {'total MiB':>9}"
    print(f"\n{'loop':20} {header}")
    for loop, result in results.items():
        if "error" in result:
            print(f"{loop:20} failed: {result['error']}")
            continue
        peaks = [result[name] for name in ("peak_mib", "total_peak_mib")]
        peaks = " ".join(f"{peak:>9,.0f}" if peak is not None else f"{'-':>9}" for peak in peaks)
        print(
            f"{loop:20} {result['prefill_ms']:11.1f} {result['cold_ms_per_step']:13.2f} "
            f"{result['warm_ms_per_step']:13.2f} {peaks}"
        )
    if args.json:
        settings = {name: str(value) for name, value in vars(args).items()}
        args.json.write_text(json.dumps({"device": device_name, "settings": settings, "loops": results}, indent=1))


if __name__ == "__main__":
    main()

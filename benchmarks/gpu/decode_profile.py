"""The lean sampling loop against `model.generate`, per decode step: wall time, aten ops and host syncs.

    python benchmarks/gpu/decode_profile.py --device cuda                     # Qwen2.5-0.5B's shape, bf16, as W4gpu
    python benchmarks/gpu/decode_profile.py --shape narrow --new-tokens 16    # on a CPU: op and sync counts

Both loops sample from the same model, built untrained from a config, with the same GenerationConfig (W4's: top-k
off, temperature 1, completions that do not end, so that every row runs every step), as each side of
benchmarks/race.py calls them:
- lean: grpo_kit_transformers' `sample`, on the model accelerate's `prepare` returns with bf16 mixed precision on
  a GPU (its forward wrapped in autocast) and unwrapped as generation.py unwraps it;
- generate: `model.generate` on that same model (TRL's call);
- bare generate: `model.generate` on the plain model inside `torch.autocast` (the bare loop's call).

A decode step's figures are the difference between two runs, of `--new-tokens` and of twice as many tokens, over
the extra tokens: the prompt's pass and the fixed costs cancel. "ops" are the aten calls that reach the dispatcher
below autograd and autocast (each is a kernel launch or a view on a GPU); "syncs" are the calls that read a
tensor's value on the host (`aten._local_scalar_dense`: `.item()`, `bool(tensor)`) and those whose output size
depends on values (`nonzero`), each a wait for the GPU on CUDA. On CUDA, `torch.cuda.set_sync_debug_mode` also
counts every synchronising call (the "CUDA syncs" column).
"""

import argparse
import contextlib
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from race import REAL_SHAPES, REAL_VOCAB  # noqa: E402 (race's top level imports only the standard library)

# "narrow": Qwen2.5-0.5B's depth, heads and vocabulary at a width a CPU runs fast, where a step's time is mostly
# the framework's per-op cost, as on a GPU.
SHAPES = REAL_SHAPES | {
    "narrow": dict(hidden_size=112, intermediate_size=128, num_hidden_layers=24, num_attention_heads=14)
}
SYNC_OPS = ("aten._local_scalar_dense.default", "aten.nonzero.default")


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


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
        model = Qwen2ForCausalLM(config)
    return model.eval()


def loops(model, device: str, precision: str):
    """The three ways of sampling, each a function of (prompt_ids, attention_mask, generation_config)."""
    from accelerate import Accelerator

    from grpo_kit_transformers.sampling import sample

    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=precision)
    prepared = accelerator.unwrap_model(accelerator.prepare(model))  # the forward wrapped as grpo_kit's policy's
    bf16 = precision == "bf16"
    autocast = torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def lean(ids, mask, config):
        return sample(prepared, ids, mask, config)[0]

    def generate(ids, mask, config):
        return prepared.generate(input_ids=ids, attention_mask=mask, generation_config=config)

    def generate_in_autocast(ids, mask, config):
        with autocast:
            return plain_generate(input_ids=ids, attention_mask=mask, generation_config=config)

    # `prepare` replaced the forward of `model` itself: the bare loop's model is one whose forward is the class's
    plain_generate = _plain_generate(model)
    return {"lean": lean, "generate": generate, "bare generate": generate_in_autocast}


def _plain_generate(model):
    def call(**kwargs):
        wrapped = model.__dict__.pop("forward", None)
        try:
            return model.generate(**kwargs)
        finally:
            if wrapped is not None:
                model.forward = wrapped

    return call


def measure(run, ids, mask, config_of, new_tokens: int, device: str, count: bool) -> dict:
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result = {}
    run(ids, mask, config_of(new_tokens))  # warm-up
    for tokens in (new_tokens, 2 * new_tokens):
        config = config_of(tokens)
        synchronize()
        started = time.perf_counter()
        run(ids, mask, config)
        synchronize()
        seconds = time.perf_counter() - started
        ops, cuda_syncs = Counter(), 0
        if count:
            with OpCounter() as counter:
                run(ids, mask, config)
            ops = counter.ops
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                run(ids, mask, config)
            torch.cuda.set_sync_debug_mode(0)
            cuda_syncs = sum("synchroniz" in str(warning.message) for warning in caught)
        result[tokens] = (seconds, ops, cuda_syncs)
    (short, short_ops, short_syncs), (long, long_ops, long_syncs) = result[new_tokens], result[2 * new_tokens]
    extra = Counter(long_ops)
    extra.subtract(short_ops)
    return {
        "ms": (long - short) / new_tokens * 1e3,
        "ops": sum(extra.values()) / new_tokens,
        "syncs": sum(extra[name] for name in SYNC_OPS) / new_tokens,
        "cuda syncs": (long_syncs - short_syncs) / new_tokens,
        "top": {name: count / new_tokens for name, count in extra.most_common(12)},
        "runs": ", ".join(f"{seconds:.2f} s for {tokens} tokens" for tokens, (seconds, *_) in result.items()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="0.5b")
    parser.add_argument("--vocab", type=int, default=REAL_VOCAB)
    parser.add_argument("--batch", type=int, default=32, help="completions sampled together (W4gpu: 32)")
    parser.add_argument("--prompt", type=int, default=110, help="prompt tokens (W4's: 20-200)")
    parser.add_argument("--new-tokens", type=int, default=64, help="decode steps of the shorter run")
    parser.add_argument("--no-count", action="store_true", help="time only: no op counts")
    parser.add_argument("--loops", default="lean,generate,bare generate", help="comma-separated")
    parser.add_argument(
        "--precision", choices=("bf16", "no"), default="bf16", help="accelerate's mixed precision (W4gpu: bf16)"
    )
    parser.add_argument("--top", action="store_true", help="also print each loop's most frequent ops per step")
    parser.add_argument(
        "--gpu-path",
        action="store_true",
        help="on a CPU, the lean loop as it runs on a GPU: SDPA over the cache's keys, not its CPU decode attention",
    )
    args = parser.parse_args()
    from transformers import GenerationConfig

    model = build(args.shape, args.vocab, args.device)
    if args.gpu_path:
        import grpo_kit_transformers.sampling as sampling

        sampling.attention_for_sampling = lambda model: contextlib.nullcontext(False)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(256, (args.batch, args.prompt), generator=generator).to(args.device)
    mask = torch.ones_like(ids)
    mask[: args.batch // 2, : args.prompt // 3] = 0  # half the prompts left-padded, as in a batch of mixed lengths

    def config_of(tokens):
        return GenerationConfig(
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

    chosen = args.loops.split(",")
    print(
        f"decode_profile: {args.shape} ({SHAPES[args.shape]}), vocab {args.vocab}, batch {args.batch}, prompt "
        f"{args.prompt}, {args.new_tokens} vs {2 * args.new_tokens} new tokens, {args.device}, {args.precision}"
        + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""),
        flush=True,
    )
    runs = loops(model, args.device, args.precision)
    rows = {}
    for name in chosen:
        with torch.no_grad():
            rows[name] = measure(
                runs[name], ids, mask, config_of, args.new_tokens, args.device, count=not args.no_count
            )
        print(f"  {name}: {rows[name]['ms']:.2f} ms per decode step ({rows[name]['runs']})", flush=True)
    print(f"\n{'loop':20} {'ms / step':>10} {'aten ops / step':>16} {'host syncs / step':>18} {'CUDA syncs':>11}")
    for name, row in rows.items():
        print(f"{name:20} {row['ms']:10.2f} {row['ops']:16.0f} {row['syncs']:18.1f} {row['cuda syncs']:11.1f}")
    if args.top:
        for name, row in rows.items():
            print(f"\n{name}: " + ", ".join(f"{op} {count:.0f}" for op, count in row["top"].items()))


if __name__ == "__main__":
    main()

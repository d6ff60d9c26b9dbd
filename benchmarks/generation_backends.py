"""Seconds per step with generation=transformers and with generation=vllm_server against the CPU test server, on the
embedded default, so that the server protocol's cost (HTTP, a weight sync after every step) is known.

    python benchmarks/generation_backends.py              # 40 steps each, interleaved twice; ~5 min on 2 cores
    python benchmarks/generation_backends.py --steps 20 --rounds 1

Each run is the README's main command (`+loss=dapo +reward=accuracy`) cut to --steps steps, in its own process,
the two backends taking turns. The figure is the median of `seconds_per_step` over each run's steps after the
first five (warm-up); for vllm_server it includes the test server's generation (transformers on CPU, in its own
process), the HTTP round trips and the weight sync, but not the server's start. The last line prints the ratio:
what the protocol costs over generating in the trainer's own process. On GPUs vLLM's engine makes generation far
faster than transformers; this measures only what the protocol adds.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BACKENDS = {
    "transformers": ["generation=transformers"],
    "vllm_server": ["generation=vllm_server", "generation.launch=test", "generation.base_url=http://127.0.0.1:8765"],
}
WARM_UP = 5


def seconds_per_step(backend: str, steps: int, folder: Path) -> float:
    run_dir = folder / f"{backend}-{len(list(folder.iterdir()))}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+loss=dapo",
            "+reward=accuracy",
            *BACKENDS[backend],
            f"trainer.max_steps={steps}",
            "trainer.save_model=false",
            "trainer.progress_bar=false",
            "trainer.logging_steps=1",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [line["seconds_per_step"] for line in lines if line.get("step", 0) > WARM_UP and "seconds_per_step" in line]
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results = {backend: [] for backend in BACKENDS}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for backend in BACKENDS:
                results[backend].append(seconds_per_step(backend, args.steps, Path(folder)))
                print(f"{backend:>13}: {results[backend][-1]:.3f} s/step", flush=True)
    medians = {backend: statistics.median(values) for backend, values in results.items()}
    print(
        f"\nmedian s/step  transformers {medians['transformers']:.3f}  vllm_server {medians['vllm_server']:.3f}  "
        f"ratio vllm_server/transformers {medians['vllm_server'] / medians['transformers']:.2f}x"
    )


if __name__ == "__main__":
    main()

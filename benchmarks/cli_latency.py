"""Wall seconds of what should answer at once: the CLI's help, `grpo-kit plugins`, a config error, `compose`, and
the first batch the accuracy reward scores.

    python benchmarks/cli_latency.py               # 5 fresh processes per command; ~1 min on 2 cores
    python benchmarks/cli_latency.py --repeats 9

Each command runs in a fresh process, so that it pays for every import it makes; the figures are the medians of
its wall seconds and of its CPU seconds (user + system), which other work on a shared machine changes less. The
last line is the reward's first batch: the embedded model's completions for 16 prompts x 8, scored by a fresh
Scorer with the accuracy reward (worker processes included), against a second batch scored by the same Scorer;
their difference is what the first step pays on top of any later one.
"""

import argparse
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -m grpo_kit --help": [sys.executable, "-m", "grpo_kit", "--help"],
    "grpo-kit plugins": [sys.executable, "-m", "grpo_kit.cli.commands", "plugins"],
    "python -m grpo_kit loss.epsilon=abc": [sys.executable, "-m", "grpo_kit", "loss.epsilon=abc"],
    "python -m grpo_kit +loss=nope": [sys.executable, "-m", "grpo_kit", "+loss=nope"],
    "import grpo_kit; grpo_kit.compose([])": [sys.executable, "-c", "import grpo_kit; grpo_kit.compose([])"],
}


def seconds(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of `command`, run in a fresh process."""
    cpu_before = _children_cpu_seconds()
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a config error exits 1
    return time.perf_counter() - start, _children_cpu_seconds() - cpu_before


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def first_reward_batch() -> None:
    """In this fresh process: seconds to score the first batch and the second, and the worker processes running
    after the first, printed as three numbers."""
    import multiprocessing

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_kit.embedded import sums as embedded
    from grpo_kit.plugins.registry import Registry
    from grpo_kit.rollout.scoring import Scorer

    path = embedded.model_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = embedded.build_task(32)
    torch.manual_seed(0)
    batches = []
    for half in (rows[:16], rows[16:]):
        prompts = [row["prompt"] for row in half for _ in range(8)]
        inputs = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
        output = model.generate(
            **inputs, do_sample=True, max_new_tokens=4, top_k=0, pad_token_id=tokenizer.pad_token_id
        )
        ids = output[:, inputs.input_ids.shape[1] :].tolist()
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        batches.append((prompts, texts, ids, {"solution": [row["solution"] for row in half for _ in range(8)]}))
    reward = Registry().build("reward", "accuracy", {})
    start = time.perf_counter()
    scorer = Scorer({"accuracy": reward})
    scorer(*batches[0])
    first = time.perf_counter() - start
    workers = len(multiprocessing.active_children())
    start = time.perf_counter()
    scorer(*batches[1])
    second = time.perf_counter() - start
    scorer.close()
    print(first, second, workers)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--first-reward-batch", action="store_true", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.first_reward_batch:
        return first_reward_batch()
    width = max(map(len, COMMANDS))
    for label, command in COMMANDS.items():
        wall, cpu = zip(*[seconds(command) for _ in range(args.repeats)])
        print(
            f"{label:<{width}}  {statistics.median(wall):5.2f} s wall (min {min(wall):.2f}, max {max(wall):.2f}), "
            f"{statistics.median(cpu):.2f} s CPU"
        )
    runs = []
    for _ in range(args.repeats):
        child = subprocess.run(
            [sys.executable, __file__, "--first-reward-batch"], capture_output=True, text=True, check=True
        )
        runs.append([float(value) for value in child.stdout.split()[-3:]])
    first, second, workers = (statistics.median(values) for values in zip(*runs))
    print(
        f"accuracy reward, first batch of 128: {first:.2f} s, second: {second:.2f} s, first-step extra: "
        f"{first - second:.2f} s, worker processes started: {workers:.0f}"
    )


if __name__ == "__main__":
    main()

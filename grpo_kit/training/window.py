"""The logging window: what each micro-batch adds to it, and the line logged from it every `logging_steps`."""

import math
import time

from grpo_kit.objective.objective import ObjectiveOutput


def add_micro_batch(window: dict[str, list[float]], batch_metrics: dict, out: ObjectiveOutput, accelerator) -> None:
    """A micro-batch's: the metrics of the generation batch it came from, then its loss and metrics, each the mean
    over every process."""
    for name, value in batch_metrics.items():
        window[name].append(value)
    window["loss/micro"].append(accelerator.gather(out.loss.detach().reshape(1)).mean().item())
    for name, value in out.metrics.items():
        window[name].append(accelerator.gather(value).nanmean().item())


# Logged as the largest value of the window, where every other metric is its mean (as TRL logs them).
WINDOW_MAXIMA = {"async/staleness/max"}


def summarise(window: dict[str, list[float]], step: int, accumulation: int, learning_rate: float) -> dict:
    """One logged line: the means over the logging window, and the loss of an optimizer step."""
    logged = {"step": step}
    for name, values in window.items():
        if name == "loss/micro":
            logged["loss"] = sum(values) / len(values) * accumulation  # a step's micro losses add up to its loss
        else:
            present = [value for value in values if not math.isnan(value)]
            if not present:
                logged[name] = math.nan
            elif name in WINDOW_MAXIMA:
                logged[name] = max(present)
            else:
                logged[name] = sum(present) / len(present)
    logged["learning_rate"] = learning_rate
    return logged


def token_counts(num_tokens: int, started: tuple[float, int]) -> dict:
    """TRL's num_tokens, and transformers' train_tokens_per_second: the tokens since training began (a resumed run:
    since it resumed, `started` = (when, num_tokens then)) over the seconds since."""
    when, tokens_then = started
    return {
        "num_tokens": num_tokens,
        "train_tokens_per_second": (num_tokens - tokens_then) / (time.perf_counter() - when),
    }

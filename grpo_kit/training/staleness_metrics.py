"""What each micro-step actually trains against, measured when it trains (docs/async.md, "Metrics"):
- `async/staleness/mean|max`: how many optimizer steps the weights being trained have taken since the weights that
  sampled the micro-batch's rows. Taken at every micro-step, not once when the batch is made: with
  num_iterations > 1 a batch's later passes are staler than its first, and under asynchronous generation a
  dynamic-sampling redraw is fresher than the batch it fills (each row keeps its own version);
- `async/kl_to_behaviour`: KL(behaviour || trained) per token, between the policy that sampled the tokens and the
  one being trained, when the sampler's log-probs are at hand (always with algorithm.forced_staleness).

Both are this process's values, as the asynchronous worker's timing is.
"""

import torch

from grpo_kit.contract.micro_batch import MicroBatch


def tracks_staleness(algorithm) -> bool:
    """Whether a run logs these: asynchronous generation, or forced staleness (None: off, 0 included)."""
    return algorithm.max_staleness > 0 or algorithm.forced_staleness is not None


def record_staleness(window, algorithm, micro_batch: MicroBatch, batch_version: int, steps_taken: int, out) -> None:
    """Into the logging window, what the micro-step just trained against (`out`: its ObjectiveOutput)."""
    if tracks_staleness(algorithm):
        measured = staleness_metrics(micro_batch, batch_version, steps_taken)
        for name, value in (measured | kl_to_behaviour(micro_batch, out.per_token_logps)).items():
            window[name].append(value)


def staleness_metrics(micro_batch: MicroBatch, batch_version: int, steps_taken: int) -> dict[str, float]:
    """The lag of the micro-batch's rows behind the weights that train on them now (`steps_taken` optimizer
    steps): their own versions where the rows carry them, else the generation batch's `batch_version`."""
    versions = micro_batch.weight_versions  # (B,) or None
    if versions is None:
        lag = float(steps_taken - batch_version)
        return {"async/staleness/mean": lag, "async/staleness/max": lag}
    lags = (steps_taken - versions).float()  # (B,)
    return {"async/staleness/mean": lags.mean().item(), "async/staleness/max": lags.max().item()}


def kl_to_behaviour(micro_batch: MicroBatch, trained_logps: torch.Tensor) -> dict[str, float]:
    """The k3 estimate of KL(behaviour || trained) over the micro-batch's trained tokens: with r = pi_trained /
    pi_behaviour on a token the behaviour policy sampled, r - 1 - log r is unbiased, never negative, and of low
    variance (Schulman, "Approximating KL divergence", 2020). Nothing when the sampler gave no log-probs."""
    sampling = micro_batch.sampling_per_token_logps  # (B, T)
    if sampling is None:
        return {}
    mask = micro_batch.loss_mask().bool()  # (B, T)
    log_ratio = (trained_logps.float() - sampling.float())[mask]  # (tokens,)
    k3 = torch.expm1(log_ratio) - log_ratio  # (tokens,)
    return {"async/kl_to_behaviour": k3.mean().item() if k3.numel() else float("nan")}

"""Helpers for testing grpo_kit and its plugins without a download: a tiny random model, a short run on it, loss
inputs."""

from grpo_kit.testing.models import build_tiny_model, build_tiny_reward_model
from grpo_kit.testing.runs import tiny_run
from grpo_kit.testing.tensors import loss_inputs, reduction

__all__ = ["build_tiny_model", "build_tiny_reward_model", "loss_inputs", "reduction", "tiny_run"]

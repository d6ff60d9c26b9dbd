"""Helpers for testing grpo_kit and its plugins without a download: a tiny random model, a registry per test."""

from grpo_kit.testing.models import build_tiny_model

__all__ = ["build_tiny_model"]

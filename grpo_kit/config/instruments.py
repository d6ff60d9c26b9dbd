"""The instruments' settings (docs/instruments.md), checked when a run is composed: shadow losses that can be
computed beside this run's, and gradient diagnostics that can read its gradients."""

from omegaconf import DictConfig

from grpo_kit.config.schema import SHADOW_GRADIENT_EVERY
from grpo_kit.contract.errors import ConfigError
from grpo_kit.plugins.registry import Registry


def check_instruments(cfg: DictConfig, registry: Registry, corrected: bool) -> None:
    """`corrected`: the run applies its rollout correction, which each shadow loss must accept too."""
    gradient_every = cfg.shadow[SHADOW_GRADIENT_EVERY]
    if not isinstance(gradient_every, int) or gradient_every < 0:
        raise ConfigError(
            f"shadow.gradient_every={gradient_every} must be a whole number of steps, 0 for no shadow gradients."
        )
    shadows = {name: node for name, node in cfg.shadow.items() if name != SHADOW_GRADIENT_EVERY}
    correction = registry.get("rollout_correction", cfg.rollout_correction.name).traits["level"]
    for name, node in shadows.items():
        accepted = registry.get("loss", node.name).traits["rollout_correction_levels"]
        if corrected and correction is not None and accepted is not None and correction not in accepted:
            raise ConfigError(
                f"shadow.{name}: loss {node.name} takes only {'/'.join(accepted)}-level rollout corrections, but this "
                f"run's rollout_correction={cfg.rollout_correction.name} is {correction}-level, so the shadow could "
                "not be computed on the trained tensors: drop it, or choose a correction it takes."
            )
    gradients = (shadows and gradient_every > 0) or cfg.diagnostics is not None
    if gradients and cfg.model.logits == "liger":
        raise ConfigError(
            "model.logits=liger fuses the loss into the output head, so no log-probs with a graph are left for "
            "shadow gradients or +diagnostics=gradient: use model.logits=chunked (the same memory saving, every "
            "instrument), or shadow.gradient_every=0 and no +diagnostics for shadow losses alone."
        )
    if cfg.diagnostics is not None:
        check_diagnostics(cfg.diagnostics)


def check_diagnostics(diagnostics: DictConfig) -> None:
    if diagnostics.sketch_size < 1:
        raise ConfigError(f"diagnostics.sketch_size={diagnostics.sketch_size} must be at least 1 (4096, say).")
    if diagnostics.groups_every < 0:
        raise ConfigError(f"diagnostics.groups_every={diagnostics.groups_every} must be 0 (no group split) or more.")
    if not 0.0 <= diagnostics.ema < 1.0:
        raise ConfigError(f"diagnostics.ema={diagnostics.ema} must lie in [0, 1): 0 keeps no history.")

"""Registers the built-in losses, exactly as a third-party distribution would.

Each loss is named by import path and imported only when a run builds it, so listing the plugins and composing a
run import no loss, nor torch. Their traits (grpo_kit.contract.kinds.TRAITS: the importance-sampling level a loss
wants, the rollout corrections it takes, whether its gradient survives any split into micro-batches) are declared
here and nowhere else: the core checks a run's choices with them before importing the class, and Registry.build
hands them to the built loss.
"""

import grpo_kit
from grpo_kit_losses.configs import CISPOConfig, ClippedConfig, SAPOConfig, VESPOConfig


@grpo_kit.hookimpl
def register_losses(register):
    invariant = {"accumulation_invariant": True}  # all but bnpo, which divides by the micro-batch's own tokens
    register("grpo", "grpo_kit_losses.grpo:GRPO", ClippedConfig, **invariant)
    register("bnpo", "grpo_kit_losses.bnpo:BNPO", ClippedConfig, importance_sampling_level="token")
    register("dr_grpo", "grpo_kit_losses.dr_grpo:DrGRPO", ClippedConfig, importance_sampling_level="token", **invariant)
    register("dapo", "grpo_kit_losses.dapo:DAPO", ClippedConfig, importance_sampling_level="token", **invariant)
    register("luspo", "grpo_kit_losses.luspo:LUSPO", ClippedConfig, importance_sampling_level="sequence", **invariant)
    register("cispo", "grpo_kit_losses.cispo:CISPO", CISPOConfig, importance_sampling_level="token", **invariant)
    register("sapo", "grpo_kit_losses.sapo:SAPO", SAPOConfig, **invariant)
    register(  # vespo folds a token-level correction ratio into its own sequence weight
        "vespo",
        "grpo_kit_losses.vespo:VESPO",
        VESPOConfig,
        importance_sampling_level="token",
        rollout_correction_levels=("token",),
        **invariant,
    )

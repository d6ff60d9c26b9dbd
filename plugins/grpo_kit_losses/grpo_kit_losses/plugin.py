"""Registers the built-in losses, exactly as a third-party distribution would."""

import grpo_kit
from grpo_kit_losses.bnpo import BNPO
from grpo_kit_losses.cispo import CISPO, CISPOConfig
from grpo_kit_losses.clipped import ClippedConfig
from grpo_kit_losses.dapo import DAPO
from grpo_kit_losses.dr_grpo import DrGRPO
from grpo_kit_losses.grpo import GRPO
from grpo_kit_losses.luspo import LUSPO
from grpo_kit_losses.sapo import SAPO, SAPOConfig
from grpo_kit_losses.vespo import VESPO, VESPOConfig


@grpo_kit.hookimpl
def register_losses(register):
    register("grpo", GRPO, ClippedConfig)
    register("bnpo", BNPO, ClippedConfig)
    register("dr_grpo", DrGRPO, ClippedConfig)
    register("dapo", DAPO, ClippedConfig)
    register("luspo", LUSPO, ClippedConfig)
    register("cispo", CISPO, CISPOConfig)
    register("sapo", SAPO, SAPOConfig)
    register("vespo", VESPO, VESPOConfig)

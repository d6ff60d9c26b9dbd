"""Registers the built-in importance-sampling levels and rollout corrections.

Each is named by import path and imported only when a run builds it, so listing the plugins and composing a run
import none of them, nor torch. Their `level`, which the core checks a run's choices with, is declared here and
nowhere else; Registry.build hands it to the built object.
"""

import grpo_kit
from grpo_kit_importance.configs import CorrectionConfig


@grpo_kit.hookimpl
def register_importance_sampling(register):
    register("token", "grpo_kit_importance.token:TokenLevel", level="token")
    register("sequence", "grpo_kit_importance.sequence:SequenceLevel", level="sequence")


@grpo_kit.hookimpl
def register_rollout_corrections(register):
    register("none", "grpo_kit_importance.no_correction:NoCorrection")
    register("token_truncate", "grpo_kit_importance.corrections:TokenTruncate", CorrectionConfig, level="token")
    register("token_mask", "grpo_kit_importance.corrections:TokenMask", CorrectionConfig, level="token")
    register(
        "sequence_truncate", "grpo_kit_importance.corrections:SequenceTruncate", CorrectionConfig, level="sequence"
    )
    register("sequence_mask", "grpo_kit_importance.corrections:SequenceMask", CorrectionConfig, level="sequence")

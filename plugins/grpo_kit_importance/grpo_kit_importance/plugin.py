"""Registers the built-in importance-sampling levels and rollout corrections."""

import grpo_kit
from grpo_kit_importance.corrections import (
    CorrectionConfig,
    SequenceMask,
    SequenceTruncate,
    TokenMask,
    TokenTruncate,
)
from grpo_kit_importance.no_correction import NoCorrection
from grpo_kit_importance.sequence import SequenceLevel
from grpo_kit_importance.token import TokenLevel


@grpo_kit.hookimpl
def register_importance_sampling(register):
    register("token", TokenLevel)
    register("sequence", SequenceLevel)


@grpo_kit.hookimpl
def register_rollout_corrections(register):
    register("none", NoCorrection)
    register("token_truncate", TokenTruncate, CorrectionConfig)
    register("token_mask", TokenMask, CorrectionConfig)
    register("sequence_truncate", SequenceTruncate, CorrectionConfig)
    register("sequence_mask", SequenceMask, CorrectionConfig)

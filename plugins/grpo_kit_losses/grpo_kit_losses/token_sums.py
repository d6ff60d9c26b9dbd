"""What a loss that sums per-token contributions says about sequence-level importance weights."""

SUMS_TOKENS_ADVICE = (
    "sums per-token contributions, so with one importance weight per sequence it weights each sequence by its "
    "length instead of optimising the per-sequence objective (for GSPO use +loss=grpo importance_sampling=sequence)"
)

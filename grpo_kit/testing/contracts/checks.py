"""What the suites of tensor kinds share: the two importance-sampling levels, random completions, and a comparison
whose message says what was compared."""

import torch

TOKEN, SEQUENCE = "token", "sequence"


def assert_close(actual, expected, what: str, **tolerances) -> None:
    """torch.testing.assert_close, its message led by what was compared."""
    torch.testing.assert_close(actual, expected, msg=lambda detail: f"{what}: {detail}", **tolerances)


def random_completions(seed: int, lengths=(6, 3, 1, 5)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs (B, T), a mask with the given numbers of active tokens, advantages (B, 1) of both signs."""
    generator = torch.Generator().manual_seed(seed)
    length = max(max(lengths), 1)
    per_token_logps = -(torch.rand(len(lengths), length, generator=generator) * 2.0 + 0.05)
    mask = (torch.arange(length).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    advantages = torch.randn(len(lengths), 1, generator=generator)
    advantages[0], advantages[1] = advantages[0].abs() + 0.1, -advantages[1].abs() - 0.1
    return per_token_logps, mask, advantages

"""The training loop and what it owns: setup, the generation batch, state, optimizers."""

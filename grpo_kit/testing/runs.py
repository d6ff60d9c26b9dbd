"""The overrides of a short real training run on a tiny model, for tests of plugins and of the trainer."""

from pathlib import Path


def tiny_run(model_dir: str | Path, *overrides: str) -> list[str]:
    """Three quick steps on a `build_tiny_model` directory, for `grpo_kit.compose`; later `overrides` win.

    The learning rate is high so that three steps visibly change the weights, and every step is logged (model=hf
    keeps TRL's logging_steps of 10).
    """
    return [
        f"model.name_or_path={model_dir}",
        "data.num_examples=64",
        "generation.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.max_steps=3",
        "trainer.learning_rate=1e-2",
        "trainer.progress_bar=false",
        "trainer.logging_steps=1",
        *overrides,
    ]

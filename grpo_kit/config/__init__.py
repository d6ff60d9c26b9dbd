"""The run's config: schema dataclasses, Hydra composition and presets, compatibility checks."""

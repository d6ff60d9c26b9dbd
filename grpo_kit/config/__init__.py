"""The run's config: its schema (dataclasses), the overrides' checks, the presets, Hydra composition, compatibility
checks."""

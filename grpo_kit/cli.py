"""`python -m grpo_kit OVERRIDES...`: a Hydra app that composes the run and trains it."""

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import OverrideParseException

from grpo_kit.compatibility import ConfigError
from grpo_kit.config import PRIMARY_CONFIG, check_choices, store_configs, with_presets
from grpo_kit.plugins import PluginError, Registry
from grpo_kit.scoring import RewardError

log = logging.getLogger("grpo_kit")


def main() -> None:
    try:
        registry = Registry()
        overrides = [arg for arg in sys.argv[1:] if "=" in arg and not arg.startswith("-")]
        check_choices(overrides, registry)
        sys.argv += with_presets(overrides)[len(overrides) :]
    except PluginError as error:
        sys.exit(f"error: {error}")
    except OverrideParseException:
        pass  # Hydra reports a malformed override itself, with its position
    store_configs(registry)

    @hydra.main(version_base="1.3", config_path=None, config_name=PRIMARY_CONFIG)
    def run(cfg) -> None:
        from grpo_kit.trainer import train  # torch and transformers load only once the config is valid

        try:
            train(cfg, HydraConfig.get().runtime.output_dir, registry)
        except (PluginError, ConfigError, RewardError, FileExistsError) as error:
            log.error("%s", error)
            sys.exit(1)

    run()

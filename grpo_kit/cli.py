"""`python -m grpo_kit OVERRIDES...`: a Hydra app that composes the run and trains it."""

import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.errors import OverrideParseException

from grpo_kit.compatibility import ConfigError
from grpo_kit.config import PRIMARY_CONFIG, check_choices, store_configs, with_presets
from grpo_kit.plugins import PluginError, Registry
from grpo_kit.report import final_reward
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
    def run(cfg) -> float | None:
        """Train one run; return its final reward (the mean of the last tenth of logged steps) for sweepers."""
        from grpo_kit.trainer import train  # torch and transformers load only once the config is valid

        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        try:
            train(cfg, run_dir, registry)
        except Exception as error:
            if hydra_cfg.mode != RunMode.MULTIRUN:
                if isinstance(error, EXPECTED_ERRORS):
                    log.error("%s", error)
                    sys.exit(1)
                raise
            # In a sweep, one failed run is recorded and the others go on.
            (run_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
            log.error("This run failed (see %s): %s", run_dir / "error.txt", error)
            return None
        return final_reward(run_dir)

    run()


EXPECTED_ERRORS = (PluginError, ConfigError, RewardError, FileExistsError)


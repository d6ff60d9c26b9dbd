"""Composition: every installed plugin's config is a Hydra group option with typed, checked fields."""

import re
import subprocess
import sys

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import grpo_kit
from grpo_kit.config.compose import SINGLE_CHOICE_KINDS, with_presets
from grpo_kit.config.overrides import check_a_reward_may_be_chosen, check_choices
from grpo_kit.config.schema import DEFAULT_CHOICES, under_current_names
from grpo_kit.contract.errors import ConfigError, PluginError
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.training.builders import build_rewards

SET_BY_EMBEDDED_PRESET = {("generation", "num_generations"), ("generation", "max_completion_length")}


def every_option(registry):
    for kind in SINGLE_CHOICE_KINDS:
        for name in registry.names(kind):
            prefix = "+" if kind == "loss" else ""
            yield kind, name, [f"{prefix}{kind}={name}"]
    for name in registry.names("reward"):
        yield "reward", name, [f"+reward={name}"]


def test_every_registered_option_composes(registry):
    options = list(every_option(registry))
    assert len(options) >= 7
    for kind, name, overrides in options:
        cfg = grpo_kit.compose(overrides, registry)
        if kind == "reward":
            assert name in cfg.reward and cfg.reward[name].weight == 1.0
        else:
            assert cfg[kind].name == name
            plugin_config = registry.get(kind, name).config
            composed = OmegaConf.to_container(cfg[kind], resolve=False)  # a default may be an interpolation
            for field, default in OmegaConf.to_container(OmegaConf.structured(plugin_config)).items():
                if (kind, field) not in SET_BY_EMBEDDED_PRESET:
                    assert composed[field] == default, (kind, name, field)


def test_defaults_and_default_loss(registry, caplog):
    with caplog.at_level("INFO"):
        cfg = grpo_kit.compose([], registry)
    assert cfg.loss.name == "dapo"
    assert "loss: dapo, the default (choose another with +loss=NAME)" in caplog.text
    for kind, name in DEFAULT_CHOICES.items():
        assert cfg[kind].name == name


def test_only_the_main_process_calls_the_loss_the_default(registry, caplog, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # as torchrun and accelerate launch set it in the second process
    with caplog.at_level("INFO"):
        grpo_kit.compose([], registry)
    assert "the default" not in caplog.text


def test_a_forgotten_reward_is_refused_before_hydra_composes(tmp_path, monkeypatch):
    from grpo_kit.cli import main as cli

    monkeypatch.setattr(sys, "argv", ["grpo_kit", "+loss=grpo", f"hydra.run.dir={tmp_path / 'run'}"])
    monkeypatch.setattr(cli, "store_configs", lambda registry: pytest.fail("Hydra was set up"))
    with pytest.raises(SystemExit, match=r"^error: No reward selected: add \+reward=NAME \(installed: accuracy, "):
        cli.main()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides",
    [["+reward=accuracy"], ["+reward@reward.b=python"], ["+experiment=dapo"], ["model=hf"], ["hydra/sweeper=basic"]],
)
def test_a_reward_that_a_preset_or_sweeper_may_add_is_left_to_hydra(registry, overrides):
    check_a_reward_may_be_chosen(overrides, registry)


@pytest.mark.parametrize("named", ["+loss=dapo", "loss=dapo"])
def test_a_loss_the_command_line_names_is_not_called_the_default(registry, caplog, named):
    with caplog.at_level("INFO"):
        grpo_kit.compose([named], registry)
    assert "the default" not in caplog.text


def test_plugin_fields_are_options(registry):
    cfg = grpo_kit.compose(
        ["+loss=grpo", "loss.epsilon=0.3", "advantage=group", "generation.temperature=0.7"], registry
    )
    assert cfg.loss.epsilon == 0.3 and cfg.generation.temperature == 0.7


def test_several_rewards_with_weights(registry):
    cfg = grpo_kit.compose(["+reward=[accuracy]", "reward.accuracy.weight=0.5"], registry)
    assert list(cfg.reward) == ["accuracy"] and cfg.reward.accuracy.weight == 0.5


BUILT_IN_LOSSES = {"bnpo", "cispo", "dapo", "dr_grpo", "grpo"}


def listed_as_installed(message: str) -> set[str]:
    """The names a message lists as installed: the built-in ones, and whatever else the user has installed."""
    return set(re.search(r"\(installed: ([^)]*)\)", message).group(1).split(", "))


def test_unknown_plugin_lists_installed_ones(installed):
    with pytest.raises(PluginError, match=r"No loss plugin named 'nope' is installed \(installed: ") as error:
        grpo_kit.compose(["+loss=nope"], installed)
    assert BUILT_IN_LOSSES <= listed_as_installed(str(error.value))
    with pytest.raises(PluginError, match=r"No advantage plugin named 'grup'"):
        grpo_kit.compose(["advantage=grup"], installed)


def test_misspelled_field_is_rejected_by_name(registry):
    with pytest.raises(ConfigError, match=r"'epsilonn' is not an option of loss dapo.*Did you mean 'loss.epsilon'"):
        grpo_kit.compose(["+loss=dapo", "loss.epsilonn=0.3"], registry)
    with pytest.raises(ConfigError, match=r"'learning_rat' is not .* Did you mean 'trainer.learning_rate'"):
        grpo_kit.compose(["trainer.learning_rat=0.1"], registry)


@pytest.mark.parametrize(
    "override, message",
    [
        ("loss.epsilonn=0.3", r"'epsilonn' is not an option of loss dapo, .* Did you mean 'loss.epsilon' or"),
        ("trainer.max_step=10", r"'max_step' is not an option of trainer, .* Did you mean 'trainer.max_steps' or"),
        ("reward.accuracy.wieght=2", r"'wieght' is not an option of reward.accuracy, .* mean 'reward.accuracy.weight'"),
        (
            "reward.accurcy.weight=2",
            r"no reward the run can select is named 'accurcy', .* Did you mean 'reward.accuracy'",
        ),
        ("model.lora.rr=8", r"'rr' is not an option of model.lora, .* Did you mean 'model.lora.r'"),
        ("+trainer.max_step=10", r"'max_step' is not an option of trainer, .* Did you mean 'trainer.max_steps' or"),
        (
            "+loss.alpah=0.5",
            r"'alpah' is not an option of loss dapo, .* The options of loss: delta, epsilon, epsilon_high",
        ),
    ],
)
def test_the_cli_refuses_a_misspelt_option_at_once_with_the_closest_ones(
    tmp_path, monkeypatch, capsys, override, message
):
    from grpo_kit.cli import main as cli

    monkeypatch.setattr(sys, "argv", ["grpo_kit", "+reward=accuracy", override, f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert re.match(rf"error: {re.escape(override)}: {message}", str(exit_.value.code))
    assert "To append" not in str(exit_.value.code) + capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides",
    [
        ["+loss=grpo", "loss.epsilon=0.3", "+reward=[accuracy,think_format]", "reward.think_format.weight=0.5"],
        ["+experiment=dapo", "loss.epsilon_high=0.3"],
        ["model.name_or_path=m", "rollout_correction.max=5"],  # model=hf chooses a rollout correction
        ["-m", "+sweep/losses=grpo,dapo", "loss.epsilon=0.3", "hydra.run.dir=out", "+hydra.job.env_set.A=1"],
        ["+reward@reward.brevity=python", "reward.brevity.weight=2"],
        ["data.chat_template_kwargs={enable_thinking:false}", "+data.chat_template_kwargs.enable_thinking=false"],
        [
            "+model.model_init_kwargs.dtype=bfloat16",
            "+trainer.lr_scheduler_kwargs.num_cycles=2",
            "+generation.generation_kwargs.foo=1",
            "+trainer.gradient_checkpointing_kwargs.use_reentrant=true",
        ],
    ],
)
def test_options_that_exist_and_keys_that_are_free_pass_the_check(registry, overrides):
    check_choices([override for override in overrides if "=" in override], registry)


def test_wrong_type_is_rejected(registry):
    with pytest.raises(ConfigCompositionException, match="epsilon"):
        grpo_kit.compose(["+loss=dapo", "loss.epsilon=wide"], registry)


def test_cli_composes_the_same_config(registry):
    overrides = ["+loss=grpo", "+reward=accuracy", "loss.epsilon=0.25", "seed=3"]
    printed = subprocess.run(
        [sys.executable, "-m", "grpo_kit", *overrides, "--cfg", "job"], capture_output=True, text=True, check=True
    ).stdout
    assert yaml.safe_load(printed) == OmegaConf.to_container(grpo_kit.compose(overrides, registry))


def test_cli_rejects_unknown_plugin_before_building_anything(installed, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "grpo_kit", "+loss=nope", "+reward=accuracy", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "No loss plugin named 'nope' is installed (installed: " in result.stderr
    assert BUILT_IN_LOSSES <= listed_as_installed(result.stderr)
    assert not (tmp_path / "run").exists()


def test_the_default_loss_composes_as_if_named_and_takes_options(registry):
    unnamed, named = grpo_kit.compose([], registry), grpo_kit.compose(["+loss=dapo"], registry)
    assert OmegaConf.to_container(unnamed) == OmegaConf.to_container(named)
    cfg = grpo_kit.compose(["loss.epsilon_high=0.28"], registry)
    assert (cfg.loss.name, cfg.loss.epsilon_high) == ("dapo", 0.28)


def test_a_loss_is_chosen_with_or_without_plus_in_runs_and_sweeps():
    overrides = ["+loss=grpo,dapo", "+importance_sampling=sequence", "+reward=accuracy", "+reward@reward.b=python"]
    assert with_presets(overrides) == ["loss=grpo,dapo", "importance_sampling=sequence", *overrides[2:]]


def test_cli_prints_the_default_loss_with_its_options(tmp_path):
    printed = subprocess.run(
        [sys.executable, "-m", "grpo_kit", "+reward=accuracy", "loss.epsilon_high=0.28", "--cfg", "job"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert yaml.safe_load(printed)["loss"] == {"name": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "delta": None}


def test_a_missing_default_loss_says_how_to_choose_one(installed, monkeypatch):
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGINS", "loss:dapo")
    registry = Registry(plugin_manager())
    with pytest.raises(
        PluginError,
        match=r"No loss plugin selected, and the default 'dapo' is not installed: choose "
        r"one with \+loss=NAME \(installed: ",
    ) as error:
        grpo_kit.compose([], registry)
    listed = listed_as_installed(str(error.value))
    assert BUILT_IN_LOSSES - {"dapo"} <= listed and "dapo" not in listed
    assert grpo_kit.compose(["+loss=grpo"], registry).loss.name == "grpo"


def test_unknown_top_level_key_is_rejected_with_the_closest_one(registry):
    with pytest.raises(
        ConfigError,
        match=r"^\+hooks=dynamic_sampling: 'hooks' is not a setting of a grpo_kit run, so "
        r"nothing would read it. Did you mean 'hook'\? The top-level keys are: "
        r"advantage, algorithm, data, diagnostics, environment, eval, experiment, generation, hook, ",
    ):
        grpo_kit.compose(["+hooks=dynamic_sampling"], registry)
    with pytest.raises(ConfigError, match=r"'rewards' is not a setting.*Did you mean 'reward'\?"):
        check_choices(["+reward@rewards.brevity=python"], registry)
    with pytest.raises(ConfigError, match=r"'sed' is not a setting.*Did you mean 'seed'\?"):
        check_choices(["sed=3"], registry)


def test_hydra_keys_and_preset_groups_are_top_level_keys(registry):
    check_choices(
        [
            "hydra.run.dir=out",
            "hydra/launcher=local_parallel",
            "~hydra.callbacks.report",
            "+experiment=dapo",
            "+sweep/losses=grpo",
            "model=hf",
            "data.path=x.jsonl",
            "+reward@reward.brevity=python",
        ],
        registry,
    )


def test_cli_rejects_an_unknown_top_level_key_with_its_message_only(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "grpo_kit", "+hooks=dynamic_sampling", "+reward=accuracy", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: +hooks=dynamic_sampling: 'hooks' is not a setting of a grpo_kit run")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


NESTED_OPTIONS = """
    from dataclasses import dataclass, field
    import grpo_kit

    @dataclass
    class Schedule:
        start: float = 0.1
        stop: float = 0.2

    @dataclass
    class ScheduledConfig(grpo_kit.RewardConfig):
        schedule: Schedule = field(default_factory=Schedule)

    class Scheduled:
        def __init__(self, config):
            self.config = config

        def __call__(self, prompts, completions, completion_ids, **columns):
            return [self.config.schedule.stop] * len(completions)

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("scheduled", Scheduled, ScheduledConfig)
"""


def test_nested_dataclass_options_reach_the_plugin_as_dataclasses(local_plugin):
    module = local_plugin("nested_options", NESTED_OPTIONS)
    registry = Registry(plugin_manager(local_modules=[module]))
    cfg = grpo_kit.compose(["+reward=scheduled", "reward.scheduled.schedule.stop=0.5"], registry)
    config = build_rewards(cfg, registry)[0]["scheduled"].config
    schedule_class = type(registry.get("reward", "scheduled").config().schedule)
    assert config.schedule == schedule_class(start=0.1, stop=0.5)


def test_a_plugin_is_placed_under_a_key_of_its_own(registry, local_plugin):
    module = local_plugin(
        "two_functions",
        """
        def brevity(prompts, completions, completion_ids, **columns):
            return [-len(text) for text in completions]

        def scaled_length(prompts, completions, completion_ids, scale, **columns):
            return [scale * len(text) for text in completions]
    """,
    )
    cfg = grpo_kit.compose(
        [
            "+reward@reward.brevity=python",
            f"reward.brevity.function={module}:brevity",
            "reward.brevity.weight=0.5",
            "+reward@reward.length=python",
            f"reward.length.function={module}:scaled_length",
            "reward.length.kwargs={scale:3}",
            "+reward=accuracy",
        ],
        registry,
    )
    assert [(key, node.name) for key, node in cfg.reward.items()] == [
        ("brevity", "python"),
        ("length", "python"),
        ("accuracy", "accuracy"),
    ]
    functions, weights = build_rewards(cfg, registry)
    assert list(functions) == ["brevity", "length", "accuracy"] and weights.tolist() == [0.5, 1.0, 1.0]
    assert functions["brevity"](["p"], ["abcd"], [[1]]) == [-4]
    assert functions["length"](["p"], ["abcd"], [[1]]) == [12]


def test_an_option_without_a_default_is_named_when_not_set(local_plugin):
    module = local_plugin(
        "required_option",
        """
        from dataclasses import dataclass
        import grpo_kit
        from grpo_kit_advantages.group import GroupAdvantage

        @dataclass
        class ScaleConfig:
            scale: float

        @grpo_kit.hookimpl
        def register_advantages(register):
            register("scaled", GroupAdvantage, ScaleConfig)
    """,
    )
    registry = Registry(plugin_manager(local_modules=[module]))
    cfg = grpo_kit.compose(["advantage=scaled"], registry)
    with pytest.raises(
        ConfigError,
        match=r"The advantage plugin 'scaled' \(local module required_option\) needs its "
        r"option scale, which has no default: set it with advantage.scale=VALUE",
    ):
        grpo_kit.build_advantage(cfg, registry)


@pytest.mark.parametrize(
    ("old", "new"),
    [("rollouts.save=true", "rollout_files.save=true"), ("model.length_groups=false", "model.passes_by_length=false")],
)
def test_a_renamed_option_is_refused_with_its_new_name(registry, old, new):
    with pytest.raises(ConfigError, match=f"now called .*write {re.escape(new.split('=')[0])} instead"):
        grpo_kit.compose([old], registry)


def test_a_config_saved_under_old_names_reads_under_the_new_ones():
    saved = {"model": {"length_groups": False, "logits": "full"}, "rollouts": {"save": True, "replay": None}}
    assert under_current_names(saved) == {
        "model": {"passes_by_length": False, "logits": "full"},
        "rollout_files": {"save": True, "replay": None},
    }
    assert "rollouts" in saved, "the saved config itself is left as it was"

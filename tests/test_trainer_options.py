"""The trainer options TRL users bring (optim, optim_args, warmup_steps, lr_scheduler_kwargs, run_name, project,
save_only_model) and the token counts TRL logs (num_tokens, train_tokens_per_second)."""

import importlib.util
import json

import pytest
import torch
from accelerate import Accelerator
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import get_scheduler
from transformers.optimization import Adafactor

import grpo_kit
from grpo_kit.config.schema import TrainerConfig
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.pipeline import Run
from grpo_kit.outputs.trackers import TrackerLogger, accelerate_trackers, check_trackers
from grpo_kit.testing import build_tiny_model, tiny_run
from grpo_kit.training.lifecycle import Stopped
from grpo_kit.training.optimizers import build_optimizer, build_scheduler


@pytest.fixture
def registry(digits_registry):
    return digits_registry


def trainer(**options):
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), options)


@pytest.fixture
def unloadable_model(tmp_path):
    """A folder that passes for a saved model until transformers tries to load it."""
    (tmp_path / "unloadable").mkdir()
    (tmp_path / "unloadable" / "config.json").write_text("{}")
    return tmp_path / "unloadable"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny")))


# -- optimizers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, optimizer_class, expected",
    [
        ("adamw_torch", torch.optim.AdamW, {"betas": (0.8, 0.9), "eps": 1e-5, "fused": None}),
        ("adamw_torch_fused", torch.optim.AdamW, {"betas": (0.8, 0.9), "eps": 1e-5, "fused": True}),
        ("adafactor", Adafactor, {"relative_step": False, "scale_parameter": False}),
        ("sgd", torch.optim.SGD, {"momentum": 0}),
    ],
)
def test_each_name_builds_transformers_optimizer(model, name, optimizer_class, expected):
    t = trainer(optim=name, learning_rate=3e-4, adam_beta1=0.8, adam_beta2=0.9, adam_epsilon=1e-5)
    optimizer = build_optimizer(t, model)
    assert type(optimizer) is optimizer_class
    assert optimizer.defaults["lr"] == 3e-4
    assert {key: optimizer.defaults[key] for key in expected} == expected


def test_the_default_is_trls_fused_adamw_and_it_steps_on_the_cpu(model):
    optimizer = build_optimizer(trainer(), model)
    assert trainer().optim == "adamw_torch_fused" and optimizer.defaults["fused"] is True
    model.lm_head.weight.grad = torch.ones_like(model.lm_head.weight)
    before = model.lm_head.weight.detach().clone()
    optimizer.step()
    optimizer.zero_grad()
    assert not torch.equal(before, model.lm_head.weight)


def test_optim_args_reach_the_optimizer(model):
    optimizer = build_optimizer(trainer(optim="sgd", optim_args="momentum=0.9, nesterov=true"), model)
    assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["nesterov"] is True


@pytest.mark.parametrize(
    "name, optim_args, unused",
    [
        ("adamw_torch", "momentum=0.9", "momentum"),
        ("sgd", "momentum=0.9,betas=1", "betas"),
        ("sgd", "weight_decay=0.1", "weight_decay"),
    ],
)
def test_optim_args_the_optimizer_would_ignore_are_refused(model, name, optim_args, unused):
    # transformers drops them without a word
    with pytest.raises(ConfigError, match=f"optim_args: {unused}.* would have no effect on {name}"):
        build_optimizer(trainer(optim=name, optim_args=optim_args), model)


def test_weight_decay_spares_biases_and_norm_weights_as_in_transformers(model):
    optimizer = build_optimizer(trainer(weight_decay=0.1), model)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    decayed, spared = ([names[id(p)] for p in group["params"]] for group in optimizer.param_groups)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
    assert spared and all("norm" in name or name.endswith("bias") for name in spared)
    assert "lm_head.weight" in decayed or "model.embed_tokens.weight" in decayed
    assert len(decayed) + len(spared) == len(names)


@pytest.mark.parametrize("name", ["adamw_nope", "lomo", "schedule_free_adamw", "galore_adamw"])
def test_an_unknown_or_unsupported_optimizer_fails_before_the_model_is_loaded(
    registry, unloadable_model, tmp_path, name
):
    cfg = grpo_kit.compose(tiny_run(unloadable_model, "+reward=digits", f"trainer.optim={name}"), registry)
    message = "adamw_torch_fused, adamw_torch_xla" if name == "adamw_nope" else "training loop does not do"
    with pytest.raises(ConfigError, match=f"trainer.optim={name} .*{message}"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_an_8bit_optimizer_without_bitsandbytes_says_what_to_install(model):
    if importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed")
    with pytest.raises(ConfigError, match="trainer.optim=adamw_8bit: .*pip install -U bitsandbytes"):
        build_optimizer(trainer(optim="adamw_8bit"), model)


# -- schedules -----------------------------------------------------------------------------------------------------


def learning_rates(scheduler, steps):
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return rates


def transformers_rates(name, warmup, steps=10, **options):
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    return learning_rates(get_scheduler(name, optimizer, warmup, steps, scheduler_specific_kwargs=options), steps)


@pytest.mark.parametrize(
    "options, warmup",
    [
        ({"warmup_steps": 3}, 3),
        ({"warmup_steps": 3, "warmup_ratio": 0.5}, 3),  # warmup_steps wins
        ({"warmup_steps": 0.25}, 3),  # below 1: a share of the steps, rounded up, as in transformers
        ({"warmup_ratio": 0.5}, 5),
    ],
)
def test_warmup_steps_as_in_transformers(options, warmup):
    t = trainer(learning_rate=1.0, **options)
    scheduler = build_scheduler(t, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 10)
    assert learning_rates(scheduler, 10) == pytest.approx(transformers_rates("linear", warmup))


def test_lr_scheduler_kwargs_reach_the_schedule():
    t = trainer(learning_rate=1.0, lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 1.0}, warmup_steps=2)
    scheduler = build_scheduler(t, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 10)
    rates = learning_rates(scheduler, 10)
    assert rates == pytest.approx(transformers_rates("cosine", 2, num_cycles=1.0))
    assert rates != pytest.approx(transformers_rates("cosine", 2))  # a whole cosine, not half of one


@pytest.mark.parametrize(
    "schedule, option, message",
    [
        ("cosine", "trainer.lr_scheduler_kwargs={cycles:2}", "unexpected keyword argument 'cycles'"),
        ("constant_with_warmup", "trainer.lr_scheduler_kwargs={num_cycles:2}", "takes no trainer.lr_scheduler_kwargs"),
        ("constant", "trainer.warmup_steps=2", "has no warmup: use constant_with_warmup"),
    ],
)
def test_schedule_options_that_would_do_nothing_fail_before_the_model_is_loaded(
    registry, unloadable_model, tmp_path, schedule, option, message
):
    overrides = [f"trainer.lr_scheduler_type={schedule}", option]
    cfg = grpo_kit.compose(tiny_run(unloadable_model, "+reward=digits", *overrides), registry)
    with pytest.raises(ConfigError, match=message):
        grpo_kit.train(cfg, tmp_path / "run", registry)


# -- trackers ------------------------------------------------------------------------------------------------------


def test_wandb_runs_under_the_project_and_run_name_given(tmp_path, fresh_accelerate_state, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = OmegaConf.create({"trainer": trainer(project="my-project", run_name="lr-3e-4")})
    accelerator = Accelerator(cpu=True, log_with=accelerate_trackers(check_trackers(["wandb"]), cfg.trainer, tmp_path))
    run, logger = Run(cfg, tmp_path, accelerator, model=None, tokenizer=None, max_steps=1), TrackerLogger()
    logger.on_train_start(run=run)
    try:
        wandb_run = accelerator.get_tracker("wandb", unwrap=True)
        assert (wandb_run.project, wandb_run.name) == ("my-project", "lr-3e-4")
    finally:
        logger.on_train_end(run=run)


def tracked(tiny_model, *extra):
    return tiny_run(
        tiny_model,
        "+reward=digits",
        "trainer.max_steps=2",
        "trainer.logging_steps=1",
        "trainer.report_to=[tensorboard]",
        *extra,
    )


def test_tensorboard_names_the_run_by_its_folder(registry, tiny_model, tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    overrides = tracked(tiny_model, "trainer.project=my-project", "trainer.run_name=lr-3e-4")
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    events = event_accumulator.EventAccumulator(str(tmp_path / "run" / "trackers" / "my-project" / "lr-3e-4"))
    events.Reload()
    assert [event.step for event in events.Scalars("reward")] == [1, 2]


# -- save_only_model -----------------------------------------------------------------------------------------------


EVERY_STEP_SAVED = ("+reward=digits", "trainer.save_steps=1", "trainer.save_total_limit=5")


def test_save_only_model_checkpoints_hold_the_weights_and_refuse_to_resume(registry, tiny_model, tmp_path):
    overrides = tiny_run(tiny_model, *EVERY_STEP_SAVED, "trainer.save_only_model=true")
    run_dir = tmp_path / "run"
    grpo_kit.train(grpo_kit.compose(overrides, registry), run_dir, registry)
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    assert [c.name for c in checkpoints] == ["step-000001", "step-000002", "step-000003"]
    assert all(sorted(p.name for p in c.iterdir()) == ["manifest.json", "metrics.jsonl", "model"] for c in checkpoints)
    last, final = (
        load_file(checkpoints[-1] / "model" / "model.safetensors"),
        load_file(run_dir / "model" / "model.safetensors"),
    )
    assert all(torch.equal(last[name], final[name]) for name in final)

    for resume in ("auto", str(checkpoints[0])):
        with pytest.raises(
            ConfigError, match=r"holds the model's weights only.*model.name_or_path=.*step-00000\d/model"
        ):
            grpo_kit.train(grpo_kit.compose([*overrides, f"trainer.resume={resume}"], registry), run_dir, registry)
    # Its weights start a new run.
    fresh = [*overrides[1:], f"model.name_or_path={checkpoints[0] / 'model'}", "trainer.max_steps=1"]
    grpo_kit.train(grpo_kit.compose(fresh, registry), tmp_path / "from-weights", registry)


def test_a_run_stopped_early_saves_a_whole_checkpoint_even_with_save_only_model(local_plugin, tiny_model, tmp_path):
    module = local_plugin(
        "interrupt_at_2",
        """
        import os, signal
        import grpo_kit

        @grpo_kit.hookimpl
        def on_step_end(run, step, metrics):
            if step == 2:
                os.kill(os.getpid(), signal.SIGINT)

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("digits", lambda completions, **_: [sum(map(str.isdigit, t)) / (len(t) or 1) for t in completions])
    """,
    )
    from grpo_kit.plugins.registry import Registry, plugin_manager

    registry = Registry(plugin_manager(local_modules=[module]))
    overrides = tiny_run(tiny_model, *EVERY_STEP_SAVED, "trainer.save_only_model=true", "trainer.max_steps=4")
    with pytest.raises(Stopped):
        grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path, registry)
    saved = {c.name: sorted(p.name for p in c.iterdir()) for c in (tmp_path / "checkpoints").iterdir()}
    assert saved == {
        "step-000001": ["manifest.json", "metrics.jsonl", "model"],
        "step-000002": ["config.json", "manifest.json", "metrics.jsonl", "state.pt"],
    }


# -- token counts ----------------------------------------------------------------------------------------------------


def test_num_tokens_counts_every_prompt_and_completion_token_generated(registry, tiny_model, tmp_path):
    overrides = tiny_run(
        tiny_model,
        "+reward=digits",
        "rollout_files.save=true",
        "trainer.gradient_accumulation_steps=2",
        "trainer.logging_steps=1",
    )
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path, registry)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    batches = [torch.load(path, weights_only=False) for path in sorted((tmp_path / "rollouts").glob("*.pt"))]
    # One generation batch a step, trained on as two micro-batches: counted once.
    per_batch = [sum(map(len, b["prompt_ids"])) + sum(map(len, b["completion_ids"])) for b in batches]
    assert [line["num_tokens"] for line in lines] == [sum(per_batch[:step]) for step in (1, 2, 3)]
    assert all(line["train_tokens_per_second"] > 0 for line in lines)


def test_num_tokens_goes_on_after_a_resume(registry, tiny_model, tmp_path):
    overrides = tiny_run(
        tiny_model,
        "+reward=digits",
        "trainer.max_steps=4",
        "trainer.save_steps=2",
        "trainer.save_total_limit=5",
        "trainer.logging_steps=1",
    )
    unbroken, resumed = tmp_path / "unbroken", tmp_path / "resumed"
    grpo_kit.train(grpo_kit.compose(overrides, registry), unbroken, registry)
    checkpoint = unbroken / "checkpoints" / "step-000002"
    grpo_kit.train(grpo_kit.compose([*overrides, f"trainer.resume={checkpoint}"], registry), resumed, registry)

    def counts(run_dir):
        return [json.loads(line)["num_tokens"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    assert counts(resumed) == counts(unbroken)
    assert counts(unbroken)[0] < counts(unbroken)[-1]

"""grpo_kit's objective and advantages against TRL 1.16.0's own code, on random inputs (skipped without trl).

TRL's loss is `GRPOTrainer._compute_loss`; it is called here unbound, on a stand-in for the trainer that holds
just the settings it reads and hands back our per-token log-probs as the model's. TRL computes advantages inline
in `_generate_and_score_completions`, so that block of its source is run as it is.
"""

import inspect
import itertools
import textwrap
import types
from collections import defaultdict

import pytest
import torch
from omegaconf import open_dict

import grpo_kit

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
pytestmark = pytest.mark.skipif(
    pytest.importorskip("trl").__version__ != "1.16.0", reason="compares against TRL 1.16.0 exactly"
)
from accelerate import Accelerator  # noqa: E402

LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
CORRECTIONS = ["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
LENGTHS = [6, 3, 1, 5]  # active tokens of each completion; T = 6
MAX_COMPLETION_LENGTH = 8


def random_batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    B, T = len(LENGTHS), max(LENGTHS)
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).int()
    logps = -torch.rand(B, T, generator=generator) * 2 - 0.05
    noise = lambda scale: scale * torch.randn(B, T, generator=generator)  # noqa: E731
    batch = {
        "prompt_ids": torch.ones(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.ones(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.tensor([1.3, -0.7, 0.4, -1.1]),
        "old_per_token_logps": logps + noise(0.3),
        "ref_per_token_logps": logps + noise(0.5),
        "num_items_in_batch": torch.tensor(float(mask.sum() * 3)),  # this micro-batch is part of a larger batch
    }
    batch["sampling_per_token_logps"] = batch["old_per_token_logps"] + noise(0.4)
    entropies = torch.rand(B, T, generator=generator) * 3
    return logps, entropies, batch


def trl_trainer(cfg, accumulation: int, correction: bool) -> types.SimpleNamespace:
    """The settings TRL's `_compute_loss` reads, taken from our composed config."""
    loss, algo = cfg.loss, cfg.algorithm
    args = types.SimpleNamespace(
        delta=loss.get("delta"),
        use_bias_correction_kl=algo.use_bias_correction_kl,
        steps_per_generation=algo.steps_per_generation,
        sapo_temperature_pos=loss.get("temperature_pos", 1.0),
        sapo_temperature_neg=loss.get("temperature_neg", 1.05),
        vespo_k_pos=loss.get("k_pos", 2.0),
        vespo_lambda_pos=loss.get("lambda_pos", 3.0),
        vespo_k_neg=loss.get("k_neg", 3.0),
        vespo_lambda_neg=loss.get("lambda_neg", 2.0),
    )
    epsilon = loss.get("epsilon", 0.2)
    epsilon_high = loss.get("epsilon_high") if loss.get("epsilon_high") is not None else epsilon
    trainer = types.SimpleNamespace(
        args=args,
        loss_type=loss.name,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high,
        beta=algo.beta,
        importance_sampling_level=cfg.importance_sampling.name,
        top_entropy_quantile=algo.top_entropy_quantile,
        off_policy_mask_threshold=algo.off_policy_mask_threshold,
        entropy_coef=algo.entropy_coef,
        use_adaptive_entropy=False,
        _entropy_bonus_enabled=algo.entropy_coef != 0.0,
        use_vllm=correction,
        vllm_importance_sampling_correction=correction,
        aux_loss_enabled=False,
        current_gradient_accumulation_steps=accumulation,
        max_completion_length=MAX_COMPLETION_LENGTH,
        model=types.SimpleNamespace(training=True),
        accelerator=Accelerator(cpu=True),
        _metrics=defaultdict(lambda: defaultdict(list)),
        get_off_policy_mask=trl_grpo.GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=trl_grpo.GRPOTrainer.get_gamma_weights,
    )
    trainer.get_high_entropy_mask = types.MethodType(trl_grpo.GRPOTrainer.get_high_entropy_mask, trainer)
    return trainer


def trl_loss(trainer, logps, entropies, batch):
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, entropies, None)
    return trl_grpo.GRPOTrainer._compute_loss(trainer, None, batch)


# What our metric names are in TRL's log (they are the same names).
SHARED_METRICS = [
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "cispo_clip_ratio",
    "vespo/phi_seq_mean",
]


def settings():
    """beta x bias-corrected KL x delta x entropy mask x accumulation, plus the rarer knobs on some of them."""
    for index, (beta, bias_kl, delta, quantile, accumulation) in enumerate(
        itertools.product([0.0, 0.04], [True, False], [None, 1.3], [1.0, 0.5], [1, 4])
    ):
        yield {
            "beta": beta,
            "use_bias_correction_kl": bias_kl,
            "delta": delta,
            "top_entropy_quantile": quantile,
            "accumulation": accumulation,
            "steps_per_generation": accumulation * (2 if index % 3 == 0 else 1),
            "off_policy_mask_threshold": 0.05 if index % 4 == 1 else None,
            "entropy_coef": 0.01 if index % 5 == 2 else 0.0,
        }


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss", LOSSES)
def test_loss_and_gradient_equal_trl(registry, loss, level, correction):
    if loss == "vespo" and correction.startswith("sequence"):
        pytest.skip("TRL and grpo_kit both reject vespo with a sequence-level correction")
    base = grpo_kit.compose([f"+loss={loss}", f"importance_sampling={level}", f"rollout_correction={correction}"], registry)
    for seed, setting in enumerate(settings()):
        cfg = base.copy()
        with open_dict(cfg):
            for name in ("beta", "use_bias_correction_kl", "top_entropy_quantile", "off_policy_mask_threshold"):
                cfg.algorithm[name] = setting[name]
            cfg.algorithm.entropy_coef = setting["entropy_coef"]
            cfg.algorithm.steps_per_generation = setting["steps_per_generation"]
            cfg.generation.max_completion_length = MAX_COMPLETION_LENGTH
            if "delta" in cfg.loss:
                cfg.loss.delta = setting["delta"]
                cfg.loss.epsilon_high = 0.28 if seed % 2 else None
        objective = grpo_kit.build_objective(cfg, registry)
        logps, entropies, batch = random_batch(seed)
        ratio = objective.rollout_correction(
            batch["old_per_token_logps"], batch["sampling_per_token_logps"], batch["completion_mask"]
        )
        if ratio is not None:
            batch["importance_sampling_ratio"] = ratio

        ours_logps = logps.clone().requires_grad_()
        ours_entropies = entropies.clone().requires_grad_(setting["entropy_coef"] != 0.0)
        ours = objective(
            ours_logps,
            ours_entropies,
            batch,
            gradient_accumulation_steps=setting["accumulation"],
            steps_per_generation=setting["steps_per_generation"],
            num_processes=1,
        )
        ours.loss.backward()

        trainer = trl_trainer(cfg, setting["accumulation"], correction=ratio is not None)
        theirs_logps = logps.clone().requires_grad_()
        theirs_entropies = entropies.clone().requires_grad_(setting["entropy_coef"] != 0.0)
        theirs = trl_loss(trainer, theirs_logps, theirs_entropies, dict(batch))
        theirs.backward()

        where = f"{loss}/{level}/{correction} with {setting}"
        torch.testing.assert_close(ours.loss, theirs.detach(), atol=1e-5, rtol=1e-5, msg=where)
        torch.testing.assert_close(ours_logps.grad, theirs_logps.grad, atol=1e-5, rtol=1e-5, msg=where)
        logged = trainer._metrics["train"]
        for name in SHARED_METRICS:
            assert (name in ours.metrics) == (name in logged), (name, where)
            if name in logged:
                torch.testing.assert_close(
                    ours.metrics[name].float(), torch.tensor(logged[name][0]), atol=1e-5, rtol=1e-5, equal_nan=True
                )


def trl_advantages(rewards_per_func, weights, num_generations, scale_rewards, aggregation):
    """Run the advantage block of TRL's `_generate_and_score_completions` as it is written there."""
    source = textwrap.dedent(inspect.getsource(trl_grpo.GRPOTrainer._generate_and_score_completions))
    start = source.rindex("\n", 0, source.index("unscorable_mask = torch.isnan")) + 1
    end = source.rindex("\n", 0, source.index("advantages = torch.nan_to_num(advantages, nan=0.0)")) + 1
    block = textwrap.dedent(source[start:end]) + "advantages = torch.nan_to_num(advantages, nan=0.0)\n"
    trainer = types.SimpleNamespace(
        multi_objective_aggregation=aggregation,
        scale_rewards=scale_rewards,
        reward_weights=weights,
        reward_funcs=[None] * rewards_per_func.shape[1],
    )
    scope = {"torch": torch, "nanstd": trl_grpo.nanstd, "self": trainer, "rewards_per_func": rewards_per_func,
             "num_generations": num_generations, "device": "cpu"}
    exec(block, scope)
    return scope["advantages"]


@pytest.mark.parametrize(
    ("estimator", "scale_rewards", "aggregation"),
    [
        ("group", "group", "sum_then_normalize"),
        ("batch", "batch", "sum_then_normalize"),
        ("none", "none", "sum_then_normalize"),
        ("gdpo", "group", "normalize_then_sum"),
    ],
)
def test_advantages_equal_trl(registry, estimator, scale_rewards, aggregation):
    advantage = grpo_kit.build_advantage(grpo_kit.compose([f"advantage={estimator}"], registry), registry)
    generator = torch.Generator().manual_seed(0)
    for num_generations, num_rewards in [(4, 1), (4, 3), (8, 2)]:
        rewards = torch.randint(0, 3, (num_generations * 6, num_rewards), generator=generator).float()
        rewards[3] = float("nan")  # a completion no reward could score
        rewards[5, 0] = float("nan")  # one reward with no opinion
        rewards[num_generations : 2 * num_generations] = 1.0  # a group with equal rewards
        weights = torch.rand(num_rewards, generator=generator) + 0.5
        ours = advantage(rewards, weights, num_generations)
        theirs = trl_advantages(rewards, weights, num_generations, scale_rewards, aggregation)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)

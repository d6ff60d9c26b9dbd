"""grpo_kit's objective, rollout correction and advantages against TRL 1.16.0's own code, on random inputs.

The tests take the `trl` fixture (conftest.py): without trl==1.16.0 they skip, or fail under GRPO_KIT_REQUIRE_TRL=1.

TRL's loss is `GRPOTrainer._compute_loss`; it is called here unbound, on a stand-in for the trainer that holds
just the settings it reads and hands back our per-token log-probs as the model's. TRL computes the rollout
correction ratio and the advantages inline in `_generate_and_score_completions` (`RLOOTrainer`'s for rloo), so
that whole method is called the same way, on a stand-in whose generation, forward pass and reward functions
return the tensors under test.
"""

import itertools
import math
import types
from collections import defaultdict

import pytest
import torch
from accelerate import Accelerator
from omegaconf import open_dict

import grpo_kit
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.objective.sampler_correction import SamplerCorrection
from grpo_kit.testing.micro_batches import objective_batch, trl_inputs

LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
CORRECTIONS = ["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
LENGTHS = [6, 3, 1, 5]  # active tokens of each completion; T = 6
MAX_COMPLETION_LENGTH = 8
PAD_TOKEN_ID, COMPLETION_TOKEN_ID = 0, 1
ACCELERATOR = Accelerator(cpu=True)  # one process; shared by every stand-in, as building one costs milliseconds


def random_batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    B, T = len(LENGTHS), max(LENGTHS)
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).int()
    logps = -torch.rand(B, T, generator=generator) * 2 - 0.05
    noise = lambda scale: scale * torch.randn(B, T, generator=generator)  # noqa: E731
    old_per_token_logps = logps + noise(0.3)
    ref_per_token_logps = logps + noise(0.5)
    batch = MicroBatch(
        prompt_ids=torch.ones(B, 2, dtype=torch.long),
        prompt_mask=torch.ones(B, 2, dtype=torch.long),
        completion_ids=torch.ones(B, T, dtype=torch.long),
        completion_mask=mask,
        advantages=torch.tensor([1.3, -0.7, 0.4, -1.1]),
        old_per_token_logps=old_per_token_logps,
        ref_per_token_logps=ref_per_token_logps,
        sampling_per_token_logps=old_per_token_logps + noise(0.4),
    )
    entropies = torch.rand(B, T, generator=generator) * 3
    return logps, entropies, batch


# ------------------------------------------------------------------------- TRL's generation-batch scoring ---


def scoring_stand_in(rewards_per_func, completion_mask, old_per_token_logps, generated, **settings):
    """The trainer that TRL's `_generate_and_score_completions` reads, on one CPU process: `generated` is its
    `_generate`, the policy's forward pass returns `old_per_token_logps`, the reward functions `rewards_per_func`.
    `settings` override the defaults: TRL's advantage defaults, no vLLM, no KL, one step per generation."""
    size, num_rewards = rewards_per_func.shape
    if old_per_token_logps is None:
        old_per_token_logps = torch.zeros(completion_mask.shape)
    defaults = dict(
        accelerator=ACCELERATOR,
        model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
        args=types.SimpleNamespace(
            per_device_train_batch_size=size,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            gradient_checkpointing_kwargs=None,
        ),
        num_iterations=1,
        environment_factories=None,
        environments=None,
        tools=None,
        _generate=generated,
        _tokenizer=types.SimpleNamespace(pad_token_id=PAD_TOKEN_ID),
        pad_to_multiple_of=None,
        mask_truncated_completions=False,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        beta=0.0,
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (old_per_token_logps, None, None),
        _calculate_rewards=lambda *args: rewards_per_func,
        num_generations=size,
        scale_rewards="group",
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=torch.ones(num_rewards),
        reward_funcs=[None] * num_rewards,
        reward_func_names=[f"reward_{index}" for index in range(num_rewards)],
        _metrics=defaultdict(lambda: defaultdict(list)),
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [], "extra": {}},
        _pending_extra_logs={},
        _pending_metrics={},
        log_multimodal=False,
    )
    return types.SimpleNamespace(**(defaults | settings))


def completion_token_ids(completion_mask) -> list[list[int]]:
    return [[COMPLETION_TOKEN_ID] * length for length in completion_mask.sum(dim=1).tolist()]


def scored_by(trainer_class, stand_in, completion_mask) -> dict:
    size = completion_mask.shape[0]
    output = trainer_class._generate_and_score_completions(stand_in, [{"prompt": "1+2="}] * size)
    # TRL rebuilds the mask from the generated lengths: it must be the mask under test.
    assert torch.equal(output["completion_mask"], completion_mask.long())
    return output


def trl_grpo_scored(
    trl, rewards_per_func, completion_mask, old_per_token_logps=None, sampling_per_token_logps=None, **settings
) -> dict:
    """TRL's GRPO generation batch: its advantages and, when the sampler's log-probs are given, its ratio."""
    size = completion_mask.shape[0]
    ids = completion_token_ids(completion_mask)
    sampling = None
    if sampling_per_token_logps is not None:  # as vLLM reports them: a list per completion, None where unscored
        sampling = [
            [None if math.isnan(value) else value for value in row[: len(completion)]]
            for row, completion in zip(sampling_per_token_logps.tolist(), ids)
        ]

    def generated(prompts):
        return [[5, 6]] * size, ids, None, ["completion"] * size, sampling, {}, None, None

    stand_in = scoring_stand_in(rewards_per_func, completion_mask, old_per_token_logps, generated, **settings)
    return scored_by(trl.GRPOTrainer, stand_in, completion_mask)


def trl_rloo_scored(trl, rewards_per_func, completion_mask, **settings) -> dict:
    size = completion_mask.shape[0]
    ids = completion_token_ids(completion_mask)

    def generated(prompts):
        return [[5, 6]] * size, ids, ["completion"] * size

    stand_in = scoring_stand_in(rewards_per_func, completion_mask, None, generated, **settings)
    return scored_by(trl.RLOOTrainer, stand_in, completion_mask)


def trl_correction_ratio(trl, correction, old_per_token_logps, sampling_per_token_logps, completion_mask):
    """TRL's importance-sampling ratio for our `rollout_correction` config node (not `none`)."""
    size = completion_mask.shape[0]
    output = trl_grpo_scored(
        trl,
        torch.zeros(size, 1),  # the advantages are not looked at here
        completion_mask,
        old_per_token_logps,
        sampling_per_token_logps,
        use_vllm=True,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=correction.name,
        vllm_importance_sampling_clip_min=correction.min,
        vllm_importance_sampling_clip_max=correction.max,
    )
    return output["importance_sampling_ratio"]


# ------------------------------------------------------------------------------------------------ the loss ---


def trl_trainer(trl, cfg, accumulation: int, correction: bool) -> types.SimpleNamespace:
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
        accelerator=ACCELERATOR,
        _metrics=defaultdict(lambda: defaultdict(list)),
        get_off_policy_mask=trl.GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=trl.GRPOTrainer.get_gamma_weights,
    )
    trainer.get_high_entropy_mask = types.MethodType(trl.GRPOTrainer.get_high_entropy_mask, trainer)
    return trainer


def trl_loss(trl, trainer, logps, entropies, batch):
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, entropies, None)
    return trl.GRPOTrainer._compute_loss(trainer, None, batch)


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
def test_loss_and_gradient_equal_trl(registry, trl, loss, level, correction):
    """Each side's loss gets its own rollout-correction ratio: ours from `SamplerCorrection.ratio`, TRL's
    from its generation-batch scoring."""
    if loss == "vespo" and correction.startswith("sequence"):
        pytest.skip("TRL and grpo_kit both reject vespo with a sequence-level correction")
    base = grpo_kit.compose(
        [f"+loss={loss}", f"importance_sampling={level}", f"rollout_correction={correction}"], registry
    )
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
        logps, entropies, ours_batch = random_batch(seed)
        old, sampling = ours_batch.old_per_token_logps, ours_batch.sampling_per_token_logps
        mask = ours_batch.completion_mask
        theirs_batch = trl_inputs(ours_batch)
        num_items_in_batch = float(mask.sum() * 3)  # this micro-batch is part of a larger generation batch
        theirs_batch["num_items_in_batch"] = torch.tensor(num_items_in_batch)  # where TRL reads it
        ratio = SamplerCorrection.of(cfg, registry).ratio(ours_batch)
        corrected = ratio is not None
        assert corrected == (correction != "none")
        if corrected:
            ours_batch = ours_batch.with_references(importance_sampling_ratio=ratio)
            theirs_batch["importance_sampling_ratio"] = trl_correction_ratio(
                trl, cfg.rollout_correction, old, sampling, mask
            )

        ours_logps = logps.clone().requires_grad_()
        ours_entropies = entropies.clone().requires_grad_(setting["entropy_coef"] != 0.0)
        reduction = grpo_kit.Reduction(
            num_items_in_batch,
            gradient_accumulation_steps=setting["accumulation"],
            steps_per_generation=setting["steps_per_generation"],
            num_processes=1,
            max_completion_length=MAX_COMPLETION_LENGTH,
        )
        ours = objective(ours_logps, ours_entropies, ours_batch, reduction)
        ours.loss.backward()

        trainer = trl_trainer(trl, cfg, setting["accumulation"], correction=corrected)
        theirs_logps = logps.clone().requires_grad_()
        theirs_entropies = entropies.clone().requires_grad_(setting["entropy_coef"] != 0.0)
        theirs = trl_loss(trl, trainer, theirs_logps, theirs_entropies, theirs_batch)
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


# ------------------------------------------------------------------------------------ rollout correction ---


def correction_inputs():
    """Old and sampler log-probs far enough apart that ratios fall outside every bound tested, one token the
    sampler could not score (NaN, as vLLM reports it), and completions of different lengths."""
    generator = torch.Generator().manual_seed(0)
    lengths = [6, 2, 1, 4, 6, 3, 5, 6] * 2
    mask = (torch.arange(max(lengths)).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).int()
    old = -torch.rand(mask.shape, generator=generator) * 2 - 0.05
    sampling = old + 0.8 * torch.randn(mask.shape, generator=generator)
    sampling[4, 2] = float("nan")
    return old, sampling, mask


BOUNDS = [(None, 3.0), (0.5, 2.0), (0.8, None), (None, None)]


@pytest.mark.parametrize(("low", "high"), BOUNDS, ids=[f"min={low},max={high}" for low, high in BOUNDS])
@pytest.mark.parametrize("correction", CORRECTIONS[1:])
def test_rollout_correction_ratio_equals_trl(registry, trl, correction, low, high):
    if correction.endswith("truncate") and low is None and high is None:
        pytest.skip("TRL and grpo_kit both refuse a truncation with neither bound")
    bounds = [
        f"rollout_correction.min={'null' if low is None else low}",
        f"rollout_correction.max={'null' if high is None else high}",
    ]
    cfg = grpo_kit.compose([f"rollout_correction={correction}", *bounds], registry)
    old, sampling, mask = correction_inputs()
    batch = objective_batch(mask, torch.zeros(len(mask)), old_per_token_logps=old, sampling_per_token_logps=sampling)
    ours = SamplerCorrection.of(cfg, registry).ratio(batch)
    theirs = trl_correction_ratio(trl, cfg.rollout_correction, old, sampling, mask)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    active = theirs if correction.startswith("sequence") else theirs[mask.bool()]
    if correction.endswith("mask") and (low, high) != (None, None):
        assert (active == 0).any(), "the inputs should put some ratio outside the bounds"
    for bound in (low, high) if correction.endswith("truncate") else ():
        if bound is not None:
            assert (active == bound).any(), f"the inputs should put some ratio beyond {bound}"


def test_rollout_correction_bounds_default_to_trls(registry, trl):
    fields = trl.GRPOConfig.__dataclass_fields__
    for correction in CORRECTIONS[1:]:
        ours = grpo_kit.compose([f"rollout_correction={correction}"], registry).rollout_correction
        assert ours.min == fields["vllm_importance_sampling_clip_min"].default
        assert ours.max == fields["vllm_importance_sampling_clip_max"].default


# ---------------------------------------------------------------------------------------------- advantages ---


def reward_matrices():
    """(rewards, weights, num_generations): integer rewards (ties), an unscorable completion, a reward with no
    opinion, a group with equal rewards, and a group with a single scorable completion."""
    generator = torch.Generator().manual_seed(0)
    for num_generations, num_rewards in [(4, 1), (4, 3), (8, 2)]:
        rewards = torch.randint(0, 3, (num_generations * 6, num_rewards), generator=generator).float()
        rewards[3] = float("nan")  # a completion no reward could score
        rewards[5, 0] = float("nan")  # one reward with no opinion
        rewards[num_generations : 2 * num_generations] = 1.0  # a group with equal rewards
        rewards[2 * num_generations + 1 : 3 * num_generations] = float("nan")  # one scorable completion in its group
        weights = torch.rand(num_rewards, generator=generator) + 0.5
        yield rewards, weights, num_generations


def all_active(rewards) -> torch.Tensor:
    return torch.ones(rewards.shape[0], 2, dtype=torch.int)


@pytest.mark.parametrize(
    ("estimator", "scale_rewards", "aggregation"),
    [
        ("group", "group", "sum_then_normalize"),
        ("batch", "batch", "sum_then_normalize"),
        ("none", "none", "sum_then_normalize"),
        ("gdpo", "group", "normalize_then_sum"),
    ],
)
def test_advantages_equal_trl(registry, trl, estimator, scale_rewards, aggregation):
    advantage = grpo_kit.build_advantage(grpo_kit.compose([f"advantage={estimator}"], registry), registry)
    for rewards, weights, num_generations in reward_matrices():
        ours = advantage(rewards, weights, num_generations)
        theirs = trl_grpo_scored(
            trl,
            rewards,
            all_active(rewards),
            num_generations=num_generations,
            reward_weights=weights,
            scale_rewards=scale_rewards,
            multi_objective_aggregation=aggregation,
        )["advantages"]
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_rloo_advantages_equal_trls_rloo_trainer(registry, trl):
    """TRL has leave-one-out advantages in its RLOOTrainer; with its defaults `normalize_advantages=False` and no
    reward clipping, and `beta=0` (RLOOTrainer puts the KL penalty into the reward, grpo_kit into the loss)."""
    advantage = grpo_kit.build_advantage(grpo_kit.compose(["advantage=rloo"], registry), registry)
    for rewards, weights, num_generations in reward_matrices():
        ours = advantage(rewards, weights, num_generations)
        theirs = trl_rloo_scored(
            trl,
            rewards,
            all_active(rewards),
            num_generations=num_generations,
            reward_weights=weights,
            normalize_advantages=False,
            reward_clip_range=None,
        )["advantages"]
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)

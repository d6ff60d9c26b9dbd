"""What a plugin of each kind is handed, returns and declares: with grpo_kit/contract/hookspecs.py, the whole contract.

Shapes: B completions in a micro-batch, T completion tokens, N completions in a generation batch, K rewards.
These are Protocols, and every attribute the core reads of a plugin is declared here with its default. A plugin
class may subclass its kind's protocol (``class MyLoss(grpo_kit.Loss)``) to inherit those defaults and state only
what differs; one that does not subclass it gets the same defaults, because the core reads every optional attribute
through ``declared``. The traits among them (``TRAITS``, below) are declared to ``register`` instead, not on the
class. A protocol's ``__init__`` takes nothing: a plugin with options takes its config instead,
``__init__(self, config)``. The config base classes (``GenerationConfig``, ``RewardConfig``) are not optional: the
core reads their fields, so a generation or reward plugin's config extends them.
"""

# Annotations stay text, so that `torch` is needed only by a type checker: plugins' config modules, the CLI and
# `grpo_kit.compose` import this file without importing torch.
from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from inspect import isfunction
from types import MethodType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

KINDS = (
    "loss",
    "importance_sampling",
    "rollout_correction",
    "advantage",
    "reward",
    "generation",
    "hook",
    "environment",
    "rollout",
    "sampler",
)
MULTI_CHOICE_KINDS = ("reward", "hook")  # several at once: +reward=[a,b]; stored at reward.NAME
OPTIONAL_KINDS = ("environment", "rollout")  # a run without one is a run without tools, or with the usual generation


@dataclass(frozen=True)
class Reduction:
    """What a loss may divide by when it reduces per-token losses to the micro-batch's scalar: the divisors of one
    generation batch, the same for each of its micro-batches."""

    num_items_in_batch: float  # active completion tokens in the whole generation batch, all processes
    gradient_accumulation_steps: int
    steps_per_generation: int
    num_processes: int
    max_completion_length: int
    # Set where micro-batches hold different numbers of completions (trainer.max_tokens_per_micro_batch): the
    # completions of the fixed micro-batch each stands in for, which a mean over completions divides by instead of
    # its own count, so that every completion weighs the same however the step is cut (`mean_over_completions`).
    rows_per_micro_batch: float | None = None

    @classmethod
    def whole_batch(cls, mask: torch.Tensor, max_completion_length: int) -> Reduction:
        """The divisors of a micro-batch that is its whole generation batch: one process, no accumulation; `mask`
        (B, T) marks the tokens the loss trains on."""
        return cls(float(mask.sum()), 1, 1, 1, max_completion_length)

    def mean_over_completions(self, values: torch.Tensor) -> torch.Tensor:  # (B,) -> scalar
        """The micro-batch's mean of one value per completion, divided by the accumulation steps: what a loss that
        averages sequences reduces with."""
        if self.rows_per_micro_batch is None:
            return values.mean() / self.gradient_accumulation_steps
        return values.sum() / (self.rows_per_micro_batch * self.gradient_accumulation_steps)

    @property
    def tokens_per_step(self) -> float:
        """The active tokens of one optimizer step on one process, the token-mean losses' normaliser: one process
        trains on 1 / num_processes of the generation batch, spread over steps_per_generation micro-batches of
        which an optimizer step takes gradient_accumulation_steps. Every token then weighs the same, however the
        batch is split."""
        tokens = max(self.num_items_in_batch, 1.0) / self.num_processes
        return tokens * self.gradient_accumulation_steps / self.steps_per_generation


@dataclass(frozen=True)
class LossInputs:
    """What a loss is handed for one micro-batch."""

    log_weights: torch.Tensor  # (B, T) or (B, 1): log importance weights from the importance-sampling plugin
    log_ratio: torch.Tensor  # (B, T): log pi_theta - log pi_old per token, before any aggregation
    advantages: torch.Tensor  # (B, 1)
    per_token_logps: torch.Tensor  # (B, T): log pi_theta, with gradient
    mask: torch.Tensor  # (B, T): 1 on the completion tokens that count
    rollout_ratio: torch.Tensor | None  # (B, T) or (B, 1): the rollout correction's ratio; None without one


@dataclass(frozen=True)
class LigerLoss:
    """A loss as liger-kernel's fused linear GRPO loss computes it (`model.logits=liger`, docs/training.md).

    A loss plugin declares it from its config through an optional `liger_loss()` method; the core hands
    `loss_type` and `options` to `liger_kernel.chunked_loss.LigerFusedLinearGRPOLoss`, and checks once per
    setting, on a tiny random problem, that Liger's loss and gradient equal this plugin's (else it falls back
    to the chunked path and logs why).
    """

    loss_type: str  # Liger's `loss_type`
    options: dict[str, Any] = field(default_factory=dict)  # Liger's keyword arguments: epsilon_low, delta, ...
    # True: Liger's value is a mean over this micro-batch, which the core divides by the accumulation steps as
    # the plugin's own `reduce` does. False: Liger divides by `num_items_in_batch` (the active tokens of the
    # generation batch), which the core scales to the tokens of one optimizer step on this process.
    per_micro_batch: bool = True


class Loss(Protocol):
    # The importance-sampling level the loss's paper uses ("token" or "sequence"); another one gives a
    # warning that says why (`importance_sampling_advice`). None: either level is fine.
    importance_sampling_level: ClassVar[str | None] = None
    importance_sampling_advice: ClassVar[str] = ""
    # Rollout-correction levels the loss can take; None: any. A loss that folds the correction ratio into its
    # own weights (vespo) sets `consumes_rollout_ratio`, and the core does not multiply the loss by it.
    rollout_correction_levels: ClassVar[tuple[str, ...] | None] = None
    consumes_rollout_ratio: ClassVar[bool] = False
    # True: a step's gradient is the same however its completions are split into micro-batches (`reduce` divides
    # by a constant of the step, or averages micro-batches of equal size), so the trainer may put completions of
    # similar lengths together and pad less (trainer.group_by_length). The conformance kit checks it.
    accumulation_invariant: ClassVar[bool] = False

    def __init__(self) -> None: ...

    def per_token_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The (B, T) or (B, 1) loss before masks, correction and KL; and metrics, name -> scalar tensor."""

    def reduce(self, per_token_loss: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
        """The micro-batch's scalar, already divided as gradient accumulation needs."""

    def liger_loss(self) -> LigerLoss | None:
        """The loss as liger-kernel computes it, for `model.logits=liger`; None when Liger has no equivalent, and
        the loss gets the chunked path instead."""
        return None


class ImportanceSampling(Protocol):
    level: ClassVar[str | None] = None  # "token" or "sequence": the shape of the weights it forms

    def __init__(self) -> None: ...

    def log_weights(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B, T) or (B, 1)
        ...


class RolloutCorrection(Protocol):
    level: ClassVar[str | None] = None  # "token", "sequence", or None for no correction

    def __init__(self) -> None: ...

    def ratio(
        self,
        old_per_token_logps: torch.Tensor,  # (N, T)
        sampling_per_token_logps: torch.Tensor,  # (N, T), the sampler's own log-probs
        mask: torch.Tensor,  # (N, T)
    ) -> torch.Tensor | None:  # (N, T) or (N, 1); None: no correction
        ...


class Advantage(Protocol):
    # True: it compares the completions of one prompt, so a run must sample several (generation.num_generations).
    needs_groups: ClassVar[bool] = False

    def __init__(self) -> None: ...

    def __call__(
        self,
        rewards_per_func: torch.Tensor,  # (N, K), NaN where a reward had no opinion
        weights: torch.Tensor,  # (K,)
        num_generations: int,
    ) -> torch.Tensor:  # (N,)
        ...


@dataclass
class GenerationConfig:
    """Sampling settings every generation backend understands; a backend's own config extends this."""

    num_generations: int = 8  # completions per prompt: the group whose rewards the advantages compare
    max_completion_length: int = 256  # tokens a completion may have; one that reaches it without EOS is truncated
    temperature: float = 1.0  # divides the logits before sampling; 1.0 samples the model's own distribution
    top_p: float = 1.0  # nucleus sampling: the smallest set of tokens whose probability reaches top_p; 1.0 keeps all
    top_k: int | None = None  # sample among the k likeliest tokens only; None keeps all
    min_p: float | None = None  # drop tokens below min_p times the likeliest token's probability; None keeps all
    repetition_penalty: float = 1.0  # > 1 makes tokens already in the prompt or completion less likely; 1.0: off
    # Completions per generation batch, all processes together (TRL's generation_batch_size); it sets
    # algorithm.steps_per_generation. None: per_device_train_batch_size x processes x steps_per_generation.
    batch_size: int | None = None
    # Every completion must match this regular expression (TRL's vllm_structured_outputs_regex): vLLM's structured
    # outputs; a backend that does not declare `structured_outputs` refuses it. None: unconstrained.
    structured_outputs_regex: str | None = None


@dataclass
class Completions:
    completion_ids: torch.Tensor  # (N, T), right-padded
    # The EOS ids are the model's generation config's and the tokenizer's (grpo_kit.eos_token_ids, as in TRL).
    completion_mask: torch.Tensor  # (N, T), 1 up to and including the first EOS (grpo_kit.eos_mask)
    is_truncated: torch.Tensor  # (N,), True where the last token is neither an EOS nor pad (grpo_kit.is_truncated)
    sampling_per_token_logps: torch.Tensor | None = None  # (N, T), the sampler's own log-probs
    # Multi-turn rollouts (grpo_kit/rollout/tool_use.py): 0 on the tokens that tools wrote, which the model reads but is
    # not trained on; and how many tool calls each completion made, and how many of them failed.
    tool_mask: torch.Tensor | None = None  # (N, T)
    tool_calls: torch.Tensor | None = None  # (N,)
    tool_failures: torch.Tensor | None = None  # (N,)
    # (N,) the optimizer steps of the weights that sampled each completion, set by the core (not by a backend) where
    # one generation batch mixes weights: select_groups and concat keep it with its rows
    weight_versions: torch.Tensor | None = None

    def written_mask(self) -> torch.Tensor:  # (N, T)
        """The tokens the model wrote itself: the completion's, less what tools wrote into it."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask


@dataclass
class PromptImages:
    """The images of a batch of prompts, for a vision-language policy (docs/vision.md).

    The prompt ids that come with them already hold, for each image, the run of placeholder tokens that the model's
    processor expands its image token into (Qwen2-VL: one `<|image_pad|>` per merged patch).
    """

    images: list[list[Any]]  # prompt i's PIL images, in the order its text places them
    # What the policy's forward pass takes for them, for the whole batch in prompt order, as the model's processor
    # computed it: Qwen2-VL's `pixel_values` (patches, C) and `image_grid_thw` (images, 3). A backend in this process
    # hands these to the model (`forward_kwargs`); a backend outside it sends `images`.
    model_inputs: dict[str, torch.Tensor]

    def forward_kwargs(self, model: Any, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """What `model`'s forward pass (and `generate`) takes for these images beside the prompts' `input_ids`
        (N, P), on their device."""
        moved = {name: tensor.to(input_ids.device) for name, tensor in self.model_inputs.items()}
        return moved | image_token_types(model, input_ids)


def image_token_types(model: Any, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Which of `input_ids` (B, W) stand for an image, as a vision-language model of transformers >= 5 reads them
    to number its multimodal positions (M-RoPE): {"mm_token_type_ids": (B, W)}; nothing for an older one."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under PEFT's wrapper
    if "mm_token_type_ids" not in inspect.signature(inner.forward).parameters:
        return {}
    return {"mm_token_type_ids": (input_ids == inner.config.image_token_id).long()}


class Generation(Protocol):
    """Where completions come from: the policy itself, a server, an engine in this process.

    Every process calls every method. With several processes, each passes its own prompts and gets back the
    completions of those prompts; a backend may still have one process do all the talking (a server's client
    gathers the prompts on the main process and hands each process its share).

    A backend whose generator stops answering (a server that died and did not come back within the backend's
    retries) raises `grpo_kit.contract.errors.GenerationUnavailable` from `generate` or `update_weights`: the run
    then saves a checkpoint of its last whole step and stops with the command that resumes it, instead of failing.
    """

    # True: it samples with the trained model itself, in this process, so its log-probs are the trainer's up to
    # rounding and algorithm.correct_policy_sampler=false skips the rollout correction (as TRL does without vLLM).
    samples_from_policy: ClassVar[bool] = False
    # True: `generate` takes `images` (a vision-language policy's prompts); a run with images refuses a backend that
    # does not declare it. `grpo_kit.testing.contracts.GenerationContract` checks that the images reach the sampler.
    accepts_images: ClassVar[bool] = False
    # True: its sampler keeps every completion within generation.structured_outputs_regex; a run that sets the regex
    # refuses a backend that does not declare it, rather than train on completions the regex would have forbidden.
    structured_outputs: ClassVar[bool] = False

    def __init__(self) -> None: ...

    def start(self, model: torch.nn.Module, tokenizer: Any, accelerator: Any) -> None:
        """Called once, after the model is prepared and before the first generation batch."""

    def generate(
        self, prompt_ids: list[list[int]], with_logprobs: bool = False, images: PromptImages | None = None
    ) -> Completions:
        """One completion for each prompt (prompts arrive already repeated num_generations times, each group's
        members adjacent).

        With `with_logprobs`, also the sampler's log-prob of each completion token (for rollout corrections). The
        core passes `images` only to a backend that declares `accepts_images`, and only where the prompts have some.
        """

    # Asynchronous generation (algorithm.max_staleness >= 1, docs/async.md) needs a method
    # `generate_in_background(prompt_ids, with_logprobs=False, images=None) -> Completions`: `generate` for this
    # process's prompts alone, with no collective call (every process asks for its own), so that it may run in a
    # thread while the training thread trains. The trainer never runs it and `update_weights` at once. None: not
    # supported (refused).
    generate_in_background: ClassVar[Callable | None] = None

    def update_weights(self, model: torch.nn.Module, step: int) -> None:
        """Called after every optimizer step, and once after a resume, with the optimizer steps done so far: a
        backend outside this process loads the new weights here (`step` is their version)."""

    def sampling(self, temperature: float | None, top_p: float | None) -> AbstractContextManager | None:
        """A context in which `generate` samples with this temperature and top-p (None: the run's) instead of the
        run's: evaluation's own settings (eval.temperature, eval.top_p). None: the backend samples with the run's
        settings only, and a run that asks for other ones is refused."""
        return None

    def close(self) -> None:
        """Called once when the run ends, whether it finished, stopped or failed: stop what `start` started."""


@dataclass
class RewardConfig:
    """Every reward's config extends this; the other fields reach the reward function as keyword arguments."""

    weight: float = 1.0  # this reward's weight in the sum the advantages are computed from


class Reward(Protocol):
    """A reward: called with TRL's reward signature for a batch of completions, one score each.

    A plain function with the same signature is a reward too; a class is built once per run, with its config
    when its `__init__` takes one. A score of None says the reward has no opinion on that completion.
    """

    # True: scoring holds the GIL for long (sympy in math verifiers), so the core scores in worker processes;
    # the reward must then pickle (a module-level class or function).
    cpu_heavy: ClassVar[bool] = False
    # Dataset columns it needs, checked before training; None: the keyword parameters of `__call__` that have no
    # default (a property, when they depend on the config).
    required_columns: ClassVar[list[str] | None] = None
    # True: calling it returns an awaitable although `__call__` is not itself `async def` (a wrapper around an
    # async function), so the core awaits it on its event loop instead of running it in a thread.
    is_coroutine: ClassVar[bool] = False

    def __init__(self) -> None: ...

    def __call__(
        self, prompts: list, completions: list, completion_ids: list[list[int]], **columns: Any
    ) -> list[float | None]:  # (N,)
        """The score of each completion; `columns` are the dataset's other columns, N values each."""

    # Optional, for a cpu_heavy reward: the scores it can give at once in this process (an exact string match,
    # say), as {row: score}; the workers score the other rows. Called like the reward itself.
    def quick_scores(self, prompts: list, completions: list, completion_ids: list[list[int]], **columns: Any) -> dict:
        return {}


class Environment(Protocol):
    """What a multi-turn rollout talks to (`+environment=NAME`, docs/agents.md): one instance per completion of a
    generation batch, built with the plugin's config and reset before every generation.

    Every other public method is a tool the model may call. Its name, type hints and Google-style docstring are
    what the chat template shows the model (transformers' `get_json_schema` reads them); it may be sync or async,
    and what it returns is given to the model as text. An exception it raises is shown to the model as an error
    and counted in `tools/failure_frequency`.
    """

    def __init__(self) -> None: ...

    def reset(self, **row: Any) -> str | None:
        """Start a new episode for the dataset row `row` (its `prompt` and other columns). A string is an
        observation, appended to the prompt's last user message."""


@dataclass
class RolloutResult:
    """What a custom rollout returns for N prompts (lists of N, in the order of the prompts it was handed)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # each up to and including its EOS, if it has one
    logprobs: list[list[float]] | None = None  # the sampler's log-prob of each completion token
    # 0 on the completion tokens the model did not write (tool results, an environment's feedback): the model reads
    # them but is not trained on them. None: the model wrote every token.
    env_mask: list[list[int]] | None = None
    completions: list | None = None  # what the rewards read; None: the decoded completion_ids
    columns: dict[str, list] = field(default_factory=dict)  # extra keyword arguments for the rewards, N values each


class Sampler(Protocol):
    """Which prompts make each generation batch (`+sampler=NAME`, docs/plugins/sampler.md): dataset rows by index.

    Every process holds its own sampler and makes the same calls with the same arguments (every process's draw,
    every process's scored groups), so that all of them decide alike; the core hands each process its share of a
    draw. Its state goes into checkpoints, so that a resumed run draws what the uninterrupted one would have.
    """

    # True: its draws depend on the rewards it observes. Asynchronous generation (algorithm.max_staleness) is then
    # refused: its worker draws ahead of the observations, and a resumed run could not draw as the first one did.
    uses_rewards: ClassVar[bool] = False

    def __init__(self) -> None: ...

    def start(self, dataset: Any, seed: int, shuffle: bool) -> None:
        """Called once, before the first draw: the training prompts (a `datasets.Dataset`, whose columns a sampler
        may read), the run's seed, and `data.shuffle` (false: the dataset's own order, where a sampler has one)."""

    def draw(self, count: int) -> list[int]:
        """The dataset indices of the next `count` prompts, every process's together."""

    def observe(self, indices: list[int], rewards: torch.Tensor) -> None:
        """After scoring, before any hook filters: each scored group's prompt index, and its (G, num_generations)
        rewards, NaN where no reward had an opinion; every process's groups, in process order."""

    def metrics(self) -> dict[str, float]:
        """What it did since the last call, logged under `sampler/` (pool sizes, prompts set aside, ...)."""
        return {}

    def state_dict(self) -> dict:
        """All it needs to draw on after a resume, as Python values (ints, floats, lists, dicts)."""

    def load_state_dict(self, state: dict) -> None: ...


class CustomRollout(Protocol):
    """A whole generation of its own (`+rollout=NAME`, TRL's `rollout_func`): prompts in, tokens out."""

    def __init__(self) -> None: ...

    def __call__(self, rows: list[dict], tokenizer: Any, generation: Generation) -> RolloutResult:
        """Completions for `rows` (this process's dataset rows, each repeated num_generations times, group
        members adjacent). `generation` is the run's backend, for a rollout that samples through it."""


PROTOCOLS = {
    "loss": Loss,
    "importance_sampling": ImportanceSampling,
    "rollout_correction": RolloutCorrection,
    "advantage": Advantage,
    "reward": Reward,
    "generation": Generation,
    "environment": Environment,
    "rollout": CustomRollout,
    "sampler": Sampler,
}
# What the core reads of a plugin before building it, to check a run's choices (grpo_kit/config/compatibility.py).
# Each has one source: a plugin registered by import path declares them to `register` as keywords, so that composing
# a run imports nothing of it, and not on its class; Registry.build sets them on the built object, where the core
# reads them with `declared` as it reads every other attribute. A class registered as such may carry them instead.
TRAITS = {
    "loss": ("importance_sampling_level", "rollout_correction_levels", "accumulation_invariant"),
    "importance_sampling": ("level",),
    "rollout_correction": ("level",),
    "advantage": ("needs_groups",),
    "generation": ("samples_from_policy", "structured_outputs"),
    "sampler": ("uses_rewards",),
}


def declared(plugin: Any, kind: str, name: str) -> Any:
    """`plugin`'s attribute `name`, or, where the plugin does not say, the default its kind's protocol gives (a
    method, such as `Loss.liger_loss`, bound to the plugin)."""
    default = getattr(PROTOCOLS[kind], name)
    return getattr(plugin, name, MethodType(default, plugin) if isfunction(default) else default)

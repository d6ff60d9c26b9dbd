"""The whole plugin contract.

A plugin is a module with functions marked ``@grpo_kit.hookimpl`` whose names are the hooks below. It reaches
grpo_kit through the ``grpo_kit`` entry-point group, exactly as the built-in plugins under ``plugins/`` do.

Every ``register_*`` hook is handed one callable, ``register(name, implementation, config=None, **traits)``:

- ``name`` is the one string users type (``+loss=NAME``), the registry key and the metric prefix;
- ``implementation`` is a class that is built with the plugin's config instance, ``implementation(config)``, or
  without one when its ``__init__`` takes nothing; a reward may also be a plain function with TRL's reward
  signature. Give its import path,
  ``"package.module:Class"``, and it is imported only when a run builds it: a plugin module must not import
  torch, which would then load with every ``grpo-kit`` command and every composed run;
- ``config`` is a dataclass, both the schema and the defaults of the plugin's options (``loss.epsilon=...``);
- ``traits`` are what the core checks a run's choices with before building anything
  (``grpo_kit.contract.kinds.TRAITS``: a loss's ``importance_sampling_level``, an advantage's ``needs_groups``, ...).
  Each is declared once: here, for an implementation registered by import path, which the built object then
  carries as attributes; or, for one registered as such, here or as its own attribute, not both.

What each kind of implementation provides, and every attribute the core reads of it with its default, is in
``grpo_kit/contract/kinds.py``.
"""

import pluggy

hookspec = pluggy.HookspecMarker("grpo_kit")
hookimpl = pluggy.HookimplMarker("grpo_kit")


@hookspec
def register_losses(register):
    """Register policy losses: the per-token loss and its reduction to a scalar."""


@hookspec
def register_importance_sampling(register):
    """Register importance-sampling levels: log weights from log(pi_theta / pi_old)."""


@hookspec
def register_rollout_corrections(register):
    """Register rollout corrections: a ratio for the mismatch between the sampler and the trainer."""


@hookspec
def register_advantages(register):
    """Register advantage estimators: (N,) advantages from the (N, K) reward matrix."""


@hookspec
def register_rewards(register):
    """Register reward functions with TRL's signature f(prompts, completions, completion_ids, **columns)."""


@hookspec
def register_generations(register):
    """Register generation backends: completions for a batch of prompts."""


@hookspec
def register_environments(register):
    """Register environments for multi-turn tool use: classes with `reset(**row)` and tool methods."""


@hookspec
def register_rollouts(register):
    """Register custom rollouts: a whole generation, prompts in, prompt and completion tokens out."""


@hookspec
def register_samplers(register):
    """Register prompt samplers: which dataset rows make each generation batch (`+sampler=NAME`)."""


@hookspec
def register_hooks(register):
    """Register hook plugins: classes built with their config whose `on_*` methods join the run (`+hook=NAME`)."""


# Pipeline hooks. A module registered through the entry points may implement them directly (always on); a hook
# plugin selected with `+hook=NAME` implements them as methods. `run` is the
# grpo_kit.contract.pipeline.Run being trained.


@hookspec
def on_train_start(run):
    """Once, before the first step; the model, tokenizer and run directory are ready."""


# The next two are chained, not called through pluggy: each implementation is handed what the one before it
# returned, in registration order (always-on modules, then `+hook=[a,b]`: a, then b; `hookimpl(tryfirst=True)`
# first, `trylast=True` last), so two filters both apply. They return a value, so they cannot be wrappers.


@hookspec
def on_rollout_scored(run, scored, draw):
    """A generation batch is scored, before advantages. Return a ScoredBatch of the same number of groups to use
    instead (filter or resample groups; `draw(num_prompts)` generates and scores more), or None to keep it."""


@hookspec
def on_advantages(run, scored, advantages):
    """Advantages (N,) are computed. Return replacement advantages of the same shape, or None to keep them."""


@hookspec
def on_step_end(run, step, metrics):
    """An optimizer step is done; `metrics` holds its values so far (name -> float)."""


@hookspec
def on_log(run, step, metrics):
    """Logged metrics of a logging window (name -> float, with `step`): the loggers write them.

    Not every name is in every line: `kl` needs algorithm.beta > 0, `eval/*` come with evaluations, and an
    evaluation before the first step (eval.on_start) logs a line of `step` 0 and `eval/*` metrics only.
    """


@hookspec
def on_save(run, directory):
    """The model and tokenizer were saved into `directory`."""


@hookspec
def on_train_end(run):
    """Once, after the last step and the final save."""

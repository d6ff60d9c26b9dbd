"""The policy model and its tokenizer, from the hub, a local folder, or the embedded default."""

import contextlib
import copy
import logging
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit.config.compose import ModelConfig
from grpo_kit.embedded import sums as embedded
from grpo_kit.model.fast.causal_attention import chunked_causal_attention_on_cpu
from grpo_kit.model.lora import AdapterFreeReference, add_adapters, check_peft_installed, has_adapters

log = logging.getLogger(__name__)


def load_model(cfg: ModelConfig, checkpointing_kwargs: dict | None = None):
    """The policy as `cfg` asks for it (adapters, dropout, head precision, checkpointing with
    `checkpointing_kwargs`), and its tokenizer."""
    if cfg.lora.enabled:
        check_peft_installed()
    path = str(Path(cfg.name_or_path).expanduser()) if cfg.name_or_path else embedded.model_path(cfg.embedded)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    if tokenizer.pad_token is None:
        log.info("The tokenizer has no pad token: padding with its EOS token %r", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    # float32 weights unless model_init_kwargs says otherwise, as TRL loads them (transformers alone would keep a
    # bfloat16 checkpoint in bfloat16); mixed precision is trainer.mixed_precision's autocast.
    init_kwargs = {"dtype": torch.float32, "trust_remote_code": cfg.trust_remote_code, **(cfg.model_init_kwargs or {})}
    model = AutoModelForCausalLM.from_pretrained(path, **init_kwargs)
    if cfg.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(model)
    if checkpointing_wanted(cfg.gradient_checkpointing, model):
        enable_checkpointing(model, checkpointing_kwargs)
        if cfg.lora.enabled:  # frozen embeddings: reentrant checkpointing would give the adapters no gradient
            model.enable_input_require_grads()
    if cfg.lora.enabled:
        model = add_adapters(model, cfg.lora)
    if cfg.disable_dropout:  # after the adapters, whose own dropout goes too
        disable_dropout(model)
    return model, tokenizer


def checkpointing_wanted(setting, model) -> bool:
    """model.gradient_checkpointing: true, false, or auto: on where the model's class supports it (TRL's default)."""
    if setting != "auto":
        return setting
    supported = getattr(model, "supports_gradient_checkpointing", False)
    log.info(
        "model.gradient_checkpointing=auto: %s", "on (TRL's default)" if supported
        else f"off, since {type(model).__name__} does not support gradient checkpointing",
    )
    return supported


def enable_checkpointing(model, kwargs: dict | None) -> None:
    """transformers' gradient checkpointing with `kwargs` (trainer.gradient_checkpointing_kwargs): its own
    every_n_layers and offload, the rest torch.utils.checkpoint's. use_reentrant defaults to false, as in TRL."""
    kwargs = {"use_reentrant": False, **(kwargs or {})}
    layers = {name: kwargs.pop(name) for name in ("every_n_layers", "offload") if name in kwargs}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed the method
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, **layers)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, **layers)


def disable_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):  # attention applies it as a float
            module.attention_dropout = 0.0


def cast_lm_head_to_fp32(model: torch.nn.Module) -> None:
    """Compute the logits in float32 whatever the rest of the model runs in, autocast included (ScaleRL)."""
    if model.config.get_text_config().tie_word_embeddings:
        raise ValueError(
            "model.cast_lm_head_to_fp32=true needs a model whose LM head is not tied to its input embeddings "
            "(its config has tie_word_embeddings=true): casting the head would cast the embeddings too. "
            "Turn the option off for this model."
        )
    head = model.get_output_embeddings()
    head.float()
    forward = head.forward

    def float32_forward(hidden_states):
        with torch.autocast(hidden_states.device.type, enabled=False):
            return forward(hidden_states.float())

    head.forward = float32_forward  # on the instance: the weights keep their names for save_pretrained


def load_reference_model(policy: torch.nn.Module, device: torch.device):
    """The KL term's reference: a frozen copy of the policy as it starts, on `device`. A LoRA policy's reference
    is its own base model, run with the adapters off, so no copy is made."""
    if has_adapters(policy):
        return AdapterFreeReference(policy)
    return copy.deepcopy(policy).eval().requires_grad_(False).to(device)


@torch.no_grad()
def mix_into_reference(policy: torch.nn.Module, reference: torch.nn.Module, alpha: float) -> None:
    """TR-DPO (Gorbatovski et al. 2024, https://arxiv.org/abs/2404.09656): ref <- alpha * policy + (1 - alpha) * ref."""
    for ref_param, param in zip(reference.parameters(), policy.parameters(), strict=True):
        ref_param.mul_(1.0 - alpha).add_(param, alpha=alpha)


def per_token_logps_and_entropies(
    model,
    batch: dict[str, torch.Tensor],
    temperature: float,
    entropy_grad: bool = False,
    chunk_size: int | None = None,
    router: "RouterLoads | None" = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T), (B, T)
    """One forward pass: log-probs of the completion tokens and the entropy of each next-token distribution.

    The entropies carry a gradient only when asked (an entropy bonus needs one); otherwise they are metrics.
    With `chunk_size`, the (B, T, V) logits never exist: see `chunked_logps_and_entropies`. With `router`, a
    mixture-of-experts model's router logits are collected into it, for the load-balancing loss.
    """
    if chunk_size is not None:
        head = OutputHead(model)
        hidden = last_hidden_states(model, batch, head, router)
        return chunked_logps_and_entropies(hidden, head, batch["completion_ids"], temperature, entropy_grad, chunk_size)
    return in_length_groups(
        lambda part: _logps_and_entropies_of_logits(model, part, temperature, entropy_grad, router), batch
    )


class RouterLoads:
    """A mixture-of-experts model's load-balancing loss (Switch Transformer, arXiv 2101.03961, eqs. 4-6) over the
    real tokens of one micro-batch, from the router logits of the one or more forward passes that cover it.

    The loss multiplies two means over every (layer, token) pair, so it is not a sum over passes: each pass's
    router logits and real-token mask are kept, and the loss is computed once over all of them, as one masked
    pass over the whole micro-batch gives it (TRL's). It is transformers' Mixtral function, which TRL 1.16 uses
    for every MoE family.
    """

    def __init__(self, model):
        text_config = unwrapped(model).config.get_text_config()
        self.num_experts, self.top_k = text_config.num_experts, text_config.num_experts_per_tok
        self.layers: list[list[torch.Tensor]] = []  # per pass: each MoE layer's (B * W, E) router logits
        self.masks: list[torch.Tensor] = []  # per pass: (B * W,) 1 on the real tokens

    def add(self, router_logits: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> None:
        """One pass's router logits, and its (B, W) real tokens in the layout it ran in."""
        self.layers.append(list(router_logits))
        self.masks.append(tokens.reshape(-1))

    def loss(self) -> torch.Tensor:  # scalar
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

        per_layer = tuple(torch.cat(logits) for logits in zip(*self.layers))
        return load_balancing_loss_func(per_layer, self.num_experts, self.top_k, torch.cat(self.masks)[None])


def _real_tokens(batch: dict[str, torch.Tensor], shift: torch.Tensor) -> torch.Tensor:  # (B, W)
    """1 on the prompt and completion tokens, in the layout `model_inputs` gave the pass (each row moved left by
    `shift`, its padding wrapped to its end)."""
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = attention_mask.shape[1]
    columns = torch.arange(width, device=attention_mask.device)
    return attention_mask.gather(1, (columns + shift[:, None]) % width)


def model_inputs(
    model, batch: dict[str, torch.Tensor], max_shift: int | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The model's inputs for one pass over the prompts and completions of `batch`, and how far each row was moved
    left (B,), for `completion_columns`.

    Prompts are padded on the left and completions on the right, so each row's tokens are one span between padding.
    Causal attention alone then keeps them from the padding once each row is moved left to start at column 0 (its
    padding wrapped to its end): no attention mask is passed, and SDPA runs its causal kernel without one instead of
    building and reading a (B, 1, W, W) mask (64 rows of 516 tokens, some left-padded, on the model of
    benchmarks/race.py: the forward and backward pass 3.5 -> 3.1 s on one CPU thread).
    Position ids keep each token's column in the padded layout, the positions that the masked pass gives it, so every
    token's values are the masked pass's up to float rounding. The masked pass stays where a row has padding inside
    its span (a custom rollout's mask may), where the moved padding's positions would pass the model's last one,
    and where a row would move by more than `max_shift`.
    """
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # (B, W)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # (B, W)
    width = input_ids.shape[1]
    columns = torch.arange(width, device=input_ids.device)  # (W,)
    shift = attention_mask.argmax(dim=1)  # (B,) the row's padding before its first token
    span = (columns >= shift[:, None]) & (columns < (shift + attention_mask.sum(dim=1))[:, None])  # (B, W)
    last_position = getattr(unwrapped(model).config.get_text_config(), "max_position_embeddings", None)
    longest_shift = int(shift.max())
    if (
        not torch.equal(span, attention_mask.bool())
        or (last_position and width + longest_shift > last_position)
        or (max_shift is not None and longest_shift > max_shift)
    ):
        return {"input_ids": input_ids, "attention_mask": attention_mask}, torch.zeros_like(shift)
    if not shift.any():
        return {"input_ids": input_ids}, shift
    moved = (columns + shift[:, None]) % width  # (B, W): the columns each row's tokens come from
    return {"input_ids": input_ids.gather(1, moved), "position_ids": columns + shift[:, None]}, shift


def completion_columns(shift: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:  # (B, 1), (B, T)
    """Rows and columns that pick, from a pass over `model_inputs` cut to its last `length + shift.max()` positions
    before the final one, the position that predicts each of the `length` completion tokens of each row."""
    rows = torch.arange(len(shift), device=shift.device).unsqueeze(1)
    return rows, (shift.max() - shift).unsqueeze(1) + torch.arange(length, device=shift.device)


def unwrapped(model):
    """The transformers model inside DDP/DeepSpeed's `.module` and the adapter-free reference of a LoRA policy."""
    if isinstance(model, AdapterFreeReference):
        model = model.policy
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # DistributedDataParallel, DeepSpeed
        model = model.module
    return model


def _logps_and_entropies_of_logits(model, batch, temperature: float, entropy_grad: bool, router=None):  # (B, T), (B, T)
    completion_ids = batch["completion_ids"]
    length = completion_ids.shape[1]
    width = batch["prompt_ids"].shape[1] + length
    # Moved rows need `shift.max()` more positions of logits: no more numbers than the (B, 1, W, W) mask they save.
    vocab = unwrapped(model).config.get_text_config().vocab_size
    inputs, shift = model_inputs(model, batch, max_shift=width * width // vocab)
    if router is not None:
        inputs["output_router_logits"] = True
    with chunked_causal_attention_on_cpu(unwrapped(model)):
        out = model(**inputs, logits_to_keep=length + 1 + int(shift.max()))
    if router is not None:
        router.add(out.router_logits, _real_tokens(batch, shift))
    logits = out.logits[:, :-1]  # the last predicts nothing
    log_probs = (logits.float() / temperature).log_softmax(dim=-1)  # (B, T + shift.max(), V)
    rows, columns = completion_columns(shift, length)  # position columns[b, t] predicts completion token t
    per_token_logps = log_probs[rows, columns, completion_ids]  # (B, T)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(log_probs.exp() * log_probs).sum(dim=-1)[rows, columns]
    return per_token_logps, entropies


class OutputHead:
    """The model's LM head (`get_output_embeddings()`) as its forward pass applies it to the last hidden states.

    It sees through the wrappers a policy may have: accelerate's DDP/DeepSpeed `.module`, PEFT (whose head is the
    base model's), and the adapter-free reference of a LoRA policy (whose head then runs with the adapters off).
    A final logit soft-capping in the model's config (Gemma 2) is applied as the model applies it, and the head runs
    under the autocast that the model's forward ran it under (`last_hidden_states` records it).
    """

    def __init__(self, model):
        self.adapters_off = contextlib.nullcontext
        if isinstance(model, AdapterFreeReference):
            self.adapters_off = model.policy.disable_adapter
        model = unwrapped(model)
        self.module = model.get_output_embeddings()
        if self.module is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None).")
        self.softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.autocast: tuple[str, torch.dtype] | None = None  # (device type, dtype) when the model ran it in one

    def precision(self):
        """The autocast the model's forward ran the head under (accelerate's mixed precision), or none."""
        return torch.autocast(self.autocast[0], dtype=self.autocast[1]) if self.autocast else contextlib.nullcontext()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        with self.adapters_off(), self.precision():
            logits = self.module(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def record_autocast(self, module, args) -> None:  # a forward pre-hook on the head
        device_type = args[0].device.type
        if torch.is_autocast_enabled(device_type):
            self.autocast = (device_type, torch.get_autocast_dtype(device_type))


def last_hidden_states(model, batch: dict[str, torch.Tensor], head: OutputHead, router=None) -> torch.Tensor:  # (B, T, H)
    """The final hidden states at the T positions that predict the completion tokens, from forward passes that
    compute the logits of the last position only.

    The model itself is called (not its inner decoder), so DDP's hooks, PEFT's adapters and the adapter-free
    reference work as in the plain path. Its last-position logits check that `head` reproduces the model's
    logits from these hidden states; a model that post-processes them otherwise is refused, not silently wrong.
    With `router`, the passes' router logits are collected into it (`RouterLoads`).
    """
    return in_length_groups(lambda part: _last_hidden_states(model, part, head, router), batch)


def _last_hidden_states(model, batch: dict[str, torch.Tensor], head: OutputHead, router=None) -> torch.Tensor:
    inputs, shift = model_inputs(model, batch)
    if router is not None:
        inputs["output_router_logits"] = True
    hook = head.module.register_forward_pre_hook(head.record_autocast)
    try:
        with chunked_causal_attention_on_cpu(unwrapped(model)):
            out = model(**inputs, output_hidden_states=True, logits_to_keep=1)
    finally:
        hook.remove()
    if getattr(out, "hidden_states", None) is None:
        raise ValueError(f"{type(model).__name__} returns no hidden states: use model.logits=full.")
    if router is not None:
        router.add(out.router_logits, _real_tokens(batch, shift))
    hidden = out.hidden_states[-1]  # (B, P + T, H), after the final norm
    with torch.no_grad():
        expected, ours = out.logits[:, -1].float(), head(hidden[:, -1]).float()
        difference = (expected - ours).abs().max().item()
        if not difference <= 1e-2 * expected.abs().max().item() + 1e-5:
            raise ValueError(
                f"{type(head.module).__name__} applied to the last hidden states does not give this model's logits "
                f"(they differ by up to {difference:.3g}): the model post-processes its logits in a way the chunked "
                "and Liger paths do not know. Use model.logits=full for this model."
            )
    length = batch["completion_ids"].shape[1]
    rows, columns = completion_columns(shift, length)
    return hidden[:, -(length + 1 + int(shift.max())) : -1][rows, columns]  # position t predicts completion token t


MIN_SAVING = 0.2  # two forward passes instead of one where they cover at least this share fewer positions


def length_groups(completion_mask: torch.Tensor, prompt_length: int) -> list[torch.Tensor]:
    """The rows of a micro-batch as one group, or as two by completion length (the shorter half, the longer half)
    where two forward passes, each as long as its own longest completion, cover MIN_SAVING fewer positions."""
    lengths = completion_mask.sum(dim=1).clamp(min=1)  # (B,)
    rows = torch.arange(len(lengths), device=lengths.device)
    if len(lengths) < 2:
        return [rows]
    short, long = lengths.argsort(stable=True).chunk(2)
    whole = len(lengths) * (prompt_length + int(lengths.max()))
    split = sum(len(half) * (prompt_length + int(lengths[half].max())) for half in (short, long))
    return [short, long] if split <= (1 - MIN_SAVING) * whole else [rows]


def in_length_groups(forward, batch: dict[str, torch.Tensor]):
    """`forward(batch)`, whose tensors are (B, T, ...) over the completion positions, computed for each length group
    on its own rows and as many completion positions as its longest completion; zeros where a group stops short.

    Each row's values are what one pass over the whole micro-batch gives, up to float rounding: causal attention
    never lets a position see the padding after it, and prompts keep their columns, so their positions.
    """
    completion_ids = batch["completion_ids"]
    groups = length_groups(batch["completion_mask"], batch["prompt_ids"].shape[1])
    if len(groups) == 1:
        return forward(batch)
    length = completion_ids.shape[1]
    outputs = []
    for rows in groups:
        width = max(int(batch["completion_mask"][rows].sum(dim=1).max()), 1)
        outputs.append(forward({
            "prompt_ids": batch["prompt_ids"][rows],
            "prompt_mask": batch["prompt_mask"][rows],
            "completion_ids": completion_ids[rows, :width],
            "completion_mask": batch["completion_mask"][rows, :width],
        }))
    order = torch.cat(groups)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)

    def assembled(parts):  # (B_g, width_g, ...) each -> (B, T, ...) in the micro-batch's row order
        padded = [nn.functional.pad(part, [0, 0] * (part.dim() - 2) + [0, length - part.shape[1]]) for part in parts]
        return torch.cat(padded)[inverse]

    if isinstance(outputs[0], tuple):
        return tuple(assembled(parts) for parts in zip(*outputs))
    return assembled(outputs)


def chunked_logps_and_entropies(
    hidden: torch.Tensor,  # (B, T, H): the final hidden states that predict the completion tokens
    head,  # (n, H) -> (n, V) logits, an OutputHead
    completion_ids: torch.Tensor,  # (B, T)
    temperature: float,
    entropy_grad: bool = False,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T), (B, T)
    """`per_token_logps_and_entropies`'s values, with the logits of at most `chunk_size` positions at a time.

    The (B, T) positions are flattened and cut into chunks. Each chunk's logits are computed without a graph and
    dropped; the backward pass recomputes them, one chunk at a time, and backpropagates the log-softmax's gradient
    through the head with autograd, so no (B, T, V) tensor ever exists and every parameter of the head (tied
    embeddings, adapters) gets its gradient.
    """
    batch_size, length, width = hidden.shape
    rows, ids = hidden.reshape(-1, width), completion_ids.reshape(-1)
    parameters = [parameter for parameter in head.module.parameters() if parameter.requires_grad]
    differentiable = torch.is_grad_enabled() and (rows.requires_grad or bool(parameters))
    logps, entropies = [], []
    for start in range(0, rows.shape[0], chunk_size):
        chunk, chunk_ids = rows[start : start + chunk_size], ids[start : start + chunk_size]
        if differentiable:
            values = _ChunkLogps.apply(head, temperature, entropy_grad, chunk, chunk_ids, *parameters)
        else:
            values = _logps_and_entropies(head, chunk, chunk_ids, temperature)
        logps.append(values[0])
        entropies.append(values[1])
    return torch.cat(logps).view(batch_size, length), torch.cat(entropies).view(batch_size, length)


@torch.no_grad()
def _logps_and_entropies(head, hidden, ids, temperature: float):  # (n,), (n,)
    """The plain path's operations on (n, H) hidden states, so the same values row for row, holding at most three
    (n, V) tensors at a time."""
    logits = head(hidden).float().div_(temperature)  # the head's fresh output, so writing into it is safe
    log_probs = logits.log_softmax(dim=-1)
    del logits
    per_token_logps = log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    entropies = -log_probs.exp().mul_(log_probs).sum(dim=-1)
    return per_token_logps, entropies


class _ChunkLogps(torch.autograd.Function):
    """Log-probs and entropies of one chunk, whose logits the backward pass recomputes instead of keeping.

    With z = head(h) / temperature and p = softmax(z), the gradient with respect to z is
    g_logp * (onehot(token) - p) - g_entropy * p * (log p + entropy); autograd takes it through the head.
    """

    @staticmethod
    def forward(ctx, head, temperature, entropy_grad, hidden, ids, *parameters):
        per_token_logps, entropies = _logps_and_entropies(head, hidden, ids, temperature)
        ctx.head, ctx.temperature, ctx.entropy_grad = head, temperature, entropy_grad
        ctx.save_for_backward(hidden, ids, entropies, *parameters)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropies)
        return per_token_logps, entropies

    @staticmethod
    def backward(ctx, grad_logps, grad_entropies):
        hidden, ids, entropies, *parameters = ctx.saved_tensors
        with torch.enable_grad():
            hidden = hidden.detach().requires_grad_(ctx.needs_input_grad[3])
            logits = ctx.head(hidden)  # (n, V), with its graph through the head
        with torch.no_grad():
            log_probs = (logits.detach().float() / ctx.temperature).log_softmax(dim=-1)
            probs = log_probs.exp()
            grad_logps = grad_logps.float().unsqueeze(-1) / ctx.temperature  # (n, 1), the 1 / temperature folded in
            if ctx.entropy_grad:
                grad_entropies = grad_entropies.float().unsqueeze(-1) / ctx.temperature
                grad = log_probs.add_(entropies.unsqueeze(-1)).mul_(grad_entropies).add_(grad_logps).mul_(probs).neg_()
                del probs
            else:
                del log_probs
                grad = probs.mul_(-grad_logps)
            grad.scatter_add_(-1, ids.unsqueeze(-1), grad_logps)
        inputs = [hidden] if hidden.requires_grad else []
        inputs += parameters
        grads = iter(torch.autograd.grad(logits, inputs, grad.to(logits.dtype), allow_unused=True))
        grad_hidden = next(grads) if hidden.requires_grad else None
        return None, None, None, grad_hidden, None, *grads

"""The plain path: per-token log-probs and entropies of a micro-batch's completions under a model.

One forward pass over each row's prompt and completion with its attention mask, the logits of the positions that
predict the completion tokens, their log-softmax. The speed-ups beside it (grpo_kit/model/fast/, docs/training.md,
"Speed-ups") each step in at one named point, and each gives these values up to float rounding:
- `model_inputs`: the mask-free inputs (fast/mask_free.py);
- `per_token_logps_and_entropies` and `last_hidden_states`: length groups (fast/length_groups.py), and each pass's
  width rounded up to a multiple (fast/stable_widths.py);
- `per_token_logps_and_entropies`: chunked logits, when the caller gives a chunk size (fast/chunked_logits.py), and
  tiled logits, when it also gives a vocabulary tile (fast/tiled_logits.py);
- `run_model`: the CPU's chunked causal attention (fast/causal_attention.py), and masks built unread
  (fast/unread_masks.py).
With trainer.packing, `per_token_logps_and_entropies` and `last_hidden_states` run padding-free passes instead
(packing.py), whose hidden states every logits path reads.
"""

import contextlib

import torch

from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.model import vision
from grpo_kit.model.fast.causal_attention import chunked_causal_attention_on_cpu
from grpo_kit.model.fast.chunked_logits import chunked_logps_and_entropies
from grpo_kit.model.fast.compiled import compiled_call
from grpo_kit.model.fast.length_groups import in_length_groups
from grpo_kit.model.fast.mask_free import longest_move_for_logits, mask_free_inputs, row_spans
from grpo_kit.model.fast.stable_widths import at_a_multiple_width, width_multiple
from grpo_kit.model.fast.switches import SpeedUps, speed_ups_of, takes_length_groups
from grpo_kit.model.fast.tiled_logits import tiled_logps_and_entropies, why_not_tiled
from grpo_kit.model.fast.unread_masks import masks_built_unread
from grpo_kit.model.lora import AdapterFreeReference
from grpo_kit.model.packing import CHECKED, PackedRows, check_packing, pack, unpacked

HEAD_CHECKED = "_grpo_kit_head_checked"  # set on a model whose head was found to give its logits (`_check_head`)


def per_token_logps_and_entropies(
    model,
    batch: MicroBatch,
    temperature: float,
    entropy_grad: bool = False,
    chunk_size: int | None = None,
    router: "RouterLoads | None" = None,
    vocab_tile: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T), (B, T)
    """Log-probs of the completion tokens and the entropy of each next-token distribution.

    The entropies carry a gradient only when asked (an entropy bonus needs one); otherwise they are metrics.
    With `chunk_size`, the (B, T, V) logits never exist: see `chunked_logps_and_entropies`; with `vocab_tile` too,
    no row of logits either, wherever the head allows it: see `tiled_logps_and_entropies`. With `router`, a
    mixture-of-experts model's router logits are collected into it, for the load-balancing loss.
    """
    if chunk_size is not None:
        head = OutputHead(model)
        hidden = last_hidden_states(model, batch, head, router)
        ids = batch.completion_ids
        if vocab_tile is not None and why_not_tiled(head) is None:
            return tiled_logps_and_entropies(hidden, head, ids, temperature, entropy_grad, chunk_size, vocab_tile)
        return chunked_logps_and_entropies(hidden, head, ids, temperature, entropy_grad, chunk_size)
    packed = pack(batch) if speed_ups(model).packing else None
    if packed is not None:
        head = OutputHead(model)
        hidden = packed_hidden_states(model, batch, packed, head, router)
        return _logps_and_entropies_of_hidden(hidden, head, batch.completion_ids, temperature, entropy_grad)

    def logits_pass(part):
        return _logps_and_entropies_of_logits(model, part, temperature, entropy_grad, router)

    return in_passes(model, logits_pass, batch)


def _logps_and_entropies_of_logits(model, batch, temperature: float, entropy_grad: bool, router=None):  # (B, T), (B, T)
    completion_ids = batch.completion_ids
    length = completion_ids.shape[1]
    width = batch.prompt_ids.shape[1] + length
    vocab = unwrapped(model).config.get_text_config().vocab_size
    inputs, shift, longest_shift = model_inputs(model, batch, max_shift=longest_move_for_logits(width, vocab))
    if router is not None:
        inputs["output_router_logits"] = True
    out = run_model(model, inputs, logits_to_keep=length + 1 + longest_shift)
    if router is not None:
        router.add(out.router_logits, _real_tokens(batch, shift))
    logits = out.logits[:, :-1]  # the last predicts nothing
    log_probs = (logits.float() / temperature).log_softmax(dim=-1)  # (B, T + longest_shift, V)
    rows, columns = completion_columns(shift, length, longest_shift)  # position columns[b, t] predicts token t
    per_token_logps = log_probs[rows, columns, completion_ids]  # (B, T)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(log_probs.exp() * log_probs).sum(dim=-1)[rows, columns]
    return per_token_logps, entropies


def _logps_and_entropies_of_hidden(hidden, head, completion_ids, temperature: float, entropy_grad: bool):
    """The full logits path's values from (B, T, H) hidden states: the head's logits of every position at once."""
    log_probs = (head(hidden).float() / temperature).log_softmax(dim=-1)  # (B, T, V)
    per_token_logps = log_probs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(log_probs.exp() * log_probs).sum(dim=-1)
    return per_token_logps, entropies


def model_inputs(
    model, batch: MicroBatch, max_shift: int | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
    """The model's inputs for one pass over the prompts and completions of `batch`, how far each row was moved left
    (B,), and the farthest any row may have moved (an int the host knows without reading the batch), both for
    `completion_columns`: the prompts (padded on the left) and completions (on the right) side by side with their
    attention mask, rows unmoved; where the model takes mask-free passes, rows moved left instead, by at most
    `max_shift` (fast/mask_free.py)."""
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, W)
    attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)  # (B, W)
    images = vision.model_kwargs(batch, input_ids, unwrapped(model))
    # A vision-language model numbers its positions from the attention mask itself (M-RoPE): rows stay in place.
    if speed_ups(model).mask_free_passes and not images:
        spans = row_spans(batch)
        text_config = unwrapped(model).config.get_text_config()
        moved = mask_free_inputs(input_ids, attention_mask, text_config, spans, max_shift)
        if moved is not None:
            return *moved, spans.longest_shift
    unmoved = torch.zeros(len(input_ids), dtype=torch.long, device=input_ids.device)
    return {"input_ids": input_ids, "attention_mask": attention_mask, **images}, unmoved, 0


def completion_columns(
    shift: torch.Tensor, length: int, longest_shift: int
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, 1), (B, T)
    """Rows and columns that pick, from a pass over `model_inputs` cut to its last `length + longest_shift`
    positions before the final one, the position that predicts each of the `length` completion tokens of each row
    (`longest_shift` at least every row's shift)."""
    rows = torch.arange(len(shift), device=shift.device).unsqueeze(1)
    return rows, (longest_shift - shift).unsqueeze(1) + torch.arange(length, device=shift.device)


def run_model(model, inputs: dict[str, torch.Tensor], **kwargs):
    """The model's forward pass over `inputs`: with an attention mask, one built without reading it back
    (fast/unread_masks.py); without, on the CPU, with the chunked causal attention where it applies."""
    if "attention_mask" in inputs:
        attention = masks_built_unread(unwrapped(model))
    elif speed_ups(model).cpu_chunked_attention:
        attention = chunked_causal_attention_on_cpu(unwrapped(model))
    else:
        attention = contextlib.nullcontext()
    with attention:
        compile_options = speed_ups(model).torch_compile
        if compile_options is not None:
            return compiled_call(compile_options, model, inputs, kwargs)
        return model(**inputs, **kwargs)


def speed_ups(model) -> SpeedUps:
    """The speed-ups `model`'s passes take (model.mask_free_passes, model.passes_by_length,
    model.cpu_chunked_attention)."""
    return speed_ups_of(unwrapped(model))


def unwrapped(model):
    """The transformers model inside DDP/DeepSpeed's `.module` and the adapter-free reference of a LoRA policy."""
    if isinstance(model, AdapterFreeReference):
        model = model.policy
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # DistributedDataParallel, DeepSpeed
        model = model.module
    return model


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


def _real_tokens(batch: MicroBatch, shift: torch.Tensor) -> torch.Tensor:  # (B, W)
    """1 on the prompt and completion tokens, in the layout `model_inputs` gave the pass (each row moved left by
    `shift`, its padding wrapped to its end)."""
    attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    width = attention_mask.shape[1]
    columns = torch.arange(width, device=attention_mask.device)
    return attention_mask.gather(1, (columns + shift[:, None]) % width)


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


def last_hidden_states(model, batch: MicroBatch, head: OutputHead, router=None) -> torch.Tensor:  # (B, T, H)
    """The final hidden states at the T positions that predict the completion tokens, from forward passes that
    compute the logits of the last position only.

    The model itself is called (not its inner decoder), so DDP's hooks, PEFT's adapters and the adapter-free
    reference work as in the plain path. The first pass over each model checks, from its last-position logits,
    that `head` reproduces the model's logits from these hidden states; a model that post-processes them otherwise
    is refused, not silently wrong.
    With `router`, the passes' router logits are collected into it (`RouterLoads`).
    """

    packed = pack(batch) if speed_ups(model).packing else None
    if packed is not None:
        return packed_hidden_states(model, batch, packed, head, router)

    def hidden_pass(part):
        return _last_hidden_states(model, part, head, router)

    return in_passes(model, hidden_pass, batch)


def in_passes(model, forward, batch: MicroBatch):
    """`forward(batch)` as the padded path runs it: in length groups where they apply, each pass's width rounded up to
    model.pad_to_multiple_of."""
    device = batch.completion_ids.device
    multiple = width_multiple(speed_ups(model).pad_to_multiple_of, device)

    def one_pass(part):
        return at_a_multiple_width(forward, part, multiple)

    return in_length_groups(one_pass, batch) if takes_length_groups(speed_ups(model), device) else one_pass(batch)


def _last_hidden_states(model, batch: MicroBatch, head: OutputHead, router=None) -> torch.Tensor:
    inputs, shift, longest_shift = model_inputs(model, batch)
    out = _hidden_pass(model, inputs, head, router)
    if router is not None:
        router.add(out.router_logits, _real_tokens(batch, shift))
    hidden = out.hidden_states[-1]  # (B, P + T, H), after the final norm
    length = batch.completion_ids.shape[1]
    rows, columns = completion_columns(shift, length, longest_shift)
    return hidden[:, -(length + 1 + longest_shift) : -1][rows, columns]  # position t predicts completion token t


def packed_hidden_states(model, batch, packed: PackedRows, head: OutputHead, router=None) -> torch.Tensor:  # (B, T, H)
    """`last_hidden_states` from one pass over `batch` packed (packing.py); the first over a model checks that its
    packed pass gives the padded pass's values."""
    inner = unwrapped(model)
    if not getattr(inner, CHECKED, False):
        training = inner.training
        inner.eval()  # no dropout in the comparison
        try:
            check_packing(
                inner,
                batch,
                run_padded=lambda probe: _last_hidden_states(model, probe, head),
                run_packed=lambda probe_packed: _packed_pass(model, probe_packed, head),
            )
        finally:
            inner.train(training)
    return _packed_pass(model, packed, head, router)


def _packed_pass(model, packed: PackedRows, head: OutputHead, router=None) -> torch.Tensor:  # (B, T, H)
    # Without a cache: transformers looks for packed sequences only in a pass that has none.
    out = _hidden_pass(model, packed.inputs | {"use_cache": False}, head, router)
    if router is not None:
        router.add(out.router_logits, packed.real)
    return unpacked(out.hidden_states[-1], packed)


def _hidden_pass(model, inputs: dict[str, torch.Tensor], head: OutputHead, router=None):
    """The model's pass over `inputs` with its hidden states and the last position's logits, which must be what
    `head` gives from its last hidden states."""
    if router is not None:
        inputs = inputs | {"output_router_logits": True}
    hook = head.module.register_forward_pre_hook(head.record_autocast)
    try:
        out = run_model(model, inputs, output_hidden_states=True, logits_to_keep=1)
    finally:
        hook.remove()
    if getattr(out, "hidden_states", None) is None:
        raise ValueError(f"{type(model).__name__} returns no hidden states: use model.logits=full.")
    if not getattr(unwrapped(model), HEAD_CHECKED, False):
        _check_head(out, head)
        setattr(unwrapped(model), HEAD_CHECKED, True)
    return out


def _check_head(out, head: OutputHead) -> None:
    """`head` applied to the last hidden states gives the model's logits, else ValueError. Once per model: what it
    finds is the model's own (how its forward post-processes its logits), and each check reads values back, which
    on a GPU waits for the whole pass."""
    with torch.no_grad():
        expected, ours = out.logits[:, -1].float(), head(out.hidden_states[-1][:, -1]).float()
        difference = (expected - ours).abs().max().item()
        if not difference <= 1e-2 * expected.abs().max().item() + 1e-5:
            raise ValueError(
                f"{type(head.module).__name__} applied to the last hidden states does not give this model's logits "
                f"(they differ by up to {difference:.3g}): the model post-processes its logits in a way the chunked "
                "and Liger paths do not know. Use model.logits=full (and trainer.packing=false) for this model."
            )

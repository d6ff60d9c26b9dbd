"""Log-probs and entropies from the last hidden states a tile at a time: positions x a slice of the vocabulary.

What it saves: the chunked path (chunked_logits.py) still holds whole rows of logits, a chunk of positions by the
whole vocabulary, several times over (the logits, their float32 copy, the log-softmax, its gradient): at Qwen2's
151,936 tokens, a chunk of 1,024 positions is 620 MB per float32 copy. Here no tensor holds more than a tile of
logits, `chunk_size` positions x `vocab_tile` columns: each tile's logits are computed in the precision the model
runs its head in (autocast's bf16 under mixed precision), and folded in float32 into a running maximum, sum of
exponentials and sum of exponentials times logits, which give the log-sum-exp, each token's log-prob and the entropy.
The backward pass computes each tile's logits again and multiplies its gradient straight into the gradients of the
hidden states, the head's weight and its bias, so the (positions, vocabulary) gradient never exists either. In
float32 the values and gradients are the plain path's up to float rounding (tests/test_tiled_logits.py).

When it applies: model.logits=tiled, for the training pass and the old and reference log-probs, where the head is a
plain linear layer whose forward nobody replaced and whose logits are not soft-capped; elsewhere the chunked path
runs, and the log says why (policy_loss.py).

Switch: model.logits; model.logits_chunk_size sets the positions of a tile, model.logits_vocab_tile its columns.
"""

import torch


def why_not_tiled(head) -> str | None:
    """Why the tiled path cannot stand in for this head (an OutputHead), which it multiplies by itself; None when it
    can."""
    module = head.module
    if type(module) is not torch.nn.Linear:
        return f"the LM head is a {type(module).__name__}, not a plain torch.nn.Linear (adapters on the head?)"
    if "forward" in vars(module):
        return "the LM head's forward has been replaced (model.cast_lm_head_to_fp32?), which the tiles would skip"
    if head.softcap:
        return "the model soft-caps its logits (final_logit_softcapping), which the running log-sum-exp does not"
    if type(module.weight) is not torch.nn.Parameter or module.weight.dim() != 2 or module.weight.numel() == 0:
        return "the LM head's weight is not a whole matrix on this process (sharded by FSDP or ZeRO-3?)"
    return None


def tiled_logps_and_entropies(
    hidden: torch.Tensor,  # (B, T, H): the final hidden states that predict the completion tokens
    head,  # an OutputHead whose module is a plain torch.nn.Linear (why_not_tiled)
    completion_ids: torch.Tensor,  # (B, T)
    temperature: float,
    entropy_grad: bool = False,
    chunk_size: int = 1024,
    vocab_tile: int = 32768,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, T), (B, T)
    """`per_token_logps_and_entropies`'s values, holding the logits of at most `chunk_size` positions x `vocab_tile`
    vocabulary columns at a time, in the forward pass and in the backward."""
    batch_size, length, width = hidden.shape
    rows, ids = hidden.reshape(-1, width), completion_ids.reshape(-1)
    weight, bias = head.module.weight, head.module.bias
    logps, entropies = [], []
    for start in range(0, rows.shape[0], chunk_size):
        chunk, chunk_ids = rows[start : start + chunk_size], ids[start : start + chunk_size]
        values = _TiledLogps.apply(head, temperature, entropy_grad, vocab_tile, chunk, chunk_ids, weight, bias)
        logps.append(values[0])
        entropies.append(values[1])
    return torch.cat(logps).view(batch_size, length), torch.cat(entropies).view(batch_size, length)


def _tiles(vocab: int, vocab_tile: int):
    return ((start, min(start + vocab_tile, vocab)) for start in range(0, vocab, vocab_tile))


def _tile_logits(head, hidden, weight, bias, start: int, end: int, temperature: float) -> torch.Tensor:  # (n, tile)
    """One tile's tempered logits in float32, the product itself in the head's precision."""
    with head.precision():
        logits = torch.nn.functional.linear(hidden, weight[start:end], None if bias is None else bias[start:end])
    return logits.float().div_(temperature)


class _TiledLogps(torch.autograd.Function):
    """Log-probs and entropies of one chunk of positions, its logits a vocabulary tile at a time.

    With z = head(h) / temperature, lse its log-sum-exp, p = exp(z - lse) and entropy H = lse - sum(p * z), the
    gradient with respect to z is g_logp * (onehot(token) - p) - g_entropy * p * (z - lse + H).
    """

    @staticmethod
    def forward(ctx, head, temperature, entropy_grad, vocab_tile, hidden, ids, weight, bias):
        with torch.no_grad():
            rows = hidden.shape[0]
            running_max = hidden.new_full((rows,), float("-inf"), dtype=torch.float32)  # (n,)
            total = hidden.new_zeros(rows, dtype=torch.float32)  # (n,) sum of exp(z - running_max)
            weighted = hidden.new_zeros(rows, dtype=torch.float32)  # (n,) sum of exp(z - running_max) * z
            target = hidden.new_zeros(rows, dtype=torch.float32)  # (n,) the token's z
            for start, end in _tiles(weight.shape[0], vocab_tile):
                z = _tile_logits(head, hidden, weight, bias, start, end, temperature)  # (n, tile)
                new_max = torch.maximum(running_max, z.amax(dim=-1))
                rescale = (running_max - new_max).exp()
                exponentials = (z - new_max.unsqueeze(-1)).exp_()
                total = total * rescale + exponentials.sum(dim=-1)
                weighted = weighted * rescale + (exponentials * z).sum(dim=-1)
                running_max = new_max
                inside = (ids >= start) & (ids < end)
                column = (ids - start).clamp(0, end - start - 1).unsqueeze(-1)
                target = torch.where(inside, z.gather(-1, column).squeeze(-1), target)
            log_sum_exp = running_max + total.log()
            per_token_logps = target - log_sum_exp
            entropies = log_sum_exp - weighted / total
        ctx.head, ctx.temperature, ctx.entropy_grad, ctx.vocab_tile = head, temperature, entropy_grad, vocab_tile
        ctx.save_for_backward(hidden, ids, log_sum_exp, entropies, weight, bias)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropies)
        return per_token_logps, entropies

    @staticmethod
    def backward(ctx, grad_logps, grad_entropies):
        hidden, ids, log_sum_exp, entropies, weight, bias = ctx.saved_tensors
        wants_hidden, wants_weight = ctx.needs_input_grad[4], ctx.needs_input_grad[6]
        wants_bias = bias is not None and ctx.needs_input_grad[7]
        grad_hidden = torch.zeros_like(hidden, dtype=torch.float32) if wants_hidden else None  # (n, H)
        grad_weight = torch.zeros_like(weight) if wants_weight else None  # (V, H)
        grad_bias = torch.zeros_like(bias) if wants_bias else None  # (V,)
        grad_logps = grad_logps.float().unsqueeze(-1)  # (n, 1)
        grad_entropies = grad_entropies.float().unsqueeze(-1) if ctx.entropy_grad else None
        with torch.no_grad():
            for start, end in _tiles(weight.shape[0], ctx.vocab_tile):
                log_probs = _tile_logits(ctx.head, hidden, weight, bias, start, end, ctx.temperature)
                log_probs.sub_(log_sum_exp.unsqueeze(-1))  # (n, tile)
                if grad_entropies is not None:
                    scale = log_probs.add(entropies.unsqueeze(-1)).mul_(grad_entropies).add_(grad_logps)
                else:
                    scale = grad_logps
                grad = log_probs.exp_().mul_(scale).neg_()  # (n, tile), written over the log-probs
                # The one-hot term, added where the token is in this tile (zero elsewhere): a boolean index would
                # size its result by the mask's values, a read of the GPU.
                inside = ((ids >= start) & (ids < end)).unsqueeze(-1)  # (n, 1)
                column = (ids - start).clamp(0, end - start - 1).unsqueeze(-1)  # (n, 1)
                grad.scatter_add_(-1, column, torch.where(inside, grad_logps, 0.0))
                grad.div_(ctx.temperature)  # the gradient of the logits before the temperature
                with ctx.head.precision():
                    if grad_hidden is not None:
                        grad_hidden += torch.matmul(grad, weight[start:end]).float()
                    if grad_weight is not None:
                        grad_weight[start:end] = torch.matmul(grad.t(), hidden).to(grad_weight.dtype)
                if grad_bias is not None:
                    grad_bias[start:end] = grad.sum(dim=0).to(grad_bias.dtype)
        grad_hidden = None if grad_hidden is None else grad_hidden.to(hidden.dtype)
        return None, None, None, None, grad_hidden, None, grad_weight, grad_bias

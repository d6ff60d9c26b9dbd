"""Log-probs and entropies from the last hidden states, a chunk of positions at a time: no (B, T, V) logits.

What it saves: the memory of the logits, which a large vocabulary makes the largest tensors of a step (the plain
path holds several (B, T, V) tensors: the logits, their tempered copy, the log-softmax, its gradient). The
(B, T) positions are cut into chunks whose logits are computed without a graph and dropped; the backward pass
recomputes them one chunk at a time. The values are the plain path's: the same operations, row for row.

When it applies: model.logits=chunked, and model.logits=liger wherever Liger does not compute the loss; the old and
reference log-probs whenever model.logits is not full. The policy loss (grpo_kit/objective/policy_loss.py) chooses.

Switch: model.logits=full (the default) is the plain path; model.logits_chunk_size sets the chunk. Figures:
benchmarks/README.md, "Chunked logits".
"""

import torch


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

"""Is an encoder permutation equivariant? Shuffle the tokens of real sources, encode, un-shuffle the output and
compare (claim E4: self-attention without positions is a set operation; works on any net with
``encode(src, src_mask)``)."""

from __future__ import annotations

import torch


def shuffle_rows(batch: dict, gen: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each row's real tokens in a random order other than the original (padding stays at the end)."""
    src, perms = batch["src"].clone(), []
    for b, n in enumerate(batch["src_mask"].sum(1).tolist()):
        perm = torch.arange(n)
        while n > 1 and torch.equal(perm, torch.arange(n)):
            perm = torch.randperm(n, generator=gen)
        src[b, :n] = batch["src"][b, :n][perm]
        perms.append(perm)
    return src, perms


@torch.no_grad()
def equivariance_error(net, batches: list[dict], limit: int, seed: int = 0) -> tuple[float, float]:
    """(max, median) over sentences of max |encode(x)[i] - encode(shuffle(x))[perm^-1(i)]|, one sentence at a time
    (no padding in the batch); the encoder ends in a norm, so outputs are O(1) and the error is comparable."""
    gen = torch.Generator().manual_seed(seed)
    errors = []
    for batch in batches:
        shuffled, perms = shuffle_rows(batch, gen)
        for b, perm in enumerate(perms):
            n = len(perm)
            if n < 2 or len(errors) >= limit:
                continue
            mask = torch.ones(1, n, dtype=torch.bool)
            out = net.encode(batch["src"][b : b + 1, :n], mask)[0]
            out_shuffled = net.encode(shuffled[b : b + 1, :n], mask)[0]
            errors.append(float((out_shuffled[torch.argsort(perm)] - out).abs().max()))
    errors_t = torch.tensor(errors)
    return float(errors_t.max()), float(errors_t.median())

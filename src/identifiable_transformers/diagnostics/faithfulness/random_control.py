"""The random control: each example's own seeded random order of its tokens (docs/faithfulness.md).

An example's order depends only on (seed, draw, the example's real token ids): never on the batch it
sits in, its row or the padded width, so the control scores an example the same wherever it is.
Two different examples get independent orders (their token ids differ, so their generators' seeds do);
draw d is the (d+1)-th permutation of the example's generator.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from ._common import _scorable

RANDOM_DRAWS = 10  # draws averaged by faithfulness_report; their spread is logged as <metric>_std


def example_seed(seed: int, token_ids: Tensor) -> int:
    """A 63-bit generator seed from (seed, the example's real token ids), stable across runs and machines."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{int(seed)}:".encode())
    h.update(token_ids.detach().to("cpu", torch.int64).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def random_draws(input_ids: Tensor, mask: Tensor, seed: int = 0, draws: int = 1,
                 pinned: Tensor | None = None) -> list[Tensor]:
    """``draws`` (B, T) score tensors: in draw d, a random permutation of 1..n / n over each example's n
    scorable tokens (0 elsewhere, ``pinned`` ones included), the (d+1)-th permutation of a generator seeded by
    ``example_seed``."""
    scorable = _scorable(mask, None if pinned is None else pinned.to(mask.device)).cpu()
    out = torch.zeros(draws, *mask.shape, dtype=torch.float32)
    ids, real = input_ids.cpu(), mask.cpu()
    for b in range(ids.shape[0]):
        n = int(scorable[b].sum())
        if n == 0:
            continue
        g = torch.Generator().manual_seed(example_seed(seed, ids[b][real[b]]))
        perms = torch.stack([torch.randperm(n, generator=g) for _ in range(draws)])  # (draws, n)
        out[:, b, scorable[b]] = (perms + 1).float() / n  # distinct scores: no ties
    return list(out.to(mask.device).unbind(0))


def random_scores(input_ids: Tensor, mask: Tensor, seed: int = 0, draw: int = 0,
                  pinned: Tensor | None = None) -> Tensor:
    """(B, T) scores of draw ``draw`` (see ``random_draws``)."""
    return random_draws(input_ids, mask, seed, draw + 1, pinned)[draw]

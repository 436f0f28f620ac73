"""The random control: each example's own seeded random order of its tokens (docs/faithfulness.md).

An example's order depends only on (seed, draw, the example's real token ids): never on the batch it
sits in, its row or the padded width, so the control scores an example the same wherever it is.
Two different examples get independent orders (their token ids differ, so their seeds do).
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from ._common import _scorable

RANDOM_DRAWS = 10  # draws averaged by faithfulness_report; their spread is logged as <metric>_std


def example_seed(seed: int, draw: int, token_ids: Tensor) -> int:
    """A 63-bit generator seed from (seed, draw, the example's real token ids), stable across runs and machines."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{int(seed)}:{int(draw)}:".encode())
    h.update(token_ids.detach().to("cpu", torch.int64).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def random_scores(input_ids: Tensor, mask: Tensor, seed: int = 0, draw: int = 0) -> Tensor:
    """(B, T) scores: a seeded random permutation of 1..n / n over each example's n scorable tokens, 0 elsewhere."""
    scorable = _scorable(mask)
    out = torch.zeros(mask.shape, dtype=torch.float32)
    ids, real, sc = input_ids.cpu(), mask.cpu(), scorable.cpu()
    for b in range(ids.shape[0]):
        n = int(sc[b].sum())
        if n == 0:
            continue
        g = torch.Generator().manual_seed(example_seed(seed, draw, ids[b][real[b]]))
        out[b, sc[b]] = (torch.randperm(n, generator=g) + 1).float() / n  # distinct: no ties
    return out.to(mask.device)

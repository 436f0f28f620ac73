"""ERASER comprehensiveness and sufficiency (AOPC) and the decision-flip fraction of every explainer at once.

What each metric reads of an explainer's order (docs/faithfulness.md): sufficiency the copies that keep only the
top ``counts`` tokens (AOPC_BINS percent of the scorable ones), comprehensiveness the copies without them, and the
flip fraction the first s at which removing the top s tokens changes the prediction. So the removal curve is needed
only up to its first flip: it is scanned from s = 1 in growing windows and left as soon as it has flipped (an
example that never flips still costs all n copies). Each window is one batch over every explainer's copies, and a
copy that several explainers share (the same example and the same kept tokens, common among the first few
removals) runs once. The numbers are those of running every copy.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import _order, _pinned, _ranks, _scorable
from .readout import _MaskedCopies

AOPC_BINS = (1, 5, 10, 20, 50)  # percent of the real tokens (ERASER, DeYoung et al. 2020)
_FIRST_WINDOW = 4  # removals scanned in the first window, and at least in each next one
_WINDOW_SHARE = 4  # each next window: a quarter of the scanned prefix (scanning past the flip costs at most that)


def _erasure_metrics(model, ids: Tensor, mask: Tensor, scores: dict[str, Tensor], pred: Tensor, prob: Tensor
                     ) -> dict[str, Tensor]:
    """comprehensiveness, sufficiency (AOPC over AOPC_BINS) and flip_frac per example, for each explainer."""
    B, T = mask.shape
    dev = mask.device
    names = list(scores)
    E, K = len(names), len(AOPC_BINS)
    pinned = _pinned(model, ids)
    scorable = _scorable(mask, pinned)
    n = scorable.sum(1)  # (B,)
    bins = torch.tensor(AOPC_BINS, device=dev)
    counts = ((bins[None, :] * n[:, None] + 99) // 100).clamp_min(1)  # ceil(k n), at least one, exact integers
    counts = torch.minimum(counts, n[:, None])  # (B, K)
    # rank[e, b, t]: place of token t in explainer e's order (scorable tokens first, by decreasing score)
    rank = torch.stack([_ranks(_order(scores[name], mask, pinned)) for name in names])
    keep_only = mask & ~scorable  # <cls> and the pinned tokens: never removed
    copies = _MaskedCopies(model, ids)  # built once: the one-layer shortcut's projections serve every copy
    # p[e, b, j] = probability of the predicted class: j < K keeps the top counts[b, j] tokens only (sufficiency),
    # j = K + s - 1 removes the top s (the removal curve, s = 1..n); flipped[e, b, s - 1] = the removal of s flips.
    p = torch.full((E, B, K + T), math.nan, device=dev)
    flipped = torch.zeros(E, B, T, dtype=torch.bool, device=dev)

    def run(e: Tensor, b: Tensor, j: Tensor) -> None:
        """Evaluate the copies (e, b, j), each distinct (example, kept tokens) once."""
        if len(e) == 0:
            return
        top = rank[e, b] < torch.where(j < K, counts[b, j.clamp(max=K - 1)], j - K + 1)[:, None]  # (S, T)
        keep = torch.where((j < K)[:, None], keep_only[b] | (top & scorable[b]), mask[b] & ~(top & scorable[b]))
        rows, which = torch.unique(torch.cat([b[:, None], keep.long()], 1), dim=0, return_inverse=True)
        probs = copies(rows[:, 0], rows[:, 1:].bool())[which]  # (S, C)
        p[e, b, j] = probs.gather(1, pred[b, None]).squeeze(1)
        removal = j >= K
        flipped[e[removal], b[removal], j[removal] - K] = probs[removal].argmax(-1) != pred[b[removal]]

    # Sufficiency, and comprehensiveness's removals (the curve at s = counts): one batch for every explainer.
    e, b, k = torch.meshgrid(torch.arange(E, device=dev), torch.nonzero(n > 0).flatten(), torch.arange(K, device=dev),
                             indexing="ij")
    e, b, k = e.flatten(), b.flatten(), k.flatten()
    run(torch.cat([e, e]), torch.cat([b, b]), torch.cat([k, K + counts[b, k] - 1]))  # repeats run once (unique)
    # The removal curve up to its first flip, window after window.
    done = torch.zeros(E, B, dtype=torch.long, device=dev)  # every s <= done has been evaluated
    steps = torch.arange(1, T + 1, device=dev)
    while True:
        seen = flipped & (steps <= done[..., None])
        active = (done < n) & ~seen.any(-1)  # (E, B): not flipped yet, and removals left
        if not active.any():
            break
        ea, ba = active.nonzero(as_tuple=True)
        lo = done[ea, ba]
        hi = torch.minimum(n[ba], lo + torch.clamp(lo // _WINDOW_SHARE, min=_FIRST_WINDOW))
        width = int((hi - lo).max())
        s = lo[:, None] + torch.arange(1, width + 1, device=dev)  # (A, width)
        todo = (s <= hi[:, None]) & p[ea[:, None], ba[:, None], K + s.clamp(max=T) - 1].isnan()
        row, col = todo.nonzero(as_tuple=True)
        run(ea[row], ba[row], K + s[row, col] - 1)
        done[ea, ba] = hi

    has = n > 0
    nan = torch.full((B,), math.nan, device=dev)
    out: dict[str, Tensor] = {}
    for e, name in enumerate(names):
        removed = p[e, :, K:].gather(1, (counts - 1).clamp_min(0))  # (B, K): without the top counts tokens
        out[f"{name}/comprehensiveness"] = torch.where(has, (prob[:, None] - removed).mean(1), nan)
        out[f"{name}/sufficiency"] = torch.where(has, (prob[:, None] - p[e, :, :K]).mean(1), nan)
        f = flipped[e] & (steps <= n[:, None])
        first = torch.where(f.any(1), f.float().argmax(1) + 1, n).float()
        out[f"{name}/flip_frac"] = torch.where(has, first / n.clamp_min(1), nan)
    return out

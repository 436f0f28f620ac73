"""ERASER comprehensiveness and sufficiency (AOPC) and the decision-flip fraction of every explainer at once.

What each metric reads of an explainer's order (docs/faithfulness.md): sufficiency the copies that keep only the
top ``counts`` tokens (AOPC_BINS percent of the scorable ones), comprehensiveness the copies without them, and the
flip fraction the first s at which removing the top s tokens changes the prediction. So the removal curve is needed
only up to its first flip: it is scanned from s = 1 in growing windows and left as soon as it has flipped (an
example that never flips still costs all n copies). Each window is one batch over every explainer's copies, and a
copy that several explainers share (the same example and the same kept tokens, common among the first few
removals) runs once. The numbers are those of running every copy.

At the lengths of real texts (512 word pieces) a curve that never flips costs n copies of up to n tokens, for each
explainer and random draw: ``flip_resolution`` then scans a grid of evenly spaced removals and, once a grid point
has flipped, narrows the gap since the last unflipped one on finer grids down to one removal. Comprehensiveness and
sufficiency are unchanged; the flip fraction is the exact one unless an earlier flip reverted within one step of a
grid (docs/faithfulness.md says how often).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._common import _order, _pinned, _ranks, _scorable
from .readout import _MaskedCopies

AOPC_BINS = (1, 5, 10, 20, 50)  # percent of the real tokens (ERASER, DeYoung et al. 2020)
_FIRST_WINDOW = 4  # removals scanned in the first window, and at least in each next one
_WINDOW_SHARE = 4  # each next window: a quarter of the scanned prefix (scanning past the flip costs at most that)
_REFINE = 4  # flip_resolution: each refinement divides the gap around the first flip into this many steps


def _erasure_metrics(model, ids: Tensor, mask: Tensor, scores: dict[str, Tensor], pred: Tensor, prob: Tensor,
                     say: Callable[[str], object] | None = None, flip_resolution: int | None = None
                     ) -> dict[str, Tensor]:
    """comprehensiveness, sufficiency (AOPC over AOPC_BINS) and flip_frac per example, for each explainer.
    ``say``: told after each window of the removal curves how far the scan is (None: silently).
    ``flip_resolution`` (None: every removal): scan the removal curve at most that many evenly spaced points per
    example (every ceil(n / flip_resolution)-th removal, and the last), then narrow the gap between the last
    unflipped point and the first flipped one on grids a quarter as wide, down to one removal; exact for
    n <= flip_resolution."""
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
    # The removal curve up to its first flip, window after window: every s, or with ``flip_resolution`` every
    # stride-th s (the stride makes at most flip_resolution points of an example's n removals).
    stride = torch.ones_like(n) if not flip_resolution else ((n + flip_resolution - 1) // flip_resolution).clamp_min(1)
    done = torch.zeros(E, B, dtype=torch.long, device=dev)  # every grid point s <= done has been evaluated
    copies_run = 0
    steps = torch.arange(1, T + 1, device=dev)
    while True:
        seen = flipped & (steps <= done[..., None])
        active = (done < n) & ~seen.any(-1)  # (E, B): not flipped yet, and removals left
        if not active.any():
            break
        ea, ba = active.nonzero(as_tuple=True)
        lo, g = done[ea, ba], stride[ba]
        points = torch.clamp(lo // g // _WINDOW_SHARE, min=_FIRST_WINDOW)  # grid points in this window
        hi = torch.minimum(n[ba], lo + points * g)
        width = int(points.max())
        s = torch.minimum(lo[:, None] + g[:, None] * torch.arange(1, width + 1, device=dev), hi[:, None])  # (A, width)
        todo = (s > lo[:, None]) & p[ea[:, None], ba[:, None], K + s - 1].isnan()
        todo &= torch.cat([torch.ones_like(todo[:, :1]), s[:, 1:] != s[:, :-1]], 1)  # the clamped end once
        row, col = todo.nonzero(as_tuple=True)
        run(ea[row], ba[row], K + s[row, col] - 1)
        done[ea, ba] = hi
        copies_run += len(row)
        if say is not None:
            say(f"erasure: {len(ea)} of {E * B} removal curves still unflipped, scanned to s <= {int(hi.max())} of "
                f"{int(n.max())} tokens ({copies_run} removal copies so far)")
    if flip_resolution:
        # The first flip is then between the grid point before the first flipped one (lo, unflipped) and it (hi):
        # the gap is searched on a grid a quarter as wide, and so on down to single removals. The flip found is the
        # exact first flip unless an earlier flip reverted within one step of a grid.
        f = flipped & (steps <= n[:, None])
        ef, bf = f.any(-1).nonzero(as_tuple=True)
        hi = f[ef, bf].float().argmax(-1) + 1  # (F,) the first flipped point evaluated
        lo = (hi - 1) // stride[bf] * stride[bf]  # the grid point before it (n itself may be off the grid)
        refined = 0
        while len(hi) and bool((hi - lo > 1).any()):
            sub = (hi - lo + _REFINE - 1) // _REFINE  # (F,) the finer grid's step
            s = lo[:, None] + sub[:, None] * torch.arange(1, _REFINE, device=dev)  # (F, _REFINE - 1)
            todo = (s < hi[:, None]) & p[ef[:, None], bf[:, None], K + s.clamp(max=T) - 1].isnan()
            row, col = todo.nonzero(as_tuple=True)
            run(ef[row], bf[row], K + s[row, col] - 1)
            refined += len(row)
            window = flipped[ef, bf] & (steps > lo[:, None]) & (steps <= hi[:, None])  # hi itself has flipped
            hi = window.float().argmax(-1) + 1
            lo = lo + sub * ((hi - lo - 1) // sub)  # the finer grid's point before the new hi: evaluated, unflipped
        if say is not None and refined:
            say(f"erasure: {refined} copies narrowing each flip down to one removal")

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

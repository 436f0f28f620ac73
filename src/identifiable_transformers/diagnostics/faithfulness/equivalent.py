"""Output-equivalent explanations: how far each head's ``<cls>`` row can move at a fixed output, and the
faithfulness of the extreme ones (docs/identifiability.md 2.8, docs/faithfulness.md "Equivalent explanations").

For every probe example and every head of the last layer (the layer the attention explainers read), the
``<cls>`` row a (n real tokens) and the head's T give the class P(a) = {a' >= 0, sum a' = 1, a' T = a T}
(maths/equivalence.py). Over P(a) the LPs give the least and greatest value of each objective:

  top        the weight of the row's own top token (the scorable token it weighs most);
  mean_top   the weight of the head-mean explanation's top token (the same token in every head);
  loo        the agreement sum_j a'_j loo_j with the leave-one-out scores (the reference every run has:
             p_y(x) - p_y(x without j), the faithfulness callback's ``loo`` explainer);
  rationale  the rationale tokens' total weight (only with ``rationale_mask``; NaN for an example without one).

The head-mean explanation (the ``attention`` explainer: the mean over heads of the ``<cls>`` rows) with each
head's row chosen in its own class ranges over the mean of the per-head ranges: the classes constrain
different heads' rows separately (the set is their product), so the extremes of a sum of per-head terms are
the sums of the per-head extremes (tested against a joint LP and vertex pairs in tests/diagnostics).

The best and the worst equivalent explanation: each head's row at the LP optimum that maximises (best) or
minimises (worst) the *guide* objective (the rationale weight when the data has rationales, else the loo
agreement), averaged over heads. Their comprehensiveness, sufficiency and (with rationales) rationale AUPRC are
scored like any explainer's; the model's output is the same for both, so the gap is how much the metric
depends on which of the output-equivalent explanations one reads.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..maths.equivalence import equivalence_ranges
from ._common import _eval_with_grad, _finish, _inputs, _logits
from .erasure import _erasure_metrics
from .explainers import explain
from .plausibility import plausibility_metrics

OBJECTIVES = ("top", "mean_top", "loo", "rationale")
EXTREMES = ("best", "worst")


def equivalent_explanations(model, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                            rationale_mask: Tensor | None = None, loo: Tensor | None = None,
                            token_ranges: bool = False, flip_resolution: int | None = None) -> dict:
    """Equivalence-class ranges of the last layer's ``<cls>`` rows and the best and worst equivalent explanation.

    ``loo`` (B, T): leave-one-out scores already computed (else computed here); ``flip_resolution``: the extremes'
    removal curves on that grid (erasure.py; None: every removal). Returns a dict:
      objectives          the objective names, in the order of the last axis below;
      low, high, value    (B, H, k) float64: each objective's least, greatest and actual value;
      free_dim            (B, H) the class's dimension n - rank([T, 1]) (0: identifiable row);
      layer, lengths      the last layer's index; (B,) real lengths;
      top_index           (B, H) each row's top token (the ``top`` objective's);
      guide               the objective that chooses the best and the worst explanation;
      scores              {"best"/"worst": (B, T)} the head-mean extreme explanations (0 at <cls>, padding);
      per_example         {"best/<metric>": (B,), ...} their erasure and (with rationales) plausibility metrics;
      token_low/high      with ``token_ranges``: (B, H, T) every token's weight range (NaN at padding; 2 n
                          more LPs per row).
    """
    if getattr(model, "pooling", "cls") != "cls":
        raise ValueError("equivalent explanations need pooling=cls (the explanation is the <cls> row); "
                         f"got pooling={model.pooling!r}")
    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        with torch.no_grad():
            internals = model.attention_internals(ids, mask)
            prob, pred = _logits(model, ids, mask).float().softmax(-1).max(-1)
        if loo is None:
            loo = explain(model, ids, mask, ["loo"])["loo"]
        last = internals[-1]
        rows = last.attention[:, :, 0, :].detach().double().cpu()  # (B, H, T): the <cls> rows
        Tv = torch.einsum("bhtv,hvd->bhtd", last.values.detach().double(), last.out_proj.detach().double()).cpu()
        rationale = None if rationale_mask is None else rationale_mask.bool().cpu() & mask.cpu()
        rep = _ranges(rows, Tv, mask.sum(1).cpu(), loo.detach().double().cpu(), rationale, token_ranges)
        extremes = {e: _finish(rep.pop(e).mean(1).to(mask.device), mask) for e in EXTREMES}  # head-means
        per_example = _erasure_metrics(model, ids, mask, extremes, pred, prob, flip_resolution=flip_resolution)
        if rationale_mask is not None:
            per_example.update(plausibility_metrics(extremes, mask, rationale_mask.to(mask.device)))
        rep.update(layer=len(internals) - 1, scores={e: s.cpu() for e, s in extremes.items()},
                   per_example={k: v.cpu() for k, v in per_example.items()})
        return rep


def _ranges(rows: Tensor, Tv: Tensor, lengths: Tensor, loo: Tensor, rationale: Tensor | None,
            token_ranges: bool) -> dict:
    """The LPs on each example's real tokens only (padding is never in a class), one call per length."""
    B, H, T = rows.shape
    names = [o for o in OBJECTIVES if o != "rationale" or rationale is not None]
    guide = names.index("rationale" if rationale is not None else "loo")
    k = len(names)
    nan = lambda *shape: torch.full(shape, math.nan, dtype=torch.float64)  # noqa: E731
    out = {"objectives": names, "guide": names[guide], "low": nan(B, H, k), "high": nan(B, H, k),
           "value": nan(B, H, k), "free_dim": torch.zeros(B, H, dtype=torch.long), "lengths": lengths,
           "top_index": torch.zeros(B, H, dtype=torch.long),
           "best": torch.zeros(B, H, T, dtype=torch.float64), "worst": torch.zeros(B, H, T, dtype=torch.float64)}
    if token_ranges:
        out["token_low"], out["token_high"] = nan(B, H, T), nan(B, H, T)
    objectives = {}  # b -> (a (H, n), W (H, k[+n], n))
    for b in range(B):
        n = int(lengths[b])
        a = rows[b, :, :n]
        a = a / a.sum(-1, keepdim=True)  # float32 softmax rows sum to 1 within ~1e-7: exact in float64
        eye = torch.eye(n, dtype=torch.float64)
        scorable = slice(1, n) if n > 1 else slice(0, 1)  # <cls> is never an explanation's top token
        top = a[:, scorable].argmax(-1) + scorable.start  # (H,)
        mean_top = int(a.mean(0)[scorable].argmax()) + scorable.start
        out["top_index"][b] = top
        W = {"top": eye[top], "mean_top": eye[mean_top].expand(H, n), "loo": loo[b, :n].expand(H, n)}
        if rationale is not None:
            W["rationale"] = rationale[b, :n].double().expand(H, n)
        W = torch.stack([W[o] for o in names], 1)  # (H, k, n)
        objectives[b] = a, torch.cat([W, eye.expand(H, n, n)], 1) if token_ranges else W
    for n in lengths.unique().tolist():  # one call (one block-diagonal LP) per length: T is never padded
        idx = (lengths == n).nonzero().flatten().tolist()
        a = torch.cat([objectives[b][0] for b in idx])  # (len(idx) H, n)
        W = torch.cat([objectives[b][1] for b in idx])
        res = equivalence_ranges(Tv[idx, :, :n].reshape(-1, n, Tv.shape[-1]), a, W, vertices=True)
        value = torch.einsum("rkn,rn->rk", W[:, :k], a)
        out["low"][idx], out["high"][idx] = _unstack(H, res["low"][:, :k]), _unstack(H, res["high"][:, :k])
        out["value"][idx], out["free_dim"][idx] = _unstack(H, value), _unstack(H, res["free_dim"])
        out["best"][idx, :, :n] = _unstack(H, res["argmax"][:, guide])
        out["worst"][idx, :, :n] = _unstack(H, res["argmin"][:, guide])
        if token_ranges:
            out["token_low"][idx, :, :n] = _unstack(H, res["low"][:, k:])
            out["token_high"][idx, :, :n] = _unstack(H, res["high"][:, k:])
    if rationale is not None:
        j = names.index("rationale")  # no rationale in an example: its weight is no measurement
        none = ~rationale[:, 1:].any(1)
        out["low"][none, :, j] = out["high"][none, :, j] = out["value"][none, :, j] = math.nan
    return out


def _unstack(H: int, t: Tensor) -> Tensor:
    """(m H, ...) rows of m examples' heads -> (m, H, ...)."""
    return t.reshape(-1, H, *t.shape[1:])

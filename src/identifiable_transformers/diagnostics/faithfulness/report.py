"""faithfulness_report: every explainer's scores and metrics on one batch."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ._common import _eval_with_grad, _finish, _inputs, _logits, _nanmean, _scorable
from .agreement import kendall_tau_b
from .erasure import _erasure_metrics
from .explainers import CHEAP_EXPLAINERS, explain
from .uniform import uniform_attention_logits

METRICS = ("comprehensiveness", "sufficiency", "tau_loo", "flip_frac")


def faithfulness_report(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
    explainers: Sequence[str] = CHEAP_EXPLAINERS, seed: int = 0, *, ig_steps: int = 32,
    precomputed: dict[str, Tensor] | None = None,
) -> dict:
    """Scores of ``explainers`` and their faithfulness metrics (docs/faithfulness.md) on one batch.

    Returns {"scores": {name: (B, T)}, "metrics": {"name/metric": mean over examples (NaN-skipping)},
    "per_example": {"name/metric": (B,)}, "uniform_acc_gap": float or None (needs labels),
    "predicted": (B,), "prob": (B,) probability of the predicted class}. Metrics are
    ``METRICS``; tau_loo needs the loo scores, which are computed even when "loo" is not listed.
    ``precomputed`` {name: (B, T)} supplies scores already computed (e.g. integrated gradients).
    """
    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        with torch.no_grad():
            logits = _logits(model, ids, mask)
        prob, pred = logits.float().softmax(-1).max(-1)
        scores = {k: _finish(v.to(mask.device), mask) for k, v in (precomputed or {}).items()}
        wanted = [e for e in dict.fromkeys([*explainers, "loo"]) if e not in scores]
        scores.update(explain(model, ids, mask, wanted, seed=seed, ig_steps=ig_steps))
        per_example = _erasure_metrics(model, ids, mask, {e: scores[e] for e in explainers}, pred, prob)
        scorable = _scorable(mask)
        for e in explainers:
            per_example[f"{e}/tau_loo"] = kendall_tau_b(scores[e], scores["loo"], scorable).float()
        per_example = {f"{e}/{m}": per_example[f"{e}/{m}"] for e in explainers for m in METRICS}
        gap = None
        if labels is not None:
            labels = labels.to(pred.device)
            acc = (pred == labels).double().mean()
            uniform_pred = uniform_attention_logits(model, ids, mask).argmax(-1)
            gap = float(acc - (uniform_pred == labels).double().mean())
        return {
            "scores": {e: scores[e] for e in explainers},
            "metrics": {k: _nanmean(v) for k, v in per_example.items()},
            "per_example": per_example,
            "uniform_acc_gap": gap,
            "predicted": pred,
            "prob": prob,
        }

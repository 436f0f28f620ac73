"""faithfulness_report: every explainer's scores and metrics on one batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ._common import _eval_with_grad, _finish, _inputs, _logits, _nanmean, _pinned, _scorable, _stage
from .agreement import kendall_taus
from .erasure import _erasure_metrics
from .explainers import CHEAP_EXPLAINERS, explain
from .plausibility import PLAUSIBILITY_METRICS, plausibility_metrics
from .random_control import RANDOM_DRAWS
from .random_control import random_draws as _random_draws
from .uniform import uniform_attention_logits

METRICS = ("comprehensiveness", "sufficiency", "tau_loo", "flip_frac")


def faithfulness_report(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
    explainers: Sequence[str] = CHEAP_EXPLAINERS, seed: int = 0, *, ig_steps: int = 32,
    precomputed: dict[str, Tensor] | None = None, rationale_mask: Tensor | None = None,
    random_draws: int = RANDOM_DRAWS, say: Callable[[str], object] | None = None,
    flip_resolution: int | None = None, loo: bool = True,
) -> dict:
    """Scores of ``explainers`` and their faithfulness metrics (docs/faithfulness.md) on one batch.

    Returns {"scores": {name: (B, T)}, "loo": (B, T) the leave-one-out scores,
    "metrics": {"name/metric": mean over examples (NaN-skipping)},
    "per_example": {"name/metric": (B,)}, "uniform_acc_gap": float or None (needs labels),
    "predicted": (B,), "prob": (B,) probability of the predicted class}. Metrics are
    ``METRICS``, plus ``PLAUSIBILITY_METRICS`` when ``rationale_mask`` (B, T) bool is given; tau_loo needs
    the loo scores, which are computed even when "loo" is not listed.
    ``precomputed`` {name: (B, T)} supplies scores already computed (e.g. integrated gradients).
    The ``random`` control (unless precomputed) is scored on ``random_draws`` seeded draws: its metrics
    are their mean (per example, then over examples), "random/<metric>_std" the standard deviation of the
    draws' means, and its scores are draw 0. ``say`` (e.g. ``log.info``) is told each stage as it starts and
    its time as it ends (each explainer, erasure window by window); None: silently. ``flip_resolution``: scan
    the removal curves on that many points per example (erasure.py; None: every removal). ``loo`` False (the
    fast tier): no leave-one-out pass (n copies of up to n tokens), so every tau_loo is NaN and "loo" is None,
    unless "loo" is listed in ``explainers``.
    """
    if random_draws < 1:
        raise ValueError(f"random_draws must be >= 1, got {random_draws}")
    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        with torch.no_grad():
            logits = _logits(model, ids, mask)
        prob, pred = logits.float().softmax(-1).max(-1)
        pinned = _pinned(model, ids)
        scores = {k: _finish(v.to(mask.device), mask, pinned) for k, v in (precomputed or {}).items()}
        draws = random_draws if "random" in explainers and "random" not in scores else 1
        loo = loo or "loo" in explainers
        wanted = [e for e in dict.fromkeys([*explainers, *(["loo"] if loo else [])]) if e not in scores]
        scores.update(explain(model, ids, mask, wanted, seed=seed, ig_steps=ig_steps, say=say))
        # The further random draws are scored like explainers of their own, then averaged into "random".
        extra = {f"random#{d}": s for d, s in enumerate(_random_draws(ids, mask, seed, draws, pinned)) if d > 0}
        scored = {**{e: scores[e] for e in explainers}, **extra}
        with _stage("erasure", say, f"comprehensiveness, sufficiency and flip fraction of {len(scored)} orders"):
            per_example = _erasure_metrics(model, ids, mask, scored, pred, prob, say=say,
                                           flip_resolution=flip_resolution)
        scorable = _scorable(mask, pinned)
        taus = kendall_taus(torch.stack(list(scored.values())), scores["loo"], scorable).float() if loo else None
        for k, e in enumerate(scored):
            per_example[f"{e}/tau_loo"] = taus[k] if loo else torch.full_like(prob, float("nan"))
        metric_names = list(METRICS)
        if rationale_mask is not None:
            per_example.update(plausibility_metrics(scored, mask, rationale_mask, pinned))
            metric_names += PLAUSIBILITY_METRICS
        spread: dict[str, float] = {}
        if draws > 1:
            names = ["random", *extra]
            for m in metric_names:
                stack = torch.stack([per_example[f"{e}/{m}"].double() for e in names])  # (draws, B)
                per_example[f"random/{m}"] = torch.nanmean(stack, 0).float()
                spread[f"random/{m}_std"] = float(torch.tensor([_nanmean(r) for r in stack]).std())
        per_example = {f"{e}/{m}": per_example[f"{e}/{m}"] for e in explainers for m in metric_names}
        gap = None
        if labels is not None:
            labels = labels.to(pred.device)
            acc = (pred == labels).double().mean()
            uniform_pred = uniform_attention_logits(model, ids, mask).argmax(-1)
            gap = float(acc - (uniform_pred == labels).double().mean())
        return {
            "scores": {e: scores[e] for e in explainers},
            "loo": scores.get("loo"),  # computed for tau_loo even when not listed: the equivalence LPs read it too
            "metrics": {**{k: _nanmean(v) for k, v in per_example.items()}, **spread},
            "per_example": per_example,
            "uniform_acc_gap": gap,
            "predicted": pred,
            "prob": prob,
        }

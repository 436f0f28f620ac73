"""What the identifiability callback logs of a report: means over the probe set, overall, per layer and head, and per
cumulative length bin (``val/ident/...``), and the per-head rows of its W&B table."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from .probes import bin_key, bin_masks

# report key -> logged name
_LOGGED = {
    "null_dim": "null_dim",
    "stochastic_null_dim": "stochastic_null_dim",
    "alt_attention_tv": "alt_tv",
    "effective_gap": "effective_gap",
    "sigma_ratio": "sigma_ratio",
    "attention_entropy": "entropy",
    "eps_tv_1e-3": "eps_tv_1e-3",
    "eps_tv_1e-2": "eps_tv_1e-2",
    "eps_tv_bound_1e-3": "eps_tv_bound_1e-3",
    "eps_tv_bound_1e-2": "eps_tv_bound_1e-2",
}


def _overall(report: dict[str, Any], prefix: str, rows: torch.Tensor | None = None) -> dict[str, float]:
    """Means over the probe examples (all, or those where ``rows`` is True) of every head of every layer."""
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])
    nd, snd, jnd = pick(report["null_dim"]), pick(report["stochastic_null_dim"]), pick(report["joint_null_dim"])
    out = {f"{prefix}/{name}": float(pick(report[key]).double().mean()) for key, name in _LOGGED.items()}
    out[f"{prefix}/identifiable_frac"] = float((nd == 0).double().mean())
    out[f"{prefix}/stochastic_identifiable_frac"] = float((snd == 0).double().mean())
    out[f"{prefix}/joint_null_dim"] = float(jnd.double().mean())
    out[f"{prefix}/joint_identifiable_frac"] = float((jnd == 0).double().mean())
    out[f"{prefix}/witness_rel_error_max"] = float(pick(report["witness_rel_error"]).max())
    return out


def summarize_report(report: dict[str, Any], prefix: str = "val/ident", bins: Sequence[int] = ()) -> dict[str, float]:
    """Means over the probe set: overall, per layer (joint dims), per layer/head and, for each length bin B
    of ``bins`` that holds a probe, over the probes of at most B tokens (``<prefix>/len_le_B/<metric>``, with
    ``probe_count``)."""
    out = _overall(report, prefix)
    nd, snd = report["null_dim"], report["stochastic_null_dim"]
    _, L, H = nd.shape
    for l in range(L):
        if L > 1:  # per-layer means (a pretrained encoder has 6-24 layers)
            out[f"{prefix}/l{l}/joint_null_dim"] = float(report["joint_null_dim"][:, l].double().mean())
            out[f"{prefix}/l{l}/null_dim"] = float(nd[:, l].double().mean())
            out[f"{prefix}/l{l}/identifiable_frac"] = float((nd[:, l] == 0).double().mean())
        for h in range(H):
            p = f"{prefix}/l{l}_h{h}"
            for key, name in _LOGGED.items():
                out[f"{p}/{name}"] = float(report[key][:, l, h].double().mean())
            out[f"{p}/identifiable_frac"] = float((nd[:, l, h] == 0).double().mean())
            out[f"{p}/stochastic_identifiable_frac"] = float((snd[:, l, h] == 0).double().mean())
    for b, rows in bin_masks(report["lengths"], bins).items():
        out.update(_overall(report, f"{prefix}/{bin_key(b)}", rows))
        out[f"{prefix}/{bin_key(b)}/probe_count"] = float(rows.sum())
    return out


_PER_HEAD_KEY = re.compile(r"^val/ident/l\d+_h\d+/")
HEAD_COLUMNS = ["epoch", "layer", "head", *_LOGGED.values(), "identifiable_frac", "stochastic_identifiable_frac"]


def head_rows(report: dict[str, Any], epoch: int) -> list[list]:
    """One row per layer and head (``HEAD_COLUMNS``): means over the probe set."""
    nd, snd = report["null_dim"], report["stochastic_null_dim"]
    _, L, H = nd.shape
    return [[epoch, l, h, *(float(report[k][:, l, h].double().mean()) for k in _LOGGED),
             float((nd[:, l, h] == 0).double().mean()), float((snd[:, l, h] == 0).double().mean())]
            for l in range(L) for h in range(H)]

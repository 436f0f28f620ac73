"""Token-importance explainers (docs/faithfulness.md, Explainers): {name: (B, T) scores}, 0 at <cls> and padding."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..maths.nullspace import effective_attention
from ._common import _eval_with_grad, _finish, _inputs, _logits, _pinned, _pooled_rows, _scorable, _stage, by_width
from .context_mixing import context_mixing_name, context_mixing_scores
from .random_control import random_scores
from .readout import _masked_probs

EXPLAINERS = ("attention", "effective", "norm", "rollout", "value_zeroing", "alti", "norm_resln", "grad_input",
              "integrated_gradients", "loo", "random")
CHEAP_EXPLAINERS = tuple(e for e in EXPLAINERS if e != "integrated_gradients")


def unknown_explainers(names: Sequence[str]) -> list[str]:
    """The names that are neither in ``EXPLAINERS`` nor a context-mixing map of one layer (``alti_layer0``)."""
    return [e for e in names if e not in EXPLAINERS and context_mixing_name(e) is None]
_ATTENTION_EXPLAINERS = ("attention", "effective", "norm", "rollout")


def _attention_explainers(model, input_ids: Tensor, mask: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
    """attention / effective / norm / rollout from one ``attention_internals`` pass."""
    with torch.no_grad():
        internals = model.attention_internals(input_ids, mask)
    last = internals[-1]
    A = last.attention.float()  # (B, H, T, T)
    out: dict[str, Tensor] = {}
    pooled = _pooled_rows(model, A, mask)  # (B, H, T)
    if "attention" in names:
        out["attention"] = pooled.mean(1)
    if "norm" in names:
        # Kobayashi et al. (2020): sum_h || alpha^h_j f^h(x_j) || = sum_h alpha^h_j || f^h(x_j) || (alpha >= 0),
        # f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h.
        f = torch.einsum("bhtv,hvd->bhtd", last.values.float(), last.out_proj.float())  # (B, H, T, d)
        out["norm"] = (pooled * f.norm(dim=-1)).sum(1)
    if "rollout" in names:
        # Abnar & Zuidema (2020): A_hat = 0.5 I + 0.5 mean_h A (rows renormalised), R = A_hat_L ... A_hat_1.
        eye = torch.eye(A.shape[-1], device=A.device)
        R = None
        for layer in internals:
            a = layer.attention.float().mean(1)
            a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
            a = 0.5 * eye + 0.5 * a
            R = a if R is None else a @ R
        out["rollout"] = _pooled_rows(model, R.unsqueeze(1), mask).squeeze(1)
    if "effective" in names:
        out["effective"] = _effective(model, last, mask)
    return out


def _effective(model, last, mask: Tensor) -> Tensor:
    """Pooled row of Brunner's effective attention of the last layer, on real tokens only, mean over heads."""
    B, T = mask.shape
    lengths = mask.sum(1)
    pos = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices  # real positions first, in order
    # T in float64 from float64 factors, as identifiability does: a float32 product has rank noise.
    T_all = torch.einsum("bhtv,hvd->bhtd", last.values.double(), last.out_proj.double())  # (B, H, T, d)
    scores = torch.zeros(B, T, dtype=torch.float64, device=mask.device)
    A_all = last.attention  # cut to each length group, then float64: not the whole (B, H, T, T) in float64
    H = A_all.shape[1]
    for n in lengths.unique().tolist():
        idx = (lengths == n).nonzero().flatten()
        p = pos[idx, :n]  # (k, n)
        pa = p[:, None, :, None].expand(-1, H, -1, T)
        A = A_all[idx].gather(2, pa).gather(3, p[:, None, None, :].expand(-1, H, n, -1)).double()  # (k, H, n, n)
        Tm = T_all[idx].gather(2, p[:, None, :, None].expand(-1, H, -1, T_all.shape[-1]))  # (k, H, n, d)
        eff = effective_attention(A, Tm)  # (k, H, n, n) float64
        row = eff[:, :, 0, :] if model.pooling == "cls" else eff.mean(-2)  # real query 0 is <cls>
        scores[idx.unsqueeze(1), p] = row.mean(1)
    return scores.float()


def _grad_input(model, input_ids: Tensor, mask: Tensor, target: Tensor) -> Tensor:
    from captum.attr import LayerGradientXActivation

    attr = LayerGradientXActivation(lambda ids, m: _logits(model, ids, m), model.token_embedding)
    return attr.attribute(input_ids, target=target, additional_forward_args=(mask,)).sum(-1)


_IG_TOKENS = 2048  # tokens per forward and backward pass of integrated gradients' interpolation steps


def _ig_rows(shape: tuple[int, int], n_steps: int) -> int:
    """Rows (example x step) per pass: at least the batch, and several steps of a short batch at once (one row at a
    time, a 512-token text runs at a quarter of the batched speed), within ``_IG_TOKENS`` tokens."""
    B, T = shape
    return max(B, min(B * n_steps, _IG_TOKENS // max(T, 1)))


def integrated_gradients(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, *, n_steps: int = 32, target: Tensor | None = None,
    internal_batch_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Captum ``LayerIntegratedGradients`` on the token embeddings, baseline = all ``<pad>`` embeddings.

    Attributes the logit of ``target`` (default: the predicted class) with the same attention mask
    for every interpolation step. Returns (scores (B, T) float32, 0 at <cls> and padding; Captum's
    convergence delta (B,): sum of attributions minus (logit(x) - logit(baseline)), before zeroing <cls>).
    """
    from captum.attr import LayerIntegratedGradients

    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        if target is None:
            with torch.no_grad():
                target = _logits(model, ids, mask).argmax(-1)
        lig = LayerIntegratedGradients(lambda i, m: _logits(model, i, m), model.token_embedding)
        attr, delta = lig.attribute(
            ids, baselines=torch.full_like(ids, model.pad_id), target=target, additional_forward_args=(mask,),
            n_steps=n_steps, internal_batch_size=internal_batch_size or _ig_rows(ids.shape, n_steps),
            return_convergence_delta=True,
        )
        return _finish(attr.sum(-1), mask, _pinned(model, ids)), delta.detach().float()


def _loo(model, input_ids: Tensor, mask: Tensor, pred: Tensor, prob: Tensor) -> Tensor:
    """p_y(x) - p_y(x without token j), every scorable j of every example in a few batched passes."""
    B, T = mask.shape
    b, j = _scorable(mask, _pinned(model, input_ids)).nonzero(as_tuple=True)  # sorted by example
    masks = mask[b].clone()
    masks[torch.arange(len(b), device=mask.device), j] = False
    p = _masked_probs(model, input_ids, b, masks)
    scores = torch.zeros(B, T, device=mask.device)
    if len(b):
        scores[b, j] = prob[b] - p[torch.arange(len(b), device=mask.device), pred[b]]
    return scores


def explain(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, explainers: Sequence[str] = CHEAP_EXPLAINERS,
    seed: int = 0, *, ig_steps: int = 32, say: Callable[[str], object] | None = None,
) -> dict[str, Tensor]:
    """Token scores of each named explainer (``EXPLAINERS``; ``<map>_layer<k>`` scores one layer's context-mixing
    map instead of its rollout): {name: (B, T) float32}, 0 at <cls> and padding.

    Scores explain the class the model predicts on the full input. Runs in eval mode (the previous
    mode is restored); higher score = more important. ``say``: where each explainer's start and time are told
    (e.g. ``log.info``; None: silently).
    """
    unknown = unknown_explainers(explainers)
    if unknown:
        raise ValueError(f"unknown explainers {unknown}; use some of {list(EXPLAINERS)} (or value_zeroing_layer<k>, "
                         "alti_layer<k>, norm_resln_layer<k> for layer k's map)")
    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        with torch.no_grad():
            probs = _logits(model, ids, mask).float().softmax(-1)
        prob, pred = probs.max(-1)
        pinned = _pinned(model, ids)  # a pretrained model's special tokens: never scored (docs/pretrained.md)
        out: dict[str, Tensor] = {}
        B, T = ids.shape
        attention = [e for e in explainers if e in _ATTENTION_EXPLAINERS]
        if attention:
            with _stage("explainers: attention maps", say, ", ".join(attention)):
                out.update(by_width(lambda i, m: _attention_explainers(model, i, m, explainers), ids, mask))
        mixing = [e for e in explainers if context_mixing_name(e) is not None]
        if mixing:
            with _stage("explainers: context mixing", say, ", ".join(mixing)):
                out.update(by_width(lambda i, m: context_mixing_scores(model, i, m, mixing), ids, mask))
        if "grad_input" in explainers:
            with _stage("explainer: grad_input", say):
                out["grad_input"] = _grad_input(model, ids, mask, pred)
        if "integrated_gradients" in explainers:
            with _stage("explainer: integrated_gradients", say, f"{ig_steps} steps"):
                out["integrated_gradients"] = integrated_gradients(model, ids, mask, n_steps=ig_steps, target=pred)[0]
        if "loo" in explainers:
            with _stage("explainer: loo", say, f"{int(_scorable(mask, pinned).sum())} copies of {B} example(s), "
                        f"up to {T} tokens"):
                out["loo"] = _loo(model, ids, mask, pred, prob)
        if "random" in explainers:
            out["random"] = random_scores(ids, mask, seed, pinned=pinned)  # draw 0 of the example's own order
        return {e: _finish(out[e], mask, pinned) for e in explainers}

"""Is the attention an explanation? Token-importance explainers and faithfulness metrics (docs/faithfulness.md).

Everything works on one batch of a ``TransformerClassifier``: ``input_ids`` (B, T) with ``<cls>`` at
position 0 and ``attention_mask`` (B, T), True for real tokens. Position 0 is never scored or removed;
its score and every padding position's score is 0.

Removing a token means masking it out of the attention keys exactly like padding (its
``attention_mask`` entry set False): the model sees the shorter sequence, and the remaining tokens
keep their positions. No ``<unk>`` is substituted. Every erasure curve is batched: the masked copies
of all examples (all bins, all prefixes of an order) run as a few large forward passes.

Entry points:
    explain(model, input_ids, attention_mask, explainers, seed)            -> {name: (B, T) scores}
    faithfulness_report(model, input_ids, attention_mask, labels, ...)     -> scores, metrics, per example
    integrated_gradients(model, input_ids, attention_mask, n_steps)        -> (scores, convergence delta)
    adversarial_attention(model, input_ids, attention_mask, eps, ...)      -> (B, H) largest TV found
    uniform_attention_logits(model, input_ids, attention_mask)             -> logits under 1/n attention
    project_simplex(v, mask), kendall_tau_b(x, y, valid)                   -> the building blocks
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models import override_attention
from .identifiability import effective_attention

__all__ = [
    "AOPC_BINS",
    "CHEAP_EXPLAINERS",
    "EXPLAINERS",
    "METRICS",
    "adversarial_attention",
    "explain",
    "faithfulness_report",
    "integrated_gradients",
    "kendall_tau_b",
    "project_simplex",
    "uniform_attention_logits",
]

EXPLAINERS = ("attention", "effective", "norm", "rollout", "grad_input", "integrated_gradients", "loo", "random")
CHEAP_EXPLAINERS = tuple(e for e in EXPLAINERS if e != "integrated_gradients")
METRICS = ("comprehensiveness", "sufficiency", "tau_loo", "flip_frac")
AOPC_BINS = (1, 5, 10, 20, 50)  # percent of the real tokens (ERASER, DeYoung et al. 2020)
_ATTENTION_EXPLAINERS = ("attention", "effective", "norm", "rollout")
# Upper bound on tokens per forward pass of the erasure copies (keeps memory flat on long probes).
_CHUNK_TOKENS = 1 << 17


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------
@contextmanager
def _eval_with_grad(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout), autograd usable even inside Lightning's validation inference_mode."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        model.train(was_training)


def _inputs(model, input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Normal (non-inference) copies of the inputs, with the checks every entry point needs."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    mask = input_ids != model.pad_id if attention_mask is None else attention_mask.bool()
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} does not match input_ids {tuple(input_ids.shape)}")
    if not bool(mask[:, 0].all()):
        raise ValueError("position 0 (<cls>) must be a real token in every example: pad on the right")
    return input_ids.clone(), mask.clone()


def _scorable(mask: Tensor) -> Tensor:
    """Real tokens other than <cls>: the ones explainers score and erasure removes."""
    s = mask.clone()
    s[:, 0] = False
    return s


def _finish(scores: Tensor, mask: Tensor) -> Tensor:
    """float32 on the inputs' device, 0 at <cls> and at padding."""
    return torch.where(_scorable(mask), scores.detach().float(), torch.zeros((), device=scores.device))


def _pooled_rows(model, A: Tensor, mask: Tensor) -> Tensor:
    """The pooled query's row of attention maps A (B, ..., T, T) -> (B, ..., T).

    cls pooling reads query 0; mean pooling averages the rows of the real queries.
    """
    if model.pooling == "cls":
        return A[..., 0, :]
    m = mask.to(A.dtype).view(mask.shape[0], *([1] * (A.dim() - 3)), mask.shape[1], 1)
    return (A * m).sum(-2) / m.sum(-2).clamp_min(1.0)


def _logits(model, input_ids: Tensor, mask: Tensor) -> Tensor:
    return model(input_ids, mask).logits


class _ClsReadout:
    """Exact shortcut for one-layer models with cls pooling (the default model): the prediction reads only
    the ``<cls>`` output, which depends on the other tokens only through the ``<cls>`` query's attention row.

    Erasure never changes a remaining token's embedding (positions stay), so queries, keys and values
    are computed once per example; each masked copy then costs one softmax over its keys and one
    weighted sum, instead of a full forward over all positions. Position 0 then goes through the layer's
    own ``residual_blocks`` (tests compare it with running the shorter sequence).
    """

    def __init__(self, model, input_ids: Tensor):
        layer = model.layers[0]
        self.model, self.layer, self.attn = model, layer, layer.attn
        x, _ = model._embed(input_ids, None)  # (B, T, d); eval mode: no dropout
        q, k, v = self.attn._project(layer.attention_input(x))
        self.x0 = x[:, :1]  # (B, 1, d)
        self.scores = (q[:, :, :1] @ k.transpose(-2, -1)).squeeze(2) / math.sqrt(self.attn.key_dim)  # (B, H, T)
        self.v = v  # (B, H, T, dv)

    @staticmethod
    def applies(model) -> bool:
        return model.num_layers == 1 and model.pooling == "cls"

    def weights(self, example: Tensor, masks: Tensor) -> Tensor:
        """The <cls> query's attention row of each masked copy: (S,) and (S, T) -> (S, H, T)."""
        return self.scores[example].masked_fill(~masks[:, None, :], -math.inf).softmax(-1)

    def logits(self, example: Tensor, weights: Tensor) -> Tensor:
        """Logits when the <cls> query of copy s (of example ``example[s]``) attends with ``weights[s]`` (S, H, T)."""
        heads = weights.new_empty(*weights.shape[:2], self.v.shape[-1])  # (S, H, dv)
        for b in example.unique().tolist():  # one batched matmul per example: no (S, H, T, dv) gather
            rows = (example == b).nonzero().flatten()
            heads[rows] = torch.einsum("sht,htv->shv", weights[rows], self.v[b])
        return self._finish(example, heads)

    def _finish(self, example: Tensor, heads: Tensor) -> Tensor:
        attn = self.attn
        a = attn.out_proj(attn._combine(heads.unsqueeze(2)))  # (S, 1, d)
        x = self.layer.residual_blocks(self.x0[example], a)
        return self.model.head(self.model.final_norm(x)[:, 0])


def _masked_probs(model, input_ids: Tensor, example: Tensor, masks: Tensor) -> Tensor:
    """Class probabilities of example ``example[s]`` seen through ``masks[s]``: (S,) and (S, T) -> (S, C).

    One-layer cls-pooling models use the exact ``_ClsReadout`` shortcut. Otherwise rows run through the
    model in order, in chunks, each cut to its last real position, so examples sorted by length waste
    little on padding.
    """
    out = []
    T = input_ids.shape[1]
    with torch.no_grad():
        if _ClsReadout.applies(model):
            readout = _ClsReadout(model, input_ids)
            out.append(readout.logits(example, readout.weights(example, masks)).float().softmax(-1))
        else:
            step = max(1, _CHUNK_TOKENS // max(T, 1))
            for i in range(0, masks.shape[0], step):
                m = masks[i : i + step]
                t = int(m.any(0).nonzero().max()) + 1
                out.append(model(input_ids[example[i : i + step], :t], m[:, :t]).logits.float().softmax(-1))
    return torch.cat(out) if out else masks.new_zeros(0, 0, dtype=torch.float32)


def _order(scores: Tensor, mask: Tensor) -> Tensor:
    """Positions by decreasing score (ties: lower position first); non-scorable positions last."""
    s = torch.where(_scorable(mask), scores.double(), torch.full_like(scores, -math.inf, dtype=torch.float64))
    return torch.sort(s, dim=1, descending=True, stable=True).indices


def _top_masks(order: Tensor, counts: Tensor, T: int) -> Tensor:
    """(B, T) order, (B, K) counts -> (B, K, T) bool: True at the first ``counts`` positions of the order."""
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(T, device=order.device).expand_as(order))  # rank of each position
    return rank[:, None, :] < counts[:, :, None]


# ----------------------------------------------------------------------------------------------
# Explainers
# ----------------------------------------------------------------------------------------------
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
    A_all = last.attention.double()
    H = A_all.shape[1]
    for n in lengths.unique().tolist():
        idx = (lengths == n).nonzero().flatten()
        p = pos[idx, :n]  # (k, n)
        pa = p[:, None, :, None].expand(-1, H, -1, T)
        A = A_all[idx].gather(2, pa).gather(3, p[:, None, None, :].expand(-1, H, n, -1))  # (k, H, n, n)
        Tm = T_all[idx].gather(2, p[:, None, :, None].expand(-1, H, -1, T_all.shape[-1]))  # (k, H, n, d)
        eff = effective_attention(A, Tm)  # (k, H, n, n) float64
        row = eff[:, :, 0, :] if model.pooling == "cls" else eff.mean(-2)  # real query 0 is <cls>
        scores[idx.unsqueeze(1), p] = row.mean(1)
    return scores.float()


def _grad_input(model, input_ids: Tensor, mask: Tensor, target: Tensor) -> Tensor:
    from captum.attr import LayerGradientXActivation

    attr = LayerGradientXActivation(lambda ids, m: _logits(model, ids, m), model.token_embedding)
    return attr.attribute(input_ids, target=target, additional_forward_args=(mask,)).sum(-1)


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
            n_steps=n_steps, internal_batch_size=internal_batch_size or ids.shape[0], return_convergence_delta=True,
        )
        return _finish(attr.sum(-1), mask), delta.detach().float()


def _loo(model, input_ids: Tensor, mask: Tensor, pred: Tensor, prob: Tensor) -> Tensor:
    """p_y(x) - p_y(x without token j), every scorable j of every example in a few batched passes."""
    B, T = mask.shape
    b, j = _scorable(mask).nonzero(as_tuple=True)  # sorted by example
    masks = mask[b].clone()
    masks[torch.arange(len(b), device=mask.device), j] = False
    p = _masked_probs(model, input_ids, b, masks)
    scores = torch.zeros(B, T, device=mask.device)
    if len(b):
        scores[b, j] = prob[b] - p[torch.arange(len(b), device=mask.device), pred[b]]
    return scores


def explain(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, explainers: Sequence[str] = CHEAP_EXPLAINERS,
    seed: int = 0, *, ig_steps: int = 32,
) -> dict[str, Tensor]:
    """Token scores of each named explainer (``EXPLAINERS``): {name: (B, T) float32}, 0 at <cls> and padding.

    Scores explain the class the model predicts on the full input. Runs in eval mode (the previous
    mode is restored); higher score = more important.
    """
    unknown = [e for e in explainers if e not in EXPLAINERS]
    if unknown:
        raise ValueError(f"unknown explainers {unknown}; use some of {list(EXPLAINERS)}")
    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        with torch.no_grad():
            probs = _logits(model, ids, mask).float().softmax(-1)
        prob, pred = probs.max(-1)
        out: dict[str, Tensor] = {}
        if any(e in _ATTENTION_EXPLAINERS for e in explainers):
            out.update(_attention_explainers(model, ids, mask, explainers))
        if "grad_input" in explainers:
            out["grad_input"] = _grad_input(model, ids, mask, pred)
        if "integrated_gradients" in explainers:
            out["integrated_gradients"] = integrated_gradients(model, ids, mask, n_steps=ig_steps, target=pred)[0]
        if "loo" in explainers:
            out["loo"] = _loo(model, ids, mask, pred, prob)
        if "random" in explainers:
            g = torch.Generator().manual_seed(seed)
            out["random"] = torch.rand(mask.shape, generator=g).to(mask.device)
        return {e: _finish(out[e], mask) for e in explainers}


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------
def kendall_tau_b(x: Tensor, y: Tensor, valid: Tensor) -> Tensor:
    """Kendall tau-b between x and y (B, T) over the positions where ``valid``, per row -> (B,) float64.

    tau_b = (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)); NaN for rows with fewer
    than 2 valid positions or where x or y is constant.
    """
    x, y = x.double(), y.double()
    dx = torch.sign(x[:, :, None] - x[:, None, :])
    dy = torch.sign(y[:, :, None] - y[:, None, :])
    pair = valid[:, :, None] & valid[:, None, :]
    pair = torch.triu(pair, diagonal=1)
    num = (dx * dy * pair).sum((1, 2))
    den = torch.sqrt((dx.abs() * pair).sum((1, 2)) * (dy.abs() * pair).sum((1, 2)))
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, math.nan))


def _nanmean(x: Tensor) -> float:
    x = x.double()
    ok = ~torch.isnan(x)
    return float(x[ok].mean()) if ok.any() else math.nan


def _erasure_metrics(model, ids: Tensor, mask: Tensor, scores: dict[str, Tensor], pred: Tensor, prob: Tensor
                     ) -> dict[str, Tensor]:
    """comprehensiveness, sufficiency (AOPC over AOPC_BINS) and flip_frac per example, all explainers batched."""
    B, T = mask.shape
    dev = mask.device
    scorable = _scorable(mask)
    n = scorable.sum(1)  # (B,)
    bins = torch.tensor(AOPC_BINS, device=dev)
    counts = ((bins[None, :] * n[:, None] + 99) // 100).clamp_min(1)  # ceil(k n), at least one, exact integers
    counts = torch.minimum(counts, n[:, None])
    steps = torch.arange(1, T, device=dev).expand(B, -1)  # flip: remove the top s tokens, s = 1..n
    step_ok = steps <= n[:, None]
    cls_only = torch.zeros_like(mask)
    cls_only[:, 0] = True

    rows_example, rows_mask, layout = [], [], []
    K = len(AOPC_BINS)
    for name, s in scores.items():
        order = _order(s, mask)
        top = _top_masks(order, counts, T) & scorable[:, None, :]  # (B, K, T)
        comp = mask[:, None, :] & ~top  # remove the top tokens
        suff = cls_only[:, None, :] | top  # keep only them (and <cls>)
        prefix = _top_masks(order, steps, T) & scorable[:, None, :]  # (B, T-1, T)
        flip = mask[:, None, :] & ~prefix
        both = torch.cat([comp, suff, flip], dim=1)  # (B, 2K + T - 1, T)
        keep = torch.cat([torch.ones(B, 2 * K, dtype=torch.bool, device=dev), step_ok], dim=1)
        b, s_idx = keep.nonzero(as_tuple=True)
        rows_example.append(b)
        rows_mask.append(both[b, s_idx])
        layout.append((name, b, s_idx))
    if not rows_example:
        return {}
    probs = _masked_probs(model, ids, torch.cat(rows_example), torch.cat(rows_mask))
    out: dict[str, Tensor] = {}
    start = 0
    for name, b, s_idx in layout:
        p = probs[start : start + len(b)]
        start += len(b)
        grid = torch.full((B, 2 * K + T - 1, p.shape[-1]), math.nan, device=dev)
        grid[b, s_idx] = p
        p_pred = grid.gather(2, pred[:, None, None].expand(-1, grid.shape[1], 1)).squeeze(-1)  # (B, S)
        has = n > 0
        nan = torch.full((B,), math.nan, device=dev)
        out[f"{name}/comprehensiveness"] = torch.where(has, (prob[:, None] - p_pred[:, :K]).mean(1), nan)
        out[f"{name}/sufficiency"] = torch.where(has, (prob[:, None] - p_pred[:, K : 2 * K]).mean(1), nan)
        flipped = (grid[:, 2 * K :].argmax(-1) != pred[:, None]) & step_ok  # (B, T-1)
        first = torch.where(flipped.any(1), flipped.float().argmax(1) + 1, n).float()
        out[f"{name}/flip_frac"] = torch.where(has, first / n.clamp_min(1), nan)
    return out


def uniform_attention_logits(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Logits with every layer's attention replaced by 1/n over the real keys (values and output kept)."""

    def uniform(_layer: int, w: Tensor, key_mask: Tensor | None) -> Tensor:
        m = torch.ones_like(w[:, :1, :1, :]) if key_mask is None else key_mask[:, None, None, :].to(w.dtype)
        return (m / m.sum(-1, keepdim=True)).expand_as(w)

    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        with torch.no_grad(), override_attention(model, uniform):
            return _logits(model, ids, mask)


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


# ----------------------------------------------------------------------------------------------
# Adversarial attention at a fixed prediction (Jain & Wallace 2019)
# ----------------------------------------------------------------------------------------------
def project_simplex(v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Euclidean projection of each row of v (..., n) onto the probability simplex over ``mask``'s entries.

    Duchi et al. (2008): sort descending, rho = max{j : u_j - (sum_{i<=j} u_i - 1) / j > 0},
    theta = (sum_{i<=rho} u_i - 1) / rho, w = max(v - theta, 0). Entries outside ``mask`` get 0.
    """
    if mask is None:
        mask = torch.ones_like(v, dtype=torch.bool)
    mask = mask.expand_as(v)
    u, idx = torch.sort(torch.where(mask, v, torch.full_like(v, -math.inf)), dim=-1, descending=True)
    valid = mask.gather(-1, idx)
    u = torch.where(valid, u, torch.zeros_like(u))
    css = u.cumsum(-1)
    j = torch.arange(1, v.shape[-1] + 1, device=v.device, dtype=v.dtype)
    cond = valid & (u - (css - 1) / j > 0)
    rho = cond.to(v.dtype).cumsum(-1).argmax(-1, keepdim=True)  # last True (cond is a prefix)
    theta = (css.gather(-1, rho) - 1) / (rho + 1).to(v.dtype)
    return torch.where(mask, (v - theta).clamp_min(0), torch.zeros_like(v))


def _jsd(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence (nats) between rows of p and q."""
    m = 0.5 * (p + q)
    kl = lambda a, b: (a * (a.clamp_min(1e-30).log() - b.clamp_min(1e-30).log())).sum(-1)  # noqa: E731
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def adversarial_attention(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, *, eps: float = 0.01, steps: int = 300,
    restarts: int = 4, lr: float = 0.1, seed: int = 0, scan_steps: int = 8, return_details: bool = False,
):
    """Largest TV from the real attention found at a fixed prediction, per example and head: (B, H).

    For each head of the last layer separately, search the rows that reach the classifier -- the ``<cls>``
    query's row with cls pooling, every real query row with mean pooling (TV then averaged over those
    rows) -- on the simplex over the real keys for rows A' far from A in total variation while
    JSD(p', p) <= eps, p' the prediction with the head's rows set to A' (via ``override_attention``; JSD
    in nats). First a scan along the segments from A to every key's vertex (``scan_steps`` points each);
    then projected gradient ascent on TV(A', A) - (10/eps) relu(JSD - 0.9 eps) from ``restarts`` seeded
    starts (the scan's best point, a tenth of the way from A to the least attended key's vertex, then
    alternately a random key's vertex and a point halfway between A and a random point), ``steps`` steps,
    each clipped to ``lr`` per entry (decaying linearly to lr/10); last, a line search from A towards each
    final point. Only points with JSD <= eps count; A itself (TV 0) is feasible, so the result is in
    [0, 1] and a lower bound on the true maximum. ``return_details`` adds the best rows (B, H, T, T),
    their JSD and the searched query mask.
    """
    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        B, T = ids.shape
        dev = ids.device
        with torch.no_grad():
            out = model(ids, mask, output_attentions=True)
        p0 = out.logits.float().softmax(-1)
        A0 = out.attentions[-1].float()  # (B, H, T, T)
        H, L = A0.shape[1], len(out.attentions)
        qmask = torch.zeros_like(mask)  # queries whose rows reach the classifier
        if model.pooling == "cls":
            qmask[:, 0] = True
        else:
            qmask = mask.clone()
        readout = None
        if _ClsReadout.applies(model):  # the exact shortcut: only the <cls> row of the one layer matters
            with torch.no_grad():
                readout = _ClsReadout(model, ids)

        def run(x_in: Tensor, b: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
            """TV and JSD of copies of examples b with head h's searched rows set to x_in (S, T, T)."""
            q = qmask[b]
            if readout is not None:
                w = torch.where(F.one_hot(h, H).bool()[:, :, None], x_in[:, None, 0], readout.weights(b, mask[b]))
                logits = readout.logits(b, w).float()
            else:
                sel = F.one_hot(h, H).bool()[:, :, None, None] & q[:, None, :, None]  # (S, H, T, 1)

                def hook(layer: int, w: Tensor, _m) -> Tensor:
                    return torch.where(sel, x_in[:, None], w) if layer == L - 1 else w

                with override_attention(model, hook):
                    logits = model(ids[b], mask[b]).logits.float()
            jsd = _jsd(logits.softmax(-1), p0[b])
            tv = (0.5 * (x_in - A0[b, h]).abs().sum(-1) * q).sum(-1) / q.sum(1)
            return tv, jsd

        # 1. Scan the segments from A towards every real key's vertex (TV is convex: its maxima are vertices).
        pair_b = torch.arange(B, device=dev).repeat_interleave(H)  # (B H,)
        pair_h = torch.arange(H, device=dev).repeat(B)
        scan_best = torch.zeros(B * H, device=dev)
        scan_x = A0[pair_b, pair_h].clone()  # (B H, T, T)
        eye = torch.eye(T, device=dev)
        chunk = max(1, (1 << 24) // (T * T * T))  # pairs per pass: (chunk T, T, T) candidate maps
        with torch.no_grad():
            for c in range(0, B * H, chunk):
                pb, ph = pair_b[c : c + chunk], pair_h[c : c + chunk]
                P = len(pb)
                sb, sh = pb.repeat_interleave(T), ph.repeat_interleave(T)  # (P T,): pair, then key k
                k_real = mask[sb, torch.arange(T, device=dev).repeat(P)]
                vert = eye.repeat(P, 1)[:, None, :]  # (P T, 1, T): every searched row at vertex k
                a = A0[sb, sh]
                for t in torch.arange(1, scan_steps + 1, device=dev) / max(scan_steps, 1):
                    x = torch.where(qmask[sb][:, :, None], (1 - t) * a + t * vert, a)
                    tv, jsd = run(x, sb, sh)
                    tv = torch.where((jsd <= eps) & k_real, tv, torch.zeros_like(tv)).view(P, T)
                    val, k = tv.max(1)
                    better = val > scan_best[c : c + chunk]
                    scan_best[c : c + chunk] = torch.where(better, val, scan_best[c : c + chunk])
                    pick = x.view(P, T, T, T)[torch.arange(P, device=dev), k]
                    scan_x[c : c + chunk] = torch.where(better[:, None, None], pick, scan_x[c : c + chunk])

        # 2. Projected gradient ascent from `restarts` starts per (example, head).
        R = restarts
        E = B * H * R
        b_of, h_of = pair_b.repeat_interleave(R), pair_h.repeat_interleave(R)
        a0, q_e, key = A0[b_of, h_of], qmask[b_of], mask[b_of][:, None, :]  # (E, T, T), (E, T), (E, 1, T)
        g = torch.Generator().manual_seed(seed)
        r_of = torch.arange(R, device=dev).repeat(B * H)[:, None, None]
        far = F.one_hot(torch.where(key, a0, torch.full_like(a0, math.inf)).argmin(-1), T).to(a0.dtype)
        rand_key = torch.where(key, torch.rand(E, 1, T, generator=g).to(dev), torch.full_like(a0, -1.0))
        vertex = F.one_hot(rand_key.argmax(-1), T).to(a0.dtype)
        dirichlet = -torch.rand(E, T, T, generator=g).clamp_min(1e-12).log().to(dev)
        dirichlet = torch.where(key, dirichlet, torch.zeros_like(dirichlet))
        dirichlet = 0.5 * a0 + 0.5 * dirichlet / dirichlet.sum(-1, keepdim=True)
        x = torch.where(r_of == 0, scan_x.repeat_interleave(R, 0),
                        torch.where(r_of == 1, 0.9 * a0 + 0.1 * far, torch.where(r_of % 2 == 0, vertex, dirichlet)))
        x = torch.where(q_e[:, :, None], x, a0)

        best = scan_best.repeat_interleave(R)
        best_x = scan_x.repeat_interleave(R, 0)

        def keep_best(tv, jsd, x_in):
            nonlocal best, best_x
            better = (jsd <= eps) & (tv > best)
            best = torch.where(better, tv.detach(), best)
            best_x = torch.where(better[:, None, None], x_in.detach(), best_x)

        for it in range(steps):
            x_cur = x.detach().requires_grad_(True)
            tv, jsd = run(x_cur, b_of, h_of)
            keep_best(tv, jsd, x_cur)
            # The penalty aims a little inside the constraint so that iterates near it are feasible.
            obj = tv - 10.0 * torch.relu(jsd - 0.9 * eps) / eps
            (grad,) = torch.autograd.grad(obj.sum(), x_cur)
            grad = grad / grad.abs().amax(-1, keepdim=True).clamp_min(1.0)  # at most lr per entry and step
            step = lr * (1.0 - 0.9 * it / max(steps, 1))
            x = torch.where(q_e[:, :, None], project_simplex(x_cur.detach() + step * grad, key), a0)
        # 3. The ascent can end just outside the constraint: search the segment from A to each final point.
        with torch.no_grad():
            for t in torch.linspace(1.0, 0.0, 17, device=dev)[:-1]:
                x_cur = a0 + t * (x - a0)
                keep_best(*run(x_cur, b_of, h_of), x_cur)
        tv_bh = best.view(B, H, R).amax(-1)
        if not return_details:
            return tv_bh
        r_best = best.view(B, H, R).argmax(-1)  # (B, H)
        pick = torch.arange(B * H, device=dev) * R + r_best.flatten()
        rows = best_x[pick]
        with torch.no_grad():
            _, jsd = run(rows, pair_b, pair_h)
        return {"tv": tv_bh, "jsd": jsd.view(B, H), "rows": rows.view(B, H, T, T), "query_mask": qmask}

"""Shared helpers of the faithfulness package: input checks, eval mode with autograd, scorable tokens, orders."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


def _stage(name: str, say: Callable[[str], object] | None, detail: str = ""):
    """A timed stage of the faithfulness pass (common/progress.stage): its lines go to ``say`` (analyze.py's log),
    none when ``say`` is None (the training callbacks), and a benchmark's ``recorded_stages`` sees it either way."""
    from ...common.progress import stage

    return stage(name, say=say or (lambda _line: None), detail=detail)


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


def _pinned(model, input_ids: Tensor) -> Tensor | None:
    """(B, T) bool, True on the tokens the model keeps out of explanations (``model.pinned_ids``: a pretrained
    model's special tokens, [SEP], </s>, ...), or None when it keeps none (the project's encoders). Like <cls>,
    they are neither scored nor removed."""
    ids = tuple(getattr(model, "pinned_ids", ()) or ())
    if not ids:
        return None
    return torch.isin(input_ids, torch.tensor(ids, device=input_ids.device, dtype=input_ids.dtype))


def _scorable(mask: Tensor, pinned: Tensor | None = None) -> Tensor:
    """Real tokens other than <cls> and the ``pinned`` ones: the ones explainers score and erasure removes."""
    s = mask.clone() if pinned is None else mask & ~pinned
    s[:, 0] = False
    return s


def _finish(scores: Tensor, mask: Tensor, pinned: Tensor | None = None) -> Tensor:
    """float32 on the inputs' device, 0 at <cls>, at the pinned tokens and at padding."""
    return torch.where(_scorable(mask, pinned), scores.detach().float(), torch.zeros((), device=scores.device))


# Examples explained together by the explainers that build T x T maps: a batch runs in groups of similar length,
# each cut to its own width, so that a 14-token probe is not explained at the width of a 512-token one.
WIDTH_GROUP = 8


def real_ends(mask: Tensor) -> Tensor:
    """(B, T) -> (B,) one past each row's last True position (0 for a row without one): the width that row needs."""
    T = mask.shape[1]
    return torch.where(mask.bool(), torch.arange(1, T + 1, device=mask.device), 0).amax(1)


def by_width(fn: Callable[[Tensor, Tensor], dict[str, Tensor]], input_ids: Tensor, mask: Tensor,
             group: int | None = None) -> dict[str, Tensor]:
    """``fn(ids, mask) -> {name: (b, w)}`` run on groups of at most ``group`` (None: ``WIDTH_GROUP``) examples of
    similar length, each cut to its last real position; the results scattered back into {name: (B, T)} (0 beyond a
    group's width). The scores are those of one call on the whole batch: an example's scores do not depend on the
    others' padding."""
    B, T = mask.shape
    group = group or WIDTH_GROUP
    ends = real_ends(mask)
    order = torch.argsort(ends.cpu(), stable=True).to(mask.device)
    out: dict[str, Tensor] = {}
    for lo in range(0, B, group):
        idx = order[lo : lo + group]
        w = max(int(ends[idx].max()), 1)
        for name, v in fn(input_ids[idx, :w], mask[idx, :w]).items():
            out.setdefault(name, v.new_zeros(B, T))[idx, :w] = v
    return out


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


def _order(scores: Tensor, mask: Tensor, pinned: Tensor | None = None) -> Tensor:
    """Positions by decreasing score (ties: lower position first); non-scorable positions last."""
    s = torch.where(_scorable(mask, pinned), scores.double(), torch.full_like(scores, -math.inf, dtype=torch.float64))
    return torch.sort(s, dim=1, descending=True, stable=True).indices


def _ranks(order: Tensor) -> Tensor:
    """(B, T) order (positions, first to last) -> (B, T): each position's place in it."""
    rank = torch.empty_like(order)
    return rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))


def _top_masks(order: Tensor, counts: Tensor, T: int) -> Tensor:
    """(B, T) order, (B, K) counts -> (B, K, T) bool: True at the first ``counts`` positions of the order."""
    return _ranks(order)[:, None, :] < counts[:, :, None]


def _value_vectors(internals) -> Tensor:
    """(B, H, T, d): f_h(x_j) = (x_j W_v^h + b_v^h) W_o^h, what head h moves from token j."""
    return torch.einsum("bhtv,hvd->bhtd", internals.values, internals.out_proj)


def _nanmean(x: Tensor) -> float:
    x = x.double()
    ok = ~torch.isnan(x)
    return float(x[ok].mean()) if ok.any() else math.nan

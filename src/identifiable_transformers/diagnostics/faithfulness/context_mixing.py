"""Context-mixing maps (B, L, T, T) and the token scores they give (docs/faithfulness.md, Context mixing).

Per layer, row i of a map says how much each token j of the layer's input makes up token i of its output,
accounting for the whole block rather than the attention weights alone; rows are non-negative and sum to 1 over
the real tokens (padded queries' rows and padded keys' columns are 0). The maps are read from the models'
``encoder_blocks`` (models/blocks.py, hf/blocks.py), in eval mode without gradients:

- ``value_zeroing`` (Mohebbi et al., EACL 2023): token j's value vector zeroed in every head; the cosine distance
  of each token's layer output (attention, residual, LayerNorm, feed-forward) from the unchanged one. The
  attention weights do not depend on the values, so zeroing j's values takes ``sum_h A_h[:, j] f_h(x_j)`` off
  the attention output: the masked copies are the rest of the layer run on B*T modified attention outputs
  given the unchanged layer input, in a few batched passes (no full-model forward per token).
- ``alti`` (Ferrando et al., EMNLP 2022, section 3, and their code): the layer's attention residual output
  decomposed by token, ``T_i(x_j) = L_i(sum_h A_h[i, j] f_h(x_j) + [i = j] x_i)`` with ``L_i(u) = gamma *
  (u - mean(u)) / s_i`` the LayerNorm's linear part (``s_i`` the standard deviation of the whole pre-norm
  vector z_i = x_i + a_i); ``y_i`` the block's LayerNorm output ``LN(z_i)``, biases included (so
  ``y_i = sum_j T_i(x_j) + beta + L_i(b_o)``: the output projection's bias and the LayerNorm's beta belong to no
  token, but they are part of the vector the tokens are compared with); contribution
  ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)``, rows normalised. (Before issue 51 ``y_i`` was the bias-free
  ``sum_j T_i(x_j)``: ``alti_from_decomposition(Td)`` without ``y`` still gives it, for comparison; no explainer
  uses it.) Where the clipping zeroes a whole row (every T_i(x_j) farther from y_i than the origin: rare, but it
  happens), the paper's ratio is 0 / 0; here token i then keeps itself (1 on the diagonal).
- ``norm_resln`` (Kobayashi et al., EMNLP 2021, "attention with residual and LayerNorm"): ``||T_i(x_j)||_2``,
  rows normalised (as GlobEnc does before its rollout).

Pre-norm layers (``norm_first``) have no LayerNorm on the residual sum: there ``L_i`` is the identity.
The token explanation of a map is the pooled row (``<cls>``'s, or the mean of the real queries' rows for mean
pooling) of its rollout ``M_L ... M_1`` (the maps include the residual, so no identity is added), or of one
layer's map: ``<name>_layer<k>`` (k from 0).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import _eval_with_grad, _inputs, _pooled_rows, _value_vectors

CONTEXT_MIXING = ("value_zeroing", "alti", "norm_resln")
_PER_LAYER = re.compile(rf"^({'|'.join(CONTEXT_MIXING)})_layer(\d+)$")
# Elements of the largest intermediate a chunk may hold (the masked copies, the token decomposition).
_CHUNK_ELEMENTS = 2**23


def context_mixing_name(name: str) -> tuple[str, int | None] | None:
    """``"alti"`` -> ("alti", None) (the rollout); ``"alti_layer2"`` -> ("alti", 2); other names -> None."""
    if name in CONTEXT_MIXING:
        return name, None
    m = _PER_LAYER.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def _blocks(model, input_ids: Tensor, attention_mask: Tensor | None):
    reader = getattr(model, "encoder_blocks", None)
    if reader is None:
        raise ValueError(f"{type(model).__name__} has no encoder_blocks(): the context-mixing explainers read "
                         "a TransformerClassifier or a PretrainedClassifier")
    ids, mask = _inputs(model, input_ids, attention_mask)
    return reader(ids, mask), mask


def _normalise_rows(m: Tensor, mask: Tensor) -> Tensor:
    """Zero padded keys and padded queries' rows; real rows divided by their sum (all-zero rows stay 0)."""
    keep = (mask[:, :, None] & mask[:, None, :]).to(m.dtype)
    m = m * keep
    return m / m.sum(-1, keepdim=True).clamp_min(torch.finfo(m.dtype).tiny)


def _cosine_distance(y: Tensor, base: Tensor) -> Tensor:
    """1 - cos(y, base) over the last dimension, as ||y/|y| - base/|base|||^2 / 2 in float64: the same number
    without ``1 - cos``'s cancellation, which in float32 swamps the small distances of nearly unchanged outputs."""
    y, base = F.normalize(y.double(), dim=-1), F.normalize(base.double(), dim=-1)
    return (y - base).square().sum(-1) / 2


def _value_zeroing_layer(block, mask: Tensor, first_row_only: bool = False) -> Tensor:
    """(B, T, T) unnormalised: [b, i, j] = cosine distance of output i with token j's values zeroed.

    ``first_row_only``: only query 0's row (the rest 0), all that the ``<cls>`` row of a rollout needs of the last
    layer; the rest of the layer is per token, so each copy then runs on one token instead of n."""
    x, a = block.x, block.attention_output()
    base = block.finish(x, a)  # (B, T, d): the unchanged output, through the same code as the copies
    A, f = block.internals.attention, _value_vectors(block.internals)
    B, T, d = x.shape
    out = torch.zeros(B, T, T, dtype=torch.float32, device=x.device)  # [b, j, i] first, transposed at the end
    b_idx, j_idx = mask.nonzero(as_tuple=True)
    step = max(1, _CHUNK_ELEMENTS // (T * d * 4))  # the feed-forward is typically 4d wide
    for s in range(0, len(b_idx), step):
        b, j = b_idx[s:s + step], j_idx[s:s + step]
        # Right padding: the rest of the layer is per token, so the padded tail is cut.
        n = 1 if first_row_only else int(mask[b].sum(1).max())
        removed = torch.einsum("phq,phd->pqd", A[b, :, :n, j], f[b, :, j])  # what j's values brought to each query
        y = block.finish(x[b, :n], a[b, :n] - removed)
        out[b, j, :n] = _cosine_distance(y, base[b, :n]).float()
    return out.transpose(1, 2)


def value_zeroing(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Mohebbi et al. (EACL 2023): (B, L, T, T) float32, [b, l, i, j] = share of token j in layer l's output i."""
    with _eval_with_grad(model), torch.no_grad():
        blocks, mask = _blocks(model, input_ids, attention_mask)
        return torch.stack([_normalise_rows(_value_zeroing_layer(blk, mask), mask) for blk in blocks], 1)


def token_decomposition(A: Tensor, f: Tensor, x: Tensor, out_bias: Tensor | None, norm,
                        queries: slice | None = None) -> Tensor:
    """(B, T, T, d): T_i(x_j), the part of query i's normed attention residual output due to token j.

    A (B, H, T, T) attention weights, f (B, H, T, d) the per-head value vectors f_h(x_j), x (B, T, d) the layer
    input, ``out_bias`` (d,) or None, ``norm`` the LayerNorm after the residual (or None: identity). Summed over
    j it gives ``LN(x + a) - beta - L_i(b_o)`` for a LayerNorm (``x + a - b_o`` without one), a = sum_h A_h f_h +
    b_o. L_i is linear, so it is applied to f and x before the (B, T, T, d) product (one pass over it): centring
    and gamma to the vectors, 1 / s_i to query i's attention row and residual. In the inputs' dtype (float32 at
    least). ``queries`` (a slice of query rows): only those rows, (B, Q, T, d), so that a long input's product is
    built a few rows at a time (the LayerNorm's scale still comes from the whole row).
    """
    return _decomposition_rows(*_normed_factors(A, f, x, out_bias, norm), queries)


def _normed_factors(A: Tensor, f: Tensor, x: Tensor, out_bias: Tensor | None, norm) -> tuple[Tensor, Tensor, Tensor]:
    """A, f and x with the LayerNorm's linear part L_i folded in (see :func:`token_decomposition`): computed once,
    whatever the number of query chunks the product is built in."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    A, f, x = A.to(dtype), f.to(dtype), x.to(dtype)
    if norm is not None:
        z = x + torch.einsum("bhqk,bhkd->bqd", A, f)
        if out_bias is not None:
            z = z + out_bias.to(dtype)
        inv_s = (z.var(-1, unbiased=False) + norm.eps).rsqrt()  # (B, T): the LayerNorm's scale, from the whole sum
        gamma = norm.weight.to(dtype) if norm.weight is not None else torch.ones((), dtype=dtype, device=x.device)
        f = (f - f.mean(-1, keepdim=True)) * gamma
        x = (x - x.mean(-1, keepdim=True)) * gamma * inv_s[..., None]
        A = A * inv_s[:, None, :, None]
    return A, f, x


def _decomposition_rows(A: Tensor, f: Tensor, x: Tensor, queries: slice | None) -> Tensor:
    """The (B, Q, T, d) product of :func:`token_decomposition` for the ``queries`` rows of normed factors."""
    q = queries or slice(0, A.shape[-2])
    u = torch.einsum("bhqk,bhkd->bqkd", A[:, :, q], f)  # (B, Q, T, d)
    rows = torch.arange(u.shape[1], device=u.device)
    u[:, rows, rows + q.start] += x[:, q]  # the residual: token i's own input, only to itself
    return u


def alti_from_decomposition(Td: Tensor, y: Tensor | None = None) -> Tensor:
    """Ferrando et al. (2022): (B, T, T, d) T_i(x_j) -> (B, T, T) max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1).

    ``y`` (B, T, d): the block's output the tokens are compared with, the LayerNorm output biases included (the
    paper's y_i: :func:`_block_output`); None: the bias-free ``sum_j T_i(x_j)``, which differs from it by
    ``beta + L_i(b_o)`` (kept only to compare the two)."""
    y = Td.sum(2) if y is None else y.to(Td.dtype)
    dist = (y[:, :, None] - Td).abs().sum(-1)
    return (y.abs().sum(-1)[..., None] - dist).clamp_min(0)


def _clipped_rows_keep_self(c: Tensor, mask: Tensor) -> Tensor:
    """A real query whose every contribution the clipping set to 0 keeps itself (contribution 1 from itself): the
    paper leaves such a row undefined (0 / 0); this keeps rows distributions and the rollout defined."""
    empty = ((c * mask[:, None, :]).sum(-1) == 0) & mask  # (B, T)
    return c + torch.diag_embed(empty.to(c.dtype))


def _block_output(blk, rows: slice, n: int, dtype: torch.dtype) -> Tensor:
    """(B', n, d) y_i of ALTI: the LayerNorm of the attention residual sum x_i + a_i (a_i with the output bias), in
    ``dtype``; x_i + a_i itself for a pre-norm layer (no LayerNorm on the sum)."""
    z = (blk.x[rows, :n] + blk.attention_output()[rows, :n]).to(dtype)
    norm = blk.norm
    if norm is None:
        return z
    weight = None if norm.weight is None else norm.weight.to(dtype)
    bias = None if norm.bias is None else norm.bias.to(dtype)
    return F.layer_norm(z, norm.normalized_shape, weight, bias, norm.eps)


def _decomposition_maps(blocks, mask: Tensor, kinds: Sequence[str]) -> dict[str, Tensor]:
    """{"alti" / "norm_resln": (B, L, T, T) float32} from one token decomposition per layer, in batch chunks."""
    maps: dict[str, list[Tensor]] = {k: [] for k in kinds}
    for blk in blocks:
        B, T, d = blk.x.shape
        step = max(1, _CHUNK_ELEMENTS // (T * T * d))
        f = _value_vectors(blk.internals)
        parts: dict[str, list[Tensor]] = {k: [] for k in kinds}
        for s in range(0, B, step):
            sl = slice(s, s + step)
            n = int(mask[sl].sum(1).max())  # right padding: the chunk's padded tail is cut (probes come sorted)
            m = mask[sl, :n]
            y = _block_output(blk, sl, n, torch.promote_types(blk.x.dtype, torch.float32)) if "alti" in kinds else None
            rows: dict[str, list[Tensor]] = {k: [] for k in kinds}
            # a long input's (n, n, d) product a few query rows at a time (512 word pieces of MiniLM: 400 MB at once)
            q_step = max(1, _CHUNK_ELEMENTS // (m.shape[0] * n * d))
            factors = _normed_factors(blk.internals.attention[sl, :, :n, :n], f[sl, :, :n], blk.x[sl, :n],
                                      blk.out_bias, blk.norm)
            for q0 in range(0, n, q_step):
                q = slice(q0, min(n, q0 + q_step))
                # padded keys contribute nothing (their weight is 0 but for i = j)
                Td = _decomposition_rows(*factors, q) * m[:, None, :, None]
                if "alti" in kinds:
                    rows["alti"].append(alti_from_decomposition(Td, y[:, q]))
                if "norm_resln" in kinds:
                    rows["norm_resln"].append(Td.norm(dim=-1))
            if "alti" in kinds:
                parts["alti"].append(F.pad(_clipped_rows_keep_self(torch.cat(rows["alti"], 1), m),
                                           (0, T - n, 0, T - n)))
            if "norm_resln" in kinds:
                parts["norm_resln"].append(F.pad(torch.cat(rows["norm_resln"], 1), (0, T - n, 0, T - n)))
        for k in kinds:
            maps[k].append(_normalise_rows(torch.cat(parts[k]), mask).float())
    return {k: torch.stack(v, 1) for k, v in maps.items()}


def alti(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Ferrando et al. (EMNLP 2022): (B, L, T, T) float32 contributions, rows summing to 1 over real tokens."""
    with _eval_with_grad(model), torch.no_grad():
        blocks, mask = _blocks(model, input_ids, attention_mask)
        return _decomposition_maps(blocks, mask, ["alti"])["alti"]


def norm_resln(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Kobayashi et al. (EMNLP 2021): (B, L, T, T) float32, ||T_i(x_j)||_2 with residual and LayerNorm, rows
    normalised over real tokens."""
    with _eval_with_grad(model), torch.no_grad():
        blocks, mask = _blocks(model, input_ids, attention_mask)
        return _decomposition_maps(blocks, mask, ["norm_resln"])["norm_resln"]


def rollout_maps(maps: Tensor) -> Tensor:
    """(B, L, T, T) per-layer maps -> (B, T, T) their product M_{L-1} ... M_0 (how each output token is made of
    the embeddings)."""
    R = maps[:, 0]
    for layer in range(1, maps.shape[1]):
        R = maps[:, layer] @ R
    return R


def context_mixing_scores(model, input_ids: Tensor, mask: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
    """{name: (B, T)} token scores of context-mixing explainer names (``context_mixing_name``): the pooled row
    of the rollout, or of layer k's map for ``<name>_layer<k>``. Computes each kind of map once."""
    parsed = {n: context_mixing_name(n) for n in names}
    kinds = list(dict.fromkeys(kind for kind, _ in parsed.values()))
    with torch.no_grad():
        blocks, mask = _blocks(model, input_ids, mask)
        for n, (_, layer) in parsed.items():
            if layer is not None and layer >= len(blocks):
                raise ValueError(f"explainer {n!r}: the model has {len(blocks)} layers (0..{len(blocks) - 1})")
        maps = _decomposition_maps(blocks, mask, [k for k in kinds if k != "value_zeroing"])
        if "value_zeroing" in kinds:
            # With <cls> pooling a score reads row 0 of the map it scores alone, and of a rollout's last factor:
            # those layers' copies run on one token.
            rollout = any(layer is None for kind, layer in parsed.values() if kind == "value_zeroing")
            last = len(blocks) - 1
            row0 = [model.pooling == "cls" and (i == last or not rollout) for i in range(len(blocks))]
            maps["value_zeroing"] = torch.stack(
                [_normalise_rows(_value_zeroing_layer(blk, mask, row0[i]), mask) for i, blk in enumerate(blocks)], 1)
    out = {}
    for n, (kind, layer) in parsed.items():
        M = rollout_maps(maps[kind]) if layer is None else maps[kind][:, layer]
        out[n] = _pooled_rows(model, M.unsqueeze(1), mask).squeeze(1)
    return out

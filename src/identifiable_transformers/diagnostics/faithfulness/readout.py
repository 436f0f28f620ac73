"""Running the masked copies of erasure: the exact one-layer <cls> shortcut, else chunked forward passes."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...models import TransformerClassifier

# Upper bound on tokens per forward pass of the erasure copies (keeps memory flat on long probes), and on tokens x
# width: a wide encoder's chunk holds fewer tokens (all-MiniLM-L6-v2 at 512 word pieces: 21 copies a pass, 1.2 GB,
# where 256 copies took 3.0 GB and were no faster).
_CHUNK_TOKENS = 1 << 17
_CHUNK_ACTIVATIONS = 1 << 22
# Upper bound on attention weights (copies x heads x keys) the <cls> shortcut holds at once: about 16 MB of float32
# per chunk, whatever the number of copies (all of them at once took 3.7 GB at 512 tokens).
_CHUNK_WEIGHTS = 1 << 22


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
        return isinstance(model, TransformerClassifier) and model.num_layers == 1 and model.pooling == "cls"

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


class _MaskedCopies:
    """Class probabilities of masked copies of one batch, called once per set of copies (erasure: once per
    explainer). The one-layer shortcut's queries, keys and values are computed once, when it is built."""

    def __init__(self, model, input_ids: Tensor):
        self.model, self.input_ids = model, input_ids
        with torch.no_grad():
            self.readout = _ClsReadout(model, input_ids) if _ClsReadout.applies(model) else None

    def __call__(self, example: Tensor, masks: Tensor) -> Tensor:
        """Class probabilities of example ``example[s]`` seen through ``masks[s]``: (S,) and (S, T) -> (S, C).

        One-layer cls-pooling models use the exact ``_ClsReadout`` shortcut, in chunks of rows. Otherwise the rows
        run through the model in chunks of similar length (:meth:`_forward_by_length`).
        """
        out = []
        T = self.input_ids.shape[1]
        with torch.no_grad():
            if self.readout is not None:
                readout = self.readout
                step = max(1, _CHUNK_WEIGHTS // (readout.scores.shape[1] * max(T, 1)))
                for i in range(0, masks.shape[0], step):
                    e = example[i : i + step]
                    out.append(readout.logits(e, readout.weights(e, masks[i : i + step])).float().softmax(-1))
            else:
                return self._forward_by_length(example, masks)
        return torch.cat(out) if out else masks.new_zeros(0, 0, dtype=torch.float32)

    def _forward_by_length(self, example: Tensor, masks: Tensor) -> Tensor:
        """Full forward passes over the copies, shortest first, in chunks of similar length, each cut to its last
        real position: a probe stratified over lengths then pays for each copy's own length, not the longest
        example's (docs/faithfulness.md: 2.2x faster on a 6-layer encoder, 10-60 word pieces). A model whose
        tokens keep their positions in a shorter sequence (``keeps_positions``: BERT, RoBERTa, DistilBERT,
        ELECTRA) runs each copy as its kept tokens only (``kept_logits``), so the length is the kept count."""
        if masks.shape[0] == 0:
            return masks.new_zeros(0, 0, dtype=torch.float32)
        compact = getattr(self.model, "keeps_positions", False)
        budget = min(_CHUNK_TOKENS, max(1, _CHUNK_ACTIVATIONS // int(getattr(self.model, "embed_dim", 1))))
        # each copy's cost: its kept tokens, or one past its last real position
        ends = masks.sum(1) if compact else masks.shape[1] - masks.flip(1).int().argmax(1)
        order = ends.argsort(stable=True)
        out, i = [], 0
        while i < len(order):
            t0 = int(ends[order[i]])
            j = i + 1  # the chunk: copies up to 1.25 x (at least 8 more than) its shortest, within the token budget
            while j < len(order) and int(ends[order[j]]) <= max(t0 + 8, 1.25 * t0) and \
                    (j - i + 1) * int(ends[order[j]]) <= budget:
                j += 1
            rows, t = order[i:j], int(ends[order[j - 1]])  # sorted: the chunk's last copy is its longest
            ids = self.input_ids[example[rows]]
            logits = (self.model.kept_logits(ids, masks[rows]) if compact
                      else self.model(ids[:, :t], masks[rows, :t]).logits)
            out.append(logits.float().softmax(-1))
            i = j
        return torch.cat(out)[order.argsort()]  # back from length order to the copies' order


def _masked_probs(model, input_ids: Tensor, example: Tensor, masks: Tensor) -> Tensor:
    """One set of masked copies (:class:`_MaskedCopies`): (S,) and (S, T) -> (S, C) class probabilities."""
    return _MaskedCopies(model, input_ids)(example, masks)

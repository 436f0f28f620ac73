"""The prediction with one head's attention rows of the last layer replaced, without rerunning the layers below.

The adversarial search (adversarial.py) changes only the last layer's map of one head, so everything below that
layer is the same for every candidate. Head h adds ``A_h f_h`` to the layer's attention output (models/blocks.py,
``f_h(x_j) = (x_j W_v^h + b_v^h) W_o^h``): rows A'_h change that output by ``(A'_h - A_h) f_h``, and the rest of the
layer (``EncoderBlock.finish``) and the readout (``logits_from_last_layer``: final norm, pooling, head) run on the
changed rows only -- with cls pooling the first token alone, since the rest of a layer works token by token.
So a candidate costs one token's feed-forward instead of a forward pass of the whole model (for a 6-layer
MiniLM-shaped encoder at 64 tokens, the end-of-fit search went from minutes to seconds: docs/performance.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import _value_vectors

# Elements of the gathered per-copy value vectors (copies x keys x d) held at once: 16 MB of float32.
_CHUNK_ELEMENTS = 1 << 22


class LastLayerReadout:
    """Logits of copies of a batch whose last-layer head ``h`` attends with new rows (exact, eval mode).

    Built once per batch from the model's ``encoder_blocks`` (the last layer's input, attention output, maps and
    value vectors); ``logits(b, h, rows)`` then gives the logits of example ``b[s]`` with head ``h[s]``'s map set
    to ``rows[s]`` on the query rows the classifier reads (the first with cls pooling, the real ones with mean).
    """

    def __init__(self, model, input_ids: Tensor, mask: Tensor):
        with torch.no_grad():
            block = model.encoder_blocks(input_ids, mask)[-1]
            self.x, self.a = block.x, block.attention_output()  # (B, T, d) each
            self.A = block.internals.attention.to(self.a.dtype)  # (B, H, T, T)
            f = _value_vectors(block.internals)  # (B, H, T, d)
        self.f = f.reshape(-1, *f.shape[2:])  # (B H, T, d): row b H + h
        self.model, self.finish, self.mask, self.heads = model, block.finish, mask, f.shape[1]
        self.rows = 1 if model.pooling == "cls" else mask.shape[1]  # the query rows that reach the classifier

    @staticmethod
    def applies(model) -> bool:
        """Models with ``encoder_blocks`` (that can read their layers) and a ``logits_from_last_layer`` (None for a
        bare encoder, and for a checkpoint whose family's task head ``hf/sequence_classifier.py`` does not know)."""
        unsupported = getattr(model, "context_mixing_unsupported", None)
        return (callable(getattr(model, "encoder_blocks", None))
                and callable(getattr(model, "logits_from_last_layer", None))
                and (unsupported is None or unsupported() is None))

    def logits(self, b: Tensor, h: Tensor, rows: Tensor) -> Tensor:
        """(S,) examples, (S,) heads, (S, T, T) maps (only the read query rows are used) -> (S, C) logits."""
        n, T = self.rows, rows.shape[-1]
        step = max(1, _CHUNK_ELEMENTS // (T * self.f.shape[-1]))
        out = []
        for s in range(0, len(b), step):
            bs, hs = b[s:s + step], h[s:s + step]
            q = self.mask[bs, :n, None].to(rows.dtype)  # padded queries (mean pooling) are not read
            delta = (rows[s:s + step, :n] - self.A[bs, hs, :n]) * q  # (s, n, T)
            a = self.a[bs, :n] + delta @ self.f[bs * self.heads + hs]  # (s, n, d)
            y = self.finish(self.x[bs, :n], a)
            out.append(self.model.logits_from_last_layer(y, self.mask[bs, :n]))
        return torch.cat(out)

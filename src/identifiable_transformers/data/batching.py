"""Fixed batch shapes (``data.static_shapes``) and a tokenized split kept as tensors on the training device,
shuffled and batched there (``data.on_device``).

Static shapes, for CUDA graphs (``model.cuda_graphs``): each batch is padded to the next of a few lengths
(``bucket_lengths``), and a short last training batch is filled with padding rows (``fill_batch``) whose label
is -100, which the loss and the metrics leave out: nothing is dropped.

On the device:

The order comes from the same sampler as the DataLoader's (``samplers.py``: seeded per epoch, length
buckets, DDP shards, exact resume), and each batch has exactly the DataLoader's contents: padded to its
longest example (or to the next length bucket with ``data.static_shapes``), and, with a fixed batch size,
filled with padding rows. Per batch the host slices a precomputed index and reads a batch width it already
knows: nothing waits for the device, and no worker process is started (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from .samplers import EpochShuffleSampler

IGNORE_INDEX = -100  # a padding row's label: F.cross_entropy's default ignore_index (metrics.IGNORE_INDEX)


def bucket_lengths(max_length: int, buckets=None) -> list[int]:
    """The padded widths of ``static_shapes``: ``buckets`` (sorted, each in [2, max_length]), or the powers of two
    from 32 below ``max_length``; ``max_length`` itself is always the last."""
    if buckets is None:
        buckets = [b for b in (2**i for i in range(5, 20)) if b < max_length]
    buckets = sorted({int(b) for b in buckets})
    bad = [b for b in buckets if not 2 <= b <= max_length]
    if bad:
        raise ValueError(f"data.length_buckets {bad} lie outside [2, data.max_length={max_length}]: each bucket is "
                         "a padded batch width; pick lengths up to max_length, or null for powers of two")
    return [b for b in buckets if b < max_length] + [max_length]


def padding_row(batch: dict[str, torch.Tensor], pad_id: int, cls_id: int) -> dict[str, torch.Tensor]:
    """One filler row per key of ``batch``: ``<cls>`` alone (a real token, so its attention stays finite), label
    IGNORE_INDEX, no rationale."""
    width = batch["input_ids"].shape[1]
    device = batch["input_ids"].device
    ids = torch.full((width,), pad_id, dtype=batch["input_ids"].dtype, device=device)
    ids[0] = cls_id
    row = {"input_ids": ids, "attention_mask": torch.arange(width, device=device) == 0,
           "labels": torch.tensor(IGNORE_INDEX, dtype=batch["labels"].dtype, device=device)}
    for k, v in batch.items():
        if k not in row:
            row[k] = torch.zeros(v.shape[1:], dtype=v.dtype, device=device)
    return {k: row[k].to(batch[k].dtype) for k in batch}


def fill_batch(batch: dict[str, torch.Tensor], filler: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """``batch`` with filler rows appended up to ``rows`` rows (the filler cut to the batch's width)."""
    extra = rows - batch["labels"].shape[0]
    out = {}
    for k, v in batch.items():
        f = filler[k]
        f = f[..., : v.shape[1]].expand(extra, v.shape[1]) if v.dim() == 2 else f.expand(extra)
        out[k] = torch.cat([v, f])
    return out


class DeviceBatches:
    """Batches of ``tensors`` (each (N, W) or (N,), on one device) in ``sampler``'s order.

    Token ids may be stored as int32 (half the memory) and are returned as int64, as the DataLoader's.
    lengths: (N,) the examples' token counts (on the host). width_of: the padded width of a batch whose
    longest example has t tokens. filler: a padding row of each (N, W) or (N,) tensor (e.g. label -100),
    appended until a batch has ``fill_to`` rows; None: a short last batch stays short.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], lengths: np.ndarray, sampler: EpochShuffleSampler,
                 batch_size: int, width_of: Callable[[int], int], filler: dict[str, torch.Tensor] | None = None,
                 fill_to: int | None = None):
        self.tensors, self.lengths, self.sampler = tensors, np.asarray(lengths), sampler
        self.batch_size, self.width_of, self.fill_to = int(batch_size), width_of, fill_to
        self.filler = None if filler is None else {k: _widen(v) for k, v in filler.items()}
        self.device = next(iter(tensors.values())).device
        self.batch_sampler = None  # Lightning looks for a DataLoader's attributes (sampler, batch_sampler)

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = np.fromiter(iter(self.sampler), dtype=np.int64)
        index = torch.from_numpy(order).to(self.device)  # one copy per epoch
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            width = self.width_of(int(self.lengths[rows].max()))
            idx = index[start:start + len(rows)]
            batch = {k: _widen(v.index_select(0, idx)[:, :width] if v.dim() == 2 else v.index_select(0, idx))
                     for k, v in self.tensors.items()}
            if self.fill_to is not None and len(rows) < self.fill_to:
                batch = fill_batch(batch, self.filler, self.fill_to)
            yield batch


def _widen(x: torch.Tensor) -> torch.Tensor:
    """int32 token ids (stored compact) back to the DataLoader's int64."""
    return x.long() if x.dtype == torch.int32 else x

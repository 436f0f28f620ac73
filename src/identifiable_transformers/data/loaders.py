"""Batching and exact resume of ``TextDataModule`` (a mixin): collate, length buckets and fixed shapes, the
samplers, DataLoader or device-resident batches (``data.on_device``), and the training position kept in
checkpoints."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import pyarrow.compute as pc
import torch
from torch.utils.data import DataLoader

from .batching import DeviceBatches, fill_batch, padding_row
from .rationales import rationale_mask
from .samplers import EpochShuffleSampler, LengthBucketSampler
from .tokenizer import pad_batch


class Batching:
    """Needs the data module's settings (batch sizes, pad and ``<cls>`` ids, ``static_shapes``,
    ``length_buckets``, ``on_device``, ``length_bucketing``, ``num_workers``, ``shuffle_seed``) and ``trainer``."""

    def collate(self, rows: Sequence[Mapping[str, Any]], fill_to: int | None = None) -> dict[str, torch.Tensor]:
        """Pad to the longest example of the batch (``static_shapes``: to the next of ``length_buckets``); mask
        True on real tokens (and, with rationales, ``rationale_mask`` True on rationale tokens, padded alike).
        ``fill_to``: append padding rows (``<cls>`` alone, label -100: out of the loss and the metrics) up to
        that many rows."""
        ids, mask = pad_batch([r["input_ids"] for r in rows], self.pad_id)
        width = self._width(ids.shape[1])
        ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=self.pad_id)
        mask = torch.nn.functional.pad(mask, (0, width - mask.shape[1]), value=False)
        batch = {"input_ids": ids, "attention_mask": mask,
                 "labels": torch.tensor([int(r["labels"]) for r in rows], dtype=torch.long)}
        if rows and "rationale" in rows[0]:
            batch["rationale_mask"] = rationale_mask([r["rationale"] for r in rows], width)
        if fill_to is not None and len(rows) < fill_to:
            batch = fill_batch(batch, padding_row(batch, self.pad_id, self.cls_id), fill_to)
        return batch

    def _width(self, longest: int) -> int:
        """A batch's padded width: its longest example, or with ``static_shapes`` the next length bucket."""
        if not self.static_shapes:
            return longest
        return next(b for b in self.length_buckets if b >= longest)

    def _shard(self) -> tuple[int, int]:
        """(rank, world_size) of this process; the datamodule shards every split itself."""
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            if trainer._accelerator_connector.use_distributed_sampler:
                raise ValueError("TextDataModule shards the data across ranks itself (exactly resumable, length "
                                 "bucketing kept); build the Trainer with use_distributed_sampler=False, as "
                                 "conf/trainer/default.yaml does.")
            return trainer.global_rank, trainer.world_size
        return 0, 1

    def _loader(self, ds, batch_size: int, train: bool) -> DataLoader | DeviceBatches:
        rank, world = self._shard()
        lengths = None
        if (train and self.length_bucketing) or self.on_device:
            lengths = pc.list_value_length(ds.data.column("input_ids")).to_numpy()
        if train and self.length_bucketing:
            sampler = LengthBucketSampler(lengths, batch_size, seed=self.shuffle_seed, rank=rank, world_size=world)
        else:
            sampler = EpochShuffleSampler(len(ds), seed=self.shuffle_seed, shuffle=train, rank=rank, world_size=world)
        if train and self._resume is not None:
            self._resume_sampler(sampler, world)
        # Training batches keep one size for CUDA graphs: the last one is filled with padding rows, never dropped.
        fill_to = batch_size if train and self.static_shapes else None
        if self.on_device:
            return self._device_batches(ds, lengths, sampler, batch_size, fill_to)
        # Its own generator: creating an iterator would otherwise draw from the global torch RNG and shift
        # the dropout masks of a run resumed mid-epoch.
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=partial(self.collate, fill_to=fill_to),
                          num_workers=self.num_workers, pin_memory=self.pin_memory,
                          persistent_workers=self.num_workers > 0,
                          generator=torch.Generator().manual_seed(self.shuffle_seed))

    def _device_batches(self, ds, lengths, sampler, batch_size: int, fill_to: int | None) -> DeviceBatches:
        """``data.on_device``: the whole split collated once (padded to its longest batch's width) and moved to
        the training device; batches are then cut there (device_batches.py)."""
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        key = (id(ds), str(device))
        if key not in self._on_device:
            whole = self.collate(ds)  # every example, padded to the split's longest (its bucket when static)
            # token ids as int32 on the device: half the memory (DeviceBatches widens each batch back to int64)
            self._on_device[key] = {k: v.to(device, torch.int32 if k == "input_ids" else v.dtype)
                                    for k, v in whole.items()}
        tensors = self._on_device[key]
        filler = padding_row(tensors, self.pad_id, self.cls_id) if fill_to is not None else None
        return DeviceBatches(tensors, lengths, sampler, batch_size, self._width, filler, fill_to)

    def _resume_sampler(self, sampler: EpochShuffleSampler, world: int) -> None:
        position, self._resume = self._resume, None
        if position["world_size"] != world:
            warnings.warn(f"the checkpoint was written by {position['world_size']} rank(s), this run has {world}: "
                          f"epoch {position['epoch']} restarts from its first batch instead of resuming exactly.",
                          stacklevel=3)
            sampler.set_epoch(position["epoch"])
            return
        sampler.resume_at(position["epoch"], position["samples"])

    def _train_position(self) -> dict[str, int] | None:
        """Where training stands in the data: the epoch and how many samples of it this rank has used."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit" or trainer.num_training_batches in (0, float("inf")):
            return None
        epoch = trainer.current_epoch
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed  # training steps run this epoch
        if done >= trainer.num_training_batches:
            epoch, done = epoch + 1, 0
        return {"epoch": epoch, "samples": done * self.batch_size, "world_size": trainer.world_size}

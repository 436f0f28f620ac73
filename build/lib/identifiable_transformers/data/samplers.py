"""Training and evaluation samplers: seeded per-epoch orders, length bucketing, DDP shards, exact resume."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    """This rank's share of an order drawn from ``(seed, epoch)`` alone.

    The order depends on nothing else, so a resumed run replays the batches an uninterrupted run
    would have seen: :meth:`resume_at` starts the next iteration part-way into an epoch. Under
    distributed training each of ``world_size`` ranks takes every ``world_size``-th index of the
    common order; with ``shuffle`` the order wraps around so that every rank gets the same number
    of batches (as ``DistributedSampler`` does). Without ``shuffle`` (evaluation) the shards are
    disjoint and cover the data exactly once. Lightning calls ``set_epoch`` before every epoch.
    """

    def __init__(self, num_samples: int, seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1):
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
        self.num_samples, self.seed, self.shuffle = int(num_samples), int(seed), bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
        self.epoch = 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def resume_at(self, epoch: int, consumed: int) -> None:
        """Make the next iteration epoch ``epoch``, skipping the ``consumed`` indices this rank had
        already yielded in it. ``len()`` stays the full epoch's, as Lightning's loop expects."""
        if not 0 <= int(consumed) <= len(self):
            raise ValueError(f"cannot resume {consumed} samples into an epoch of {len(self)}")
        self.epoch = int(epoch)
        self._resume = (int(epoch), int(consumed))

    def __len__(self) -> int:
        if self.shuffle:
            return -(-self.num_samples // self.world_size)
        return len(range(self.rank, self.num_samples, self.world_size))

    def _order(self, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(self.num_samples)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = self._order(np.random.default_rng(self.seed + self.epoch))
            if self.world_size > 1:
                order = np.resize(order, len(self) * self.world_size)[self.rank :: self.world_size]
        else:
            order = np.arange(self.rank, self.num_samples, self.world_size)
        skip = 0
        if self._resume is not None:
            epoch, consumed = self._resume
            self._resume = None
            skip = consumed if epoch == self.epoch else 0
        self.epoch += 1  # without set_epoch, consecutive iterations still differ
        return iter(order[skip:].tolist())


class LengthBucketSampler(EpochShuffleSampler):
    """An :class:`EpochShuffleSampler` whose order puts similar lengths in consecutive
    ``batch_size`` chunks: shuffle, cut into pools of ``batch_size * pool_batches``, sort each pool
    by length, cut into batches, shuffle the batch order."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int = 0, pool_batches: int = 50,
                 rank: int = 0, world_size: int = 1):
        super().__init__(len(lengths), seed, shuffle=True, rank=rank, world_size=world_size)
        self.lengths = np.asarray(lengths)
        self.batch_size = int(batch_size)
        self.pool = self.batch_size * int(pool_batches)

    def _order(self, rng: np.random.Generator) -> np.ndarray:
        perm = rng.permutation(len(self.lengths))
        batches = []
        for s in range(0, len(perm), self.pool):
            pool = perm[s : s + self.pool]
            pool = pool[np.argsort(self.lengths[pool], kind="stable")]
            batches.extend(pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size))
        if not batches:
            return perm
        return np.concatenate([batches[j] for j in rng.permutation(len(batches))])

"""Length bucketing keeps similar lengths within a batch, but the batches come in random order.

Known answer: when the batch order is a uniform permutation, each batch is longer (by mean length)
than the one before it with probability 1/2, and the shortest batch of an epoch is equally likely at
any position. Batches left in pool order (sorted by length within each pool) give about 1 and the
first position of a pool instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from identifiable_transformers.data import LengthBucketSampler


def _batch_means(sampler, lengths, batch_size):
    order = np.asarray(list(sampler))
    assert sorted(order.tolist()) == list(range(len(lengths)))  # a permutation of the examples
    return np.array([lengths[order[i : i + batch_size]].mean() for i in range(0, len(order), batch_size)])


@pytest.mark.parametrize("pool_batches", [100, 10])  # one pool; ten pools
def test_batches_come_in_random_order_across_buckets(pool_batches):
    lengths = np.random.default_rng(0).integers(1, 200, size=1000)
    sampler = LengthBucketSampler(lengths, batch_size=10, seed=0, pool_batches=pool_batches)
    rises, argmins = [], []
    for epoch in range(5):
        sampler.set_epoch(epoch)
        means = _batch_means(sampler, lengths, 10)
        rises.append(np.mean(np.diff(means) > 0))
        argmins.append(int(np.argmin(means)))
    # 5 x 99 consecutive pairs: the share that rises is 1/2 up to a few percent (sd about 0.03)
    assert abs(np.mean(rises) - 0.5) < 0.12, rises
    assert len(set(argmins)) >= 4, argmins  # the shortest batch is not pinned to one position


def test_within_a_batch_lengths_stay_close():
    # the other half of the contract, so that the test above cannot pass with no bucketing at all
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 200, size=1000)
    order = np.asarray(list(LengthBucketSampler(lengths, batch_size=10, seed=0, pool_batches=100)))
    spread = np.mean([np.ptp(lengths[order[i : i + 10]]) for i in range(0, 1000, 10)])
    assert spread < 0.2 * np.mean([np.ptp(lengths[rng.permutation(1000)[:10]]) for _ in range(200)])

"""The per-epoch diagnostics at 512 tokens (issue 53): what the width groups and the sampled long probes save.

Measured side by side in one process, on one random encoder per design (embed 64, 4 heads, max_len 512), on
probes drawn as the identifiability callback draws them from 2,500 IMDb-like validation lengths (log-normal,
median 230 tokens, 14-512):

  * the faithfulness pass (every cheap explainer, 10 random draws, erasure, tau with leave-one-out) on the
    default probe (64 examples, doubling strata), once as one group at the probe's full width (``WIDTH_GROUP``
    set to 10**6: what the pass did before) and once in the default groups of 8 examples of similar length, each
    cut to its own width; the largest score difference between the two is printed (it must be ~1e-6: the same
    scores);
  * the identifiability pass and the faithfulness pass on the default probe against the ``imdb512_cpu`` preset's
    probe (36 examples in the strata 40, 64, 96, 130, 512: 8 of them over 130 tokens).

Usage: python bench/bench_probe_512.py [--repeats 3] [--designs concat,add] [--quick]
(--quick: 200 validation lengths up to 96 tokens and 16 probes, to check that it runs.)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from identifiable_transformers.diagnostics import attention_identifiability
from identifiable_transformers.diagnostics.callbacks.probes import doubling_strata, select_probe_indices
from identifiable_transformers.diagnostics.faithfulness import CHEAP_EXPLAINERS, _common, explain, faithfulness_report
from identifiable_transformers.models import TransformerClassifier

VOCAB = 20_000


def probe_batch(lengths: np.ndarray, size: int, strata, max_length: int, rng) -> tuple[torch.Tensor, torch.Tensor]:
    n = lengths[select_probe_indices(lengths, size, seed=0, max_length=max_length, strata=strata)]
    ids = torch.zeros(len(n), int(n.max()), dtype=torch.long)
    for i, k in enumerate(n):
        ids[i, :k] = torch.from_numpy(rng.integers(3, VOCAB, k))
    ids[:, 0] = 2  # <cls>
    return ids, ids != 0


def seconds(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def whole_width(f):
    """``f()`` with the explainers' width groups off: one group at the batch's full width."""
    saved = _common.WIDTH_GROUP
    _common.WIDTH_GROUP = 10**6
    try:
        return f()
    finally:
        _common.WIDTH_GROUP = saved


def row(combine: str, max_length: int, default, sampled, repeats: int) -> str:
    torch.manual_seed(0)
    model = TransformerClassifier(VOCAB, 2, embed_dim=64, num_heads=4, head_combine=combine, max_len=max_length).eval()

    def faith(batch):
        return faithfulness_report(model, *batch, explainers=CHEAP_EXPLAINERS)

    a = whole_width(lambda: explain(model, *default, CHEAP_EXPLAINERS[:-1]))
    b = explain(model, *default, CHEAP_EXPLAINERS[:-1])
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    whole = seconds(lambda: whole_width(lambda: faith(default)), repeats)
    groups = seconds(lambda: faith(default), repeats)
    ident = seconds(lambda: attention_identifiability(model, *default), repeats)
    ident_small = seconds(lambda: attention_identifiability(model, *sampled), repeats)
    faith_small = seconds(lambda: faith(sampled), repeats)
    share = (ident_small + faith_small) / (ident + groups)
    return (f"{combine:<8}{whole:>12.2f}{groups:>13.2f}{groups / whole:>7.2f}{diff:>10.1e}"
            f"{ident:>8.2f}{ident_small:>13.2f}{faith_small:>13.2f}{share:>15.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--designs", default="concat,add")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    max_length, n_val, size, small = (96, 200, 16, 8) if args.quick else (512, 2500, 64, 36)
    lengths = np.clip(np.round(rng.lognormal(np.log(230), 0.8, n_val)), 14, max_length).astype(int)
    default = probe_batch(lengths, size, doubling_strata(max_length), max_length, rng)
    preset_strata = [s for s in (40, 64, 96, 130, 512) if s < max_length] + [max_length]
    sampled = probe_batch(lengths, small, preset_strata, max_length, rng)
    for name, (_, mask) in (("default", default), ("preset", sampled)):
        n = mask.sum(1)
        print(f"{name} probe: {len(n)} examples, {int((n > 130).sum())} over 130 tokens, lengths {int(n.min())}-"
              f"{int(n.max())}")
    print(f"threads={torch.get_num_threads()}, median of {args.repeats}; wall seconds")
    print("faith whole / groups: the faithfulness pass on the default probe at its full width / in width groups; "
          "ident, faith: on the default probe and on the preset's; last column: preset / default (ident + faith)")
    print(f"{'heads':<8}{'faith whole':>12}{'faith groups':>13}{'ratio':>7}{'max diff':>10}"
          f"{'ident':>8}{'ident preset':>13}{'faith preset':>13}{'preset/default':>15}")
    for combine in args.designs.split(","):
        print(row(combine, max_length, default, sampled, args.repeats))

if __name__ == "__main__":
    main()

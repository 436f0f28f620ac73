"""Cost of the per-epoch equivalence ranges (EquivalenceCallback) relative to one training epoch.

Measured side by side in one process, with bench_diagnostics.py's training epoch (~6.8k examples, batch 64,
embed 64, 4 heads, lengths like Rotten Tomatoes') and its probe (64 examples stratified over the lengths):
``equivalent_explanations`` on the probe, with the leave-one-out scores given (as the callback gets them from
the faithfulness callback) and, with ``--token-ranges``, every token's range too. The budget is 10% of an epoch.
Usage:

    python bench/bench_equivalence.py [--examples 6800] [--repeats 3] [--max-length 60] [--designs concat,add]
                                      [--token-ranges]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_diagnostics import VOCAB, _batch, _Clock, _lengths, train_epoch  # noqa: E402

from identifiable_transformers.diagnostics.callbacks.identifiability import select_probe_indices  # noqa: E402
from identifiable_transformers.diagnostics.callbacks.probes import doubling_strata  # noqa: E402
from identifiable_transformers.diagnostics.faithfulness import explain  # noqa: E402
from identifiable_transformers.diagnostics.faithfulness.equivalent import equivalent_explanations  # noqa: E402
from identifiable_transformers.models import TransformerClassifier  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=6800)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-length", type=int, default=60)
    p.add_argument("--median-length", type=float, default=22)
    p.add_argument("--designs", default="concat,add")
    p.add_argument("--token-ranges", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    lengths = _lengths(args.examples, rng, args.median_length, args.max_length)
    idx = select_probe_indices(lengths, 64, 0, args.max_length, strata=doubling_strata(args.max_length))
    ids, mask = _batch(lengths[idx], rng, "cpu")
    ids[:, 0] = 2  # <cls>
    rationale = torch.zeros_like(mask)
    rationale[:, 1:3] = True
    print(f"probe: {len(idx)} examples, lengths {int(lengths[idx].min())}-{int(lengths[idx].max())}; "
          f"epoch: {args.examples} examples; wall / process-CPU seconds, median of {args.repeats}")
    print(f"{'design':8} {'epoch_s':>15} {'ranges_s':>15} {'ranges/epoch':>13} {'free rows':>10}")
    for combine in args.designs.split(","):
        model = TransformerClassifier(VOCAB, 2, embed_dim=64, num_heads=4, head_combine=combine,
                                      max_len=args.max_length)
        epochs = [train_epoch(model, lengths, rng, "cpu") for _ in range(args.repeats)]
        loo = explain(model.eval(), ids, mask, ["loo"])["loo"]
        runs, rep = [], None
        for _ in range(args.repeats):
            with _Clock() as c:
                rep = equivalent_explanations(model, ids, mask, rationale_mask=rationale, loo=loo,
                                              token_ranges=args.token_ranges)
            runs.append((c.wall, c.cpu))
        e, r = np.median(epochs, 0), np.median(runs, 0)
        free = float((rep["free_dim"] > 0).double().mean())
        print(f"{combine:8} {e[0]:7.2f} /{e[1]:6.2f} {r[0]:7.2f} /{r[1]:6.2f} {r[0] / e[0]:12.1%} {free:10.2f}")


if __name__ == "__main__":
    main()

"""Data-layer benchmark (a script, not a test).

1. Generates N AG-News-sized documents (default 120,000; ~45 words each on average, words
   drawn Zipf-like from a fixed 30,000-word vocabulary with a seeded RNG, 4 classes) and
   writes them to a local CSV (not timed).
2. Times ``TextDataModule(source="local").prepare_data()`` — the same code path as real data:
   read + normalise + stratified split + tokenizer training + ``datasets.map`` tokenization +
   ``save_to_disk`` cache — with a fresh cache each repeat, and ``setup()`` (cache load).
3. Times the collation of one training batch (batch 64: row fetch + ``dm.collate``) and, for
   scale, one forward+backward+SGD step of a small stand-in model of this script's own
   (embedding + one nn.TransformerEncoderLayer, d=256, 4 heads, ff=1024 + linear head) on the
   same batch, and reports collation as a share of that step.

Usage: python bench/bench_data.py [--docs 120000] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def make_corpus(n_docs: int, seed: int = 0, vocab: int = 30_000, mean_words: int = 45) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(vocab)])
    p = 1.0 / np.arange(1, vocab + 1) ** 1.07
    p /= p.sum()
    lengths = np.clip(rng.normal(mean_words, 12, size=n_docs).round().astype(int), 8, 120)
    flat = rng.choice(vocab, size=int(lengths.sum()), p=p)
    labels = rng.integers(0, 4, size=n_docs)
    docs, pos = [], 0
    for n in lengths:
        docs.append(" ".join(words[flat[pos : pos + n]]) + " .")
        pos += n
    return docs, labels


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (datasets.map workers)."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=120_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()

    import pandas as pd
    import torch
    from torch import nn

    from identifiable_transformers.data import TextDataModule

    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {platform.machine()} {os.cpu_count()} CPU cores visible, torch threads {torch.get_num_threads()}, "
          f"python {platform.python_version()}, torch {torch.__version__}")

    t = time.perf_counter()
    docs, labels = make_corpus(args.docs)
    nwords = sum(d.count(" ") for d in docs)
    print(f"corpus: {len(docs):,} docs, mean {nwords / len(docs):.1f} words/doc "
          f"(generated in {time.perf_counter() - t:.1f}s, not timed)")

    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "train.csv"
        pd.DataFrame({"text": docs, "label": labels}).to_csv(csv, index=False)
        del docs

        def make_dm(cache: str) -> TextDataModule:
            return TextDataModule(name="bench", source="local", train_file=str(csv), val_fraction=0.05,
                                  test_fraction=0.05, max_length=128, vocab_size=20_000, min_frequency=2,
                                  batch_size=64, cache_dir=cache)

        totals, phases, cpus = [], [], []
        for r in range(args.repeats):
            dm = make_dm(str(Path(tmp) / f"cache{r}"))
            load0 = os.getloadavg()[0]
            c0 = _cpu()
            t = time.perf_counter()
            dm.prepare_data()
            totals.append(time.perf_counter() - t)
            cpus.append(_cpu() - c0)
            phases.append(dict(dm.timings))
            print(f"  run {r + 1}: prepare_data {totals[-1]:.2f}s wall, {cpus[-1]:.1f} CPU-s (incl. worker processes), "
                  f"load avg before {load0:.1f}; " +
                  " ".join(f"{k}={v:.2f}" for k, v in dm.timings.items() if k != "total"))
        med = statistics.median(totals)
        print(f"prepare_data (read+split+train tokenizer+tokenize+cache), median of {args.repeats}: "
              f"{med:.2f}s = {args.docs / med:,.0f} docs/s; median CPU {statistics.median(cpus):.1f} CPU-s")
        for k in phases[0]:
            if k != "total":
                print(f"  phase {k:16s} median {statistics.median(p[k] for p in phases):.2f}s")

        t = time.perf_counter()
        dm = make_dm(str(Path(tmp) / "cache0"))
        dm.prepare_data()
        dm.setup("fit")
        print(f"cached re-run (prepare_data + setup from cache): {time.perf_counter() - t:.2f}s; "
              f"vocab {dm.vocab_size}, train rows {len(dm.train_dataset):,}")

        ds = dm.train_dataset
        rng = np.random.default_rng(0)
        idx_batches = [rng.choice(len(ds), 64, replace=False).tolist() for _ in range(200)]
        fetch_collate, collate_only = [], []
        for idx in idx_batches:
            t0 = time.perf_counter()
            rows = ds.__getitems__(idx)
            t1 = time.perf_counter()
            batch = dm.collate(rows)
            t2 = time.perf_counter()
            fetch_collate.append(t2 - t0)
            collate_only.append(t2 - t1)
        fc, co = statistics.median(fetch_collate) * 1e3, statistics.median(collate_only) * 1e3

        class Stand_in(nn.Module):  # not the paper's model; a small transformer of the same scale
            def __init__(self, vocab: int, d: int = 256):
                super().__init__()
                self.emb = nn.Embedding(vocab, d, padding_idx=0)
                self.enc = nn.TransformerEncoderLayer(d, 4, 1024, dropout=0.1, batch_first=True)
                self.head = nn.Linear(d, 4)

            def forward(self, ids, mask):
                h = self.enc(self.emb(ids), src_key_padding_mask=~mask)
                return self.head(h[:, 0])

        model = Stand_in(dm.vocab_size)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        lossf = nn.CrossEntropyLoss()
        step_times = []
        for i in range(args.steps + 3):
            b = dm.collate(ds.__getitems__(idx_batches[i % len(idx_batches)]))
            t0 = time.perf_counter()
            loss = lossf(model(b["input_ids"], b["attention_mask"]), b["labels"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= 3:
                step_times.append(time.perf_counter() - t0)
        st = statistics.median(step_times) * 1e3
        print(f"batch 64 (T = longest in each batch, e.g. {batch['input_ids'].shape[1]}): row fetch + collate "
              f"{fc:.2f} ms, collate alone {co:.2f} ms (median of 200)")
        print(f"stand-in step (emb + TransformerEncoderLayer d=256 4 heads ff=1024 + linear; forward+backward+SGD, "
              f"CPU): {st:.1f} ms (median of {args.steps})")
        print(f"collation share of a step: fetch+collate {100 * fc / (fc + st):.1f}%, collate alone "
              f"{100 * co / (co + st):.1f}% (with num_workers>0 it overlaps the step entirely)")


if __name__ == "__main__":
    main()

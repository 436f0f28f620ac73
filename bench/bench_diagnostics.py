"""Overhead of the per-epoch identifiability diagnostics relative to one training epoch.

Measured side by side in one process, on the same CPU/GPU:
  * one training epoch: ~6.8k examples (Rotten Tomatoes train size), batch 64, dynamic padding,
    forward + backward + AdamW step, embed 64, 4 heads;
  * one diagnostics pass of IdentifiabilityCallback: 64 probe examples stratified over lengths
    5-60 (the Rotten Tomatoes range), ``attention_identifiability`` (on ``--device``);
  * the callback's figures (null dims vs length + 3 heatmap figures, their maps computed for those 3
    examples, as the callback does), drawn synchronously, and
    drawn in the plot thread while a training epoch runs (the callback's default);
  * one pass of FaithfulnessCallback on the same probes: every cheap explainer, the random control's
    10 draws, the erasure metrics, tau with leave-one-out, the uniform-attention gap and the plausibility
    metrics against a synthetic rationale (a seeded 20% of each probe's real tokens, at least one);
  * its end-of-fit tier once (integrated gradients, adversarial attention on 8 probes).
Lengths are synthetic (a clipped log-normal with the Rotten Tomatoes median ~22 tokens, at most 60) so the
benchmark needs no data download. The probe is drawn as the callback draws it: stratified by length up to
``--max-length`` (doubling strata). ``--max-length 512 --median-length 230`` models IMDb at the paper's length;
there the faithfulness pass is also timed on the probe's part up to 2d + 2 = 130 tokens (the callback's
``max_length="2d+2"``: the 'faith130' columns). Usage:

    python bench/bench_diagnostics.py [--examples 6800] [--repeats 3] [--device cpu|cuda] [--no-final]
                                      [--max-length 60] [--median-length 22] [--designs concat,add] [--memory]

``--memory`` measures only the peak memory of one faithfulness pass per design (each in a fresh process).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from identifiable_transformers.diagnostics import attention_identifiability
from identifiable_transformers.diagnostics.callbacks.identifiability import _render, select_probe_indices
from identifiable_transformers.diagnostics.callbacks.probes import doubling_strata
from identifiable_transformers.diagnostics.faithfulness import (
    CHEAP_EXPLAINERS,
    adversarial_attention,
    faithfulness_report,
    integrated_gradients,
)
from identifiable_transformers.models import TransformerClassifier

VOCAB = 20_000


def _lengths(n: int, rng: np.random.Generator, median: float = 22, max_length: int = 60,
             sigma: float = 0.45) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), 5, max_length).astype(int)


def _batch(lengths, rng, device):
    ids = torch.zeros(len(lengths), int(max(lengths)), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.from_numpy(rng.integers(1, VOCAB, n))
    return ids.to(device), (ids != 0).to(device)


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class _Clock:
    """Wall and process-CPU seconds: on a shared machine the CPU time is the steadier figure."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def train_epoch(model, lengths, rng, device, batch_size=64) -> tuple[float, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    order = rng.permutation(len(lengths))
    batches = [_batch(lengths[order[i : i + batch_size]], rng, device) for i in range(0, len(order), batch_size)]
    labels = [torch.randint(0, 2, (b[0].shape[0],), device=device) for b in batches]
    model.train()
    _sync(device)
    with _Clock() as c:
        for (ids, mask), y in zip(batches, labels):
            loss = F.cross_entropy(model(ids, mask).logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        _sync(device)
    return c.wall, c.cpu


def diagnostics_pass(model, ids, mask) -> tuple[tuple[float, float], dict]:
    """What the callback computes each epoch: the report (the maps of the drawn examples come with the plots)."""
    _sync(str(ids.device))
    with _Clock() as c:
        rep = attention_identifiability(model, ids, mask, device=ids.device)
    return (c.wall, c.cpu), rep


def faithfulness_pass(model, ids, mask, labels, rationale) -> tuple[float, float]:
    """What FaithfulnessCallback computes each epoch (on data with rationales: plausibility included)."""
    _sync(str(ids.device))
    with _Clock() as c:
        faithfulness_report(model, ids, mask, labels, explainers=CHEAP_EXPLAINERS, rationale_mask=rationale)
        _sync(str(ids.device))
    return c.wall, c.cpu


def faithfulness_final(model, ids, mask) -> tuple[float, float]:
    """FaithfulnessCallback's end-of-fit tier with its defaults (32 IG steps; 8 examples, 300 steps, 4 restarts)."""
    _sync(str(ids.device))
    with _Clock() as c:
        integrated_gradients(model, ids, mask, n_steps=32)
        sel = torch.tensor(sorted({int(round(q)) for q in np.linspace(0, ids.shape[0] - 1, 8)}), device=ids.device)
        adversarial_attention(model, ids[sel], mask[sel], steps=300, restarts=4)
        _sync(str(ids.device))
    return c.wall, c.cpu


def plot_job(model, rep, out_dir: Path, ids, mask) -> dict:
    """The callback's render job: the null-dim plot and 3 heatmap figures (num_plot_examples=3) of probes up to
    2d + 2 tokens, spread over the upper three quarters of them; their maps are computed here, as the callback does."""
    shown = int((rep["lengths"] <= 2 * model.embed_dim + 2).sum())
    positions = sorted({int(round(q * (shown - 1))) for q in np.linspace(0.25, 1.0, 3)})
    rows = torch.tensor(positions)
    width = int(mask[rows].sum(1).max())
    maps = attention_identifiability(model, ids[rows, :width], mask[rows, :width], return_maps=True, device=ids.device)
    examples = []
    for j, pos in enumerate(positions):
        n = int(maps["lengths"][j])
        m = maps["maps"][j]
        examples.append({"index": pos, "n": n, "tokens": [f"t{i}" for i in range(n)],
                         **{k: m[k].numpy() for k in ("attention", "effective", "alternative")},
                         **{k: maps[k][j].numpy() for k in ("alt_attention_tv", "witness_rel_error", "null_dim",
                                                            "stochastic_null_dim")}})
    return {"out": out_dir, "epoch": 0, "step": 0, "lengths": rep["lengths"].numpy(),
            "null_dim": rep["null_dim"].numpy(), "stochastic_null_dim": rep["stochastic_null_dim"].numpy(),
            "model": dict(embed_dim=model.embed_dim, num_heads=model.num_heads, value_dim=model.value_dim,
                          head_combine=model.head_combine), "examples": examples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=6800)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-final", action="store_true", help="skip the (slow) end-of-fit faithfulness tier")
    p.add_argument("--max-length", type=int, default=60, help="longest example (tokens); the probe spans up to it")
    p.add_argument("--median-length", type=float, default=22)
    p.add_argument("--designs", default="concat,add")
    p.add_argument("--memory", action="store_true",
                   help="only the peak memory of one faithfulness pass per design, each in a fresh process")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    sigma = 0.45 if args.max_length <= 60 else 0.8  # IMDb-like lengths spread wider
    train_lengths = _lengths(args.examples, rng, args.median_length, args.max_length, sigma)
    val_lengths = _lengths(2000, rng, args.median_length, args.max_length, sigma)
    probe = select_probe_indices(val_lengths, 64, seed=0, max_length=args.max_length,
                                 strata=doubling_strata(args.max_length))
    short = int((val_lengths[probe] <= 130).sum())  # the probe is sorted by length: its first `short` examples
    ids, mask = _batch(val_lengths[probe], rng, args.device)
    ids[:, 0] = 2  # <cls> first, as the data module writes it
    labels = torch.randint(0, 2, (ids.shape[0],), device=args.device)
    rationale = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.2).to(args.device) & mask
    rationale[:, 0] = False
    rationale[:, 1] = True  # at least one token per example
    print(f"device={args.device} threads={torch.get_num_threads()} train examples={args.examples} "
          f"(mean length {train_lengths.mean():.1f}); probe 64 examples, lengths {val_lengths[probe].min()}-"
          f"{val_lengths[probe].max()}")

    def memory(combine: str) -> str:
        """Peak resident memory of one faithfulness pass on the whole probe: this process's high-water mark
        (ru_maxrss) after the pass, minus the resident memory before it (model, probe and libraries)."""
        torch.manual_seed(0)
        model = TransformerClassifier(VOCAB, 2, embed_dim=64, num_heads=4, head_combine=combine).to(args.device)
        before = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        wall, cpu = faithfulness_pass(model, ids, mask, labels, rationale)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return f"{combine:<8}{peak:>10.0f}{peak - before:>14.0f}{wall:>8.1f}{cpu:>8.1f}"

    if args.memory:
        if args.designs.count(",") == 0:
            print(f"{'heads':<8}{'peak MB':>10}{'pass peak MB':>14}{'wall s':>8}{'cpu s':>8}")
            print(memory(args.designs))
            return
        for i, combine in enumerate(args.designs.split(",")):  # a fresh process each: ru_maxrss only grows
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--designs", combine],
                                 capture_output=True, text=True, check=True).stdout.splitlines()
            print("\n".join(out[-2:] if i == 0 else out[-1:]))
        return
    print("wall s (process CPU s). 'plots' = the 4 PNGs drawn synchronously; 'async' = extra wall time of a "
          "training epoch that runs while the plot thread draws them (the callback's default)")
    print("'faith' = FaithfulnessCallback's per-epoch pass (cheap explainers, 10 random draws, metrics, plausibility); "
          "'final' = its end-of-fit tier (once per fit)")
    long = short < len(probe)
    if long:
        print(f"'faith130' = the faithfulness pass on the {short} probes of at most 130 tokens (max_length=\"2d+2\")")
    print(f"{'heads':<8}{'epoch':>15}{'diagnostics':>15}{'plots':>15}{'async':>8}{'diag/epoch':>12}"
          f"{'diag+async':>12}{'diag+plots':>12}{'faith':>15}{'faith/epoch':>12}{'final':>15}{'final/epoch':>12}"
          + (f"{'faith130':>15}{'faith130/epoch':>15}" if long else ""))

    def med(f):
        runs = [f() for _ in range(args.repeats)]
        return float(np.median([r[0] for r in runs])), float(np.median([r[1] for r in runs]))

    def fmt(x):
        return f"{x[0]:.2f} ({x[1]:.2f})"

    pool = ThreadPoolExecutor(max_workers=1)

    def one(combine: str) -> str:  # a function, so the timed lambdas bind this design's model
        torch.manual_seed(0)
        model = TransformerClassifier(VOCAB, 2, embed_dim=64, num_heads=4, head_combine=combine).to(args.device)
        train_epoch(model, train_lengths[:640], rng, args.device)  # warm-up
        epoch = med(lambda: train_epoch(model, train_lengths, rng, args.device))
        diagnostics_pass(model, ids, mask)  # warm-up
        diag = med(lambda: diagnostics_pass(model, ids, mask)[0])
        rep = diagnostics_pass(model, ids, mask)[1]
        with tempfile.TemporaryDirectory() as tmp:
            def sync_plots():
                with _Clock() as c:
                    _render(plot_job(model, rep, Path(tmp), ids, mask))
                return c.wall, c.cpu

            def epoch_with_async_plots():
                with _Clock() as c:
                    fut = pool.submit(_render, plot_job(model, rep, Path(tmp), ids, mask))
                    train_epoch(model, train_lengths, rng, args.device)
                    fut.result()
                return c.wall, c.cpu

            plots = med(sync_plots)
            async_extra = med(epoch_with_async_plots)[0] - epoch[0]
        faithfulness_pass(model, ids, mask, labels, rationale)  # warm-up
        faith = med(lambda: faithfulness_pass(model, ids, mask, labels, rationale))
        final = (math.nan, math.nan) if args.no_final else med(lambda: faithfulness_final(model, ids, mask))
        r = lambda x: f"{x / epoch[0]:.1%}"  # noqa: E731
        line = (f"{combine:<8}{fmt(epoch):>15}{fmt(diag):>15}{fmt(plots):>15}{async_extra:8.2f}{r(diag[0]):>12}"
                f"{r(diag[0] + max(async_extra, 0.0)):>12}{r(diag[0] + plots[0]):>12}{fmt(faith):>15}"
                f"{r(faith[0]):>12}{fmt(final):>15}{r(final[0]):>12}")
        if long:
            width = int(mask[:short].sum(1).max())
            sub = (ids[:short, :width], mask[:short, :width], labels[:short], rationale[:short, :width])
            faith130 = med(lambda: faithfulness_pass(model, *sub))
            line += f"{fmt(faith130):>15}{r(faith130[0]):>15}"
        return line

    for combine in args.designs.split(","):
        print(one(combine))


if __name__ == "__main__":
    main()

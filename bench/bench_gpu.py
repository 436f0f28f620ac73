"""GPU throughput, side by side in one run (issue 29; docs/performance.md, "GPU").

1. sync check: a training step of both designs (padding and dropout on, metrics and logging included, clipping,
   fused AdamW) under ``torch.cuda.set_sync_debug_mode("error")`` (on the CPU: ``forbid_host_sync``, which
   refuses every tensor-to-Python conversion), eager and with ``model.cuda_graphs``; exits 1 if one syncs.
2. steps: one training step (forward, cross-entropy, backward, clipping, fused AdamW) of the identifiable encoder
   (``add``, key 2), the baseline (``concat``) and torch's ``nn.TransformerEncoderLayer`` with the same sizes
   (d 64, 4 heads, ffn 256, dropout 0.1, one layer), in tokens/s (batch x length / step time), fp32 and bf16
   autocast, eager and graphed (``torch.compile(mode="reduce-overhead")``, as ``model.cuda_graphs`` does);
   median of ``--repeats`` rounds of ``--steps`` steps, CUDA events, interleaved.
3. epoch: an end-to-end training epoch of ``data=imdb_offline`` (diagnostics off) through Lightning: today's
   DataLoader path against ``data.on_device=true data.static_shapes=true model.cuda_graphs=true``.
4. diagnostics: the time spent in the identifiability and faithfulness callbacks (their defaults) per epoch,
   as a share of the training epoch, and their end-of-fit tier.
5. packed sweep: ``--sweep-jobs`` short ``train.py`` jobs one after another against
   ``hydra/launcher=gpu_packed trainer=gpu_packed`` (jobs per minute).

    python bench/bench_gpu.py                    # on a CUDA GPU: every section (about 10 minutes on one H200)
    python bench/bench_gpu.py --cpu              # a small smoke run of every section but the sweep, on the CPU
    python bench/bench_gpu.py --sections steps,sync --repeats 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from identifiable_transformers.modules import classifier as lit_module
from identifiable_transformers.modules.classifier import TextClassifier
from identifiable_transformers.modules.sync_check import ForbidHostSync, HostSyncError

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("sync", "steps", "epoch", "diagnostics", "sweep")
GRAPHED = dict(lit_module._GRAPH_COMPILE)


class TorchLayerClassifier(nn.Module):
    """torch's encoder layer with this project's embedding, positions and <cls> head, at the same sizes."""

    def __init__(self, vocab: int, classes: int, d: int, heads: int, ffn: int, max_len: int, dropout: float):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d, padding_idx=0), nn.Embedding(max_len, d)
        self.layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout, batch_first=True)
        self.drop, self.head = nn.Dropout(dropout), nn.Linear(d, classes)

    def forward_loss(self, ids, mask, labels):
        x = self.drop(self.tokens(ids) + self.positions.weight[: ids.shape[1]])
        logits = self.head(self.layer(x, src_key_padding_mask=~mask)[:, 0])
        return F.cross_entropy(logits, labels), logits


def batch(b: int, t: int, vocab: int, classes: int, device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(2, t // 4), t + 1, (b,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    ids = torch.randint(5, vocab, (b, t), generator=g).masked_fill(~mask, 0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "labels": torch.randint(0, classes, (b,), generator=g).to(device)}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ 1. sync check
def sync_check(args, device) -> int:
    how = 'torch.cuda.set_sync_debug_mode("error")' if device.type == "cuda" else "forbid_host_sync (CPU)"
    print(f"\n== 1. no host synchronisation in a training step ({how})")
    failed = 0
    for combine, key in (("concat", None), ("add", 2)):
        for graphs in (False, True) if device.type == "cuda" else (False,):
            torch.manual_seed(0)
            model = TextClassifier(2000, 3, key_dim=key, head_combine=combine, dropout=0.1, max_len=64,
                                   cuda_graphs=graphs, label_smoothing=0.1, scheduler="linear", warmup_steps=2)
            data = [batch(16, 64, 2000, 3, device, seed=i) for i in range(8)]
            for b in data[-2:]:
                b["labels"][-3:] = -100  # padding rows of a filled batch
            check = ForbidHostSync(skip=3)  # the first steps compile and capture
            trainer = pl.Trainer(accelerator=device.type, devices=1, max_epochs=1, gradient_clip_val=1.0,
                                 precision="bf16-mixed" if device.type == "cuda" else "32-true", logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                 default_root_dir=args.tmp, callbacks=[check])
            label = f"{combine:6s} {'graphed' if graphs else 'eager'}"
            try:
                trainer.fit(model, DataLoader(data, batch_size=None))
                ok = check.steps == len(data) - 3
                print(f"  {'PASS' if ok else 'FAIL'} {label}: {check.steps} steps without a sync")
            except (HostSyncError, RuntimeError) as err:
                ok = False
                print(f"  FAIL {label}: {str(err).splitlines()[0][:200]}")
            failed += not ok
    return failed


# ------------------------------------------------------------------------------------------------------ 2. steps
def _step_fn(kind: str, b: dict, device, bf16: bool, graphed: bool, vocab: int, classes: int, t: int):
    torch.manual_seed(0)
    if kind == "torch_layer":
        model = TorchLayerClassifier(vocab, classes, 64, 4, 256, t, 0.1).to(device).train()
        forward_loss = model.forward_loss
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    else:
        combine, key = ("add", 2) if kind == "identifiable" else ("concat", None)
        lit = TextClassifier(vocab, classes, key_dim=key, head_combine=combine, dropout=0.1, max_len=t)
        model = lit.to(device).train()
        opt = lit.configure_optimizers()
        forward_loss = lambda ids, mask, labels: lit._forward_loss(ids, mask, labels, 0.0)  # noqa: E731
    params = [p for p in model.parameters() if p.requires_grad]
    fl = torch.compile(forward_loss, **GRAPHED) if graphed else forward_loss

    def step():
        if graphed:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = fl(b["input_ids"], b["attention_mask"], b["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _rate(tokens_per_s: float) -> str:
    if tokens_per_s != tokens_per_s:
        return "failed"
    return f"{tokens_per_s / 1e6:.2f} M/s" if tokens_per_s >= 1e6 else f"{tokens_per_s / 1e3:.2f} k/s"


def _time(step, steps: int, device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def steps_table(args, device) -> None:
    print(f"\n== 2. training step at equal shapes (d 64, 4 heads, ffn 256, dropout 0.1; tokens/s = batch x length "
          f"/ step; median of {args.repeats} x {args.steps} steps, interleaved)")
    kinds = ("identifiable", "baseline", "torch_layer")
    modes = [(bf16, graphed) for bf16 in (False, True) for graphed in ((False, True) if device.type == "cuda"
                                                                         else (False,))]
    vocab, classes = 20000, 2
    # Every graphed candidate compiles the same code (_forward_loss, the lambda) for another module: above dynamo's
    # recompile limit (8) it would silently run eagerly.
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    for b_size, t in args.shapes:
        torch._dynamo.reset()
        b = batch(b_size, t, vocab, classes, device)
        cands = {}
        for kind in kinds:
            for bf16, graphed in modes:
                try:
                    step = _step_fn(kind, b, device, bf16, graphed, vocab, classes, t)
                    for _ in range(args.warmup + (3 if graphed else 0)):
                        step()
                    _sync(device)
                    cands[(kind, bf16, graphed)] = (step, [])
                except Exception as err:  # a candidate that cannot run is reported, the others still measured
                    print(f"  {kind} {'bf16' if bf16 else 'fp32'} {'graphed' if graphed else 'eager'} failed: "
                          f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
        names = list(cands)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                step, times = cands[name]
                times.append(_time(step, args.steps, device))
        print(f"\n  batch {b_size} x {t} tokens{'':8s}" + "".join(
            f"{('bf16' if bf16 else 'fp32') + (' graphed' if graphed else ' eager'):>18s}" for bf16, graphed in modes))
        rate = {k: b_size * t / statistics.median(v[1]) for k, v in cands.items()}
        nan = float("nan")
        for kind in kinds:
            print(f"  {kind:<28s}" + "".join(f"{_rate(rate.get((kind, bf16, g), nan)):>18s}" for bf16, g in modes))
        for kind in kinds[:2]:
            print(f"  {kind + ' / torch_layer':<28s}" + "".join(
                f"{rate.get((kind, bf16, g), nan) / rate.get(('torch_layer', bf16, g), nan):>17.2f}x"
                for bf16, g in modes))
        for kind in kinds[:2]:
            for g in sorted({g for _, g in modes}):
                print(f"  {kind} bf16 / fp32 ({'graphed' if g else 'eager'}): "
                      f"{rate.get((kind, True, g), nan) / rate.get((kind, False, g), nan):.2f}x")
        del cands


# ---------------------------------------------------------------------------------------- 3. and 4. Lightning runs
class _EpochClock(pl.Callback):
    """Wall time of each training epoch's steps (from its start to its last batch's end, device synchronised):
    the validation and the diagnostics that follow are not in it."""

    def __init__(self):
        self.train_s: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module):
        _sync(pl_module.device)
        self._t0 = time.perf_counter()
        self.train_s.append(0.0)

    def on_train_batch_end(self, trainer, pl_module, *args):
        _sync(pl_module.device)
        self.train_s[-1] = time.perf_counter() - self._t0


def _timed_hooks(callbacks: list, device) -> dict:
    """Wrap the diagnostics callbacks' epoch hooks with timers: seconds per epoch and at the end of fit."""
    spent = {"epochs": {}, "fit_end": 0.0}
    for cb in callbacks:
        for hook in ("on_validation_epoch_end", "on_train_epoch_end", "on_validation_end", "on_fit_end"):
            original = getattr(cb, hook)

            def timed(trainer, pl_module, *a, _original=original, _hook=hook, **kw):
                _sync(device)
                t0 = time.perf_counter()
                out = _original(trainer, pl_module, *a, **kw)
                _sync(device)
                dt = time.perf_counter() - t0
                if _hook == "on_fit_end":
                    spent["fit_end"] += dt
                else:
                    spent["epochs"][trainer.current_epoch] = spent["epochs"].get(trainer.current_epoch, 0.0) + dt
                return out
            setattr(cb, hook, timed)
    return spent


def _compose(args, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    os.environ.setdefault("PROJECT_ROOT", str(ROOT))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides)


def fit_once(args, device, overrides: list[str], diagnostics: bool, epochs: int):
    import hydra
    from omegaconf import OmegaConf, open_dict

    cfg = _compose(args, [f"data={args.data}", f"trainer={'gpu' if device.type == 'cuda' else 'cpu'}",
                          f"trainer.max_epochs={epochs}", *args.data_overrides, *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = cfg.paths.log_dir = args.tmp
        if args.cache_dir:
            cfg.paths.cache_dir = args.cache_dir
    pl.seed_everything(0)
    dm = hydra.utils.instantiate(cfg.data, _convert_="all")
    dm.prepare_data(), dm.setup("fit")
    kwargs = OmegaConf.to_container(cfg.model, resolve=True)
    kwargs.pop("_target_")
    model = TextClassifier(**kwargs, vocab_size=dm.vocab_size, num_classes=dm.num_classes, pad_id=dm.pad_id)
    clock, callbacks = _EpochClock(), []
    if diagnostics:
        for name in ("identifiability", "faithfulness"):
            node = cfg.callbacks[name]
            with open_dict(node):
                node.output_dir = str(Path(args.tmp) / "ident")
            callbacks.append(hydra.utils.instantiate(node, _convert_="all"))
    spent = _timed_hooks(callbacks, device)
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=[clock, *callbacks], logger=False,
                                      enable_checkpointing=False, enable_progress_bar=False,
                                      enable_model_summary=False, default_root_dir=args.tmp)
    trainer.fit(model, datamodule=dm)
    return clock.train_s, spent, len(dm.train_dataset)


FAST_PATH = ["data.on_device=true", "data.static_shapes=true", "model.cuda_graphs=true"]


def epoch_table(args, device) -> None:
    print(f"\n== 3. end-to-end training epoch, data={args.data}, diagnostics off (median of the epochs after the "
          f"first, of {args.epochs})")
    variants = {"DataLoader, eager": []}
    if device.type == "cuda":
        variants["on_device + static_shapes + cuda_graphs"] = FAST_PATH
        variants["on_device + static_shapes, eager"] = FAST_PATH[:2]
    for name, overrides in variants.items():
        train_s, _, n = fit_once(args, device, overrides, diagnostics=False, epochs=args.epochs)
        warm = train_s[1:] or train_s
        print(f"  {name:<42s} epoch {statistics.median(warm):7.2f} s  ({n / statistics.median(warm):,.0f} examples/s;"
              f" first epoch {train_s[0]:.2f} s)")


def diagnostics_table(args, device) -> None:
    print(f"\n== 4. diagnostics (identifiability + faithfulness callbacks, their defaults), data={args.data}")
    overrides = FAST_PATH if device.type == "cuda" else []
    train_s, spent, _ = fit_once(args, device, overrides, diagnostics=True, epochs=args.epochs)
    for epoch, s in sorted(spent["epochs"].items()):
        print(f"  epoch {epoch}: diagnostics {s:6.2f} s = {100 * s / train_s[epoch]:5.1f}% of its training epoch "
              f"({train_s[epoch]:.2f} s)   goal <= 10%")
    warm = train_s[1:] or train_s
    print(f"  end of fit: {spent['fit_end']:.2f} s = {spent['fit_end'] / statistics.median(warm):.2f} epochs"
          "   goal <= 1 epoch")


# ------------------------------------------------------------------------------------------------- 5. packed sweep
def sweep_table(args, device) -> None:
    print(f"\n== 5. packed sweep: {args.sweep_jobs} jobs of data=rt_offline, {args.sweep_epochs} epochs, diagnostics "
          "off")
    if device.type != "cuda" and not args.sweep_on_cpu:
        print("  skipped on the CPU (--sweep-on-cpu runs it with trainer=cpu, one job at a time against 2 at once)")
        return
    base = [sys.executable, str(ROOT / "train.py"), "-m", "data=rt_offline", f"trainer.max_epochs={args.sweep_epochs}",
            "callbacks=none", "logger=none", "test=false", "trainer.enable_progress_bar=false",
            f"seed={','.join(str(i) for i in range(1, args.sweep_jobs + 1))}"]
    if device.type == "cuda":
        runs = {"one after another": ["hydra/launcher=basic", "trainer=gpu"],
                f"gpu_packed, {args.jobs_per_gpu} per GPU": ["hydra/launcher=gpu_packed", "trainer=gpu_packed",
                                                           f"jobs_per_gpu={args.jobs_per_gpu}"]}
    else:
        runs = {"one after another": ["hydra/launcher=basic", "trainer=cpu"],
                "joblib, 2 at once": ["hydra/launcher=joblib_local", "trainer=cpu", "hydra.launcher.n_jobs=2"]}
    took = {}
    for name, extra in runs.items():
        out = Path(args.tmp) / f"sweep_{len(took)}"
        t0 = time.perf_counter()
        proc = subprocess.run([*base, *extra, f"hydra.sweep.dir={out}"], cwd=args.tmp, capture_output=True, text=True)
        took[name] = time.perf_counter() - t0
        status = "ok" if proc.returncode == 0 else f"FAILED ({proc.stderr.strip().splitlines()[-1:]})"
        print(f"  {name:<28s} {took[name]:7.1f} s  {60 * args.sweep_jobs / took[name]:6.1f} jobs/min  {status}")
    first, *rest = took.values()
    for name, s in list(took.items())[1:]:
        print(f"  {name} vs one after another: {first / s:.2f}x the throughput")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="a small smoke run on the CPU")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)}")
    ap.add_argument("--shapes", default=None, help="BxT,... (default 64x256,256x256,64x512; --cpu 8x32)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; --cpu 1)")
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default 20; --cpu 1)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--data", default=None, help="dataset of sections 3-4 (default imdb_offline; --cpu rt_offline)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs of sections 3-4 (default 3; --cpu 1)")
    ap.add_argument("--cache-dir", default=None, help="tokenization cache (default: the project's)")
    ap.add_argument("--sweep-jobs", type=int, default=16)
    ap.add_argument("--sweep-epochs", type=int, default=3)
    ap.add_argument("--jobs-per-gpu", type=int, default=4)
    ap.add_argument("--sweep-on-cpu", action="store_true")
    args = ap.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        print(f"Error: unknown sections {sorted(unknown)}: pick from {','.join(SECTIONS)}", file=sys.stderr)
        return 1
    if args.cpu:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("Error: no CUDA GPU: run with --cpu for the smoke version", file=sys.stderr)
        return 1
    small = args.cpu
    args.shapes = [tuple(int(x) for x in s.split("x")) for s in (args.shapes or ("8x32" if small else
                                                                              "64x256,256x256,64x512")).split(",")]
    args.repeats = args.repeats or (1 if small else 5)
    args.steps = args.steps or (1 if small else 20)
    args.warmup = 1 if small else args.warmup
    args.data = args.data or ("rt_offline" if small else "imdb_offline")
    args.epochs = args.epochs or (1 if small else 3)
    args.data_overrides = (["data.limit_train_examples=128", "data.max_length=48", "data.batch_size=32",
                            "trainer.limit_val_batches=1",
                            "model.embed_dim=16", "model.ffn_dim=32", "callbacks.identifiability.probe_size=8",
                            "callbacks.identifiability.key_aware_examples=0", "callbacks.identifiability.plots=false",
                            "callbacks.faithfulness.final=false", "callbacks.faithfulness.random_draws=1"]
                           if small else [])
    if small:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"{name} | torch {torch.__version__} | lightning {pl.__version__} | "
          f"{'CUDA ' + str(torch.version.cuda) if device.type == 'cuda' else 'CPU, smoke run'}")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        if "sync" in sections:
            failed += sync_check(args, device)
        if "steps" in sections:
            steps_table(args, device)
        if "epoch" in sections:
            epoch_table(args, device)
        if "diagnostics" in sections:
            diagnostics_table(args, device)
        if "sweep" in sections:
            sweep_table(args, device)
    print(f"\nsync check: {'all passed' if not failed else f'{failed} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

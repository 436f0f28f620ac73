"""CPU training-step throughput of TransformerClassifier (concat / add heads) vs torch.nn.TransformerEncoderLayer.

One training step = forward + cross-entropy + backward + Adam step. Throughput is counted in *real*
(non-pad) tokens per second. All timed candidates live in one process and are interleaved
round-robin over the repeats (the start of the rotation shifts each repeat), after a warm-up; the
figures reported are medians over repeats, and the ratios are medians of per-repeat (paired) ratios.

Candidates (AG-News-like shapes: batch 64, lognormal lengths, mean ~47, clipped to [5, 220]):

  concat_k16       ours, head_combine="concat", key_dim=16 (the paper's small key size), value_dim=d/h
  concat_k64       ours, concat, key_dim=d/h=64: the same shapes as torch's layer ("equal shapes")
  add_k16          ours, head_combine="add", key_dim=16, value_dim=d (per head, by design)
  torch_layer      embedding + learned positions + nn.TransformerEncoderLayer + cls pooling + head
  concat_k16_pad512, add_k16_pad512
                   the same batches padded to a fixed 512 (how the reference code feeds the model)
                   instead of to each batch's own longest example

FLOPs are counted analytically on the *padded* shapes that are actually executed (matmuls only:
Q/K/V projections, QK^T, AV, output projection, FFN, classifier head; x3 for forward + backward).

Peak memory: each candidate is re-run in a fresh subprocess; we report the growth of the process's
peak resident set size (VmHWM from /proc/self/status; ru_maxrss is inherited across exec) from just
before the first training step to after the last one. That includes activations, gradients, Adam state
and allocator workspace, for the longest batch in the set (glibc returns large blocks to the OS, so this
tracks the tensor peak closely).

    /tmp/venv/bin/python bench/bench_model.py            # full run, a few minutes on 2 cores
    /tmp/venv/bin/python bench/bench_model.py --quick    # tiny smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from identifiable_transformers.models import TransformerClassifier


# --------------------------------------------------------------------------------------------- config
@dataclass
class Shapes:
    batch: int = 64
    embed_dim: int = 256
    num_heads: int = 4
    key_dim: int = 16
    ffn_dim: int = 256
    num_layers: int = 1
    vocab: int = 20_000
    classes: int = 4
    len_mean: float = 47.0
    len_sigma: float = 0.55  # lognormal sigma: long right tail
    len_min: int = 5
    len_max: int = 220
    fixed_pad: int = 512
    dropout: float = 0.1


QUICK = Shapes(batch=8, embed_dim=32, num_heads=4, key_dim=4, ffn_dim=32, vocab=500, len_mean=12.0,
               len_min=3, len_max=40, fixed_pad=64)


def candidates(s: Shapes) -> dict[str, dict]:
    eq = s.embed_dim // s.num_heads
    return {
        f"concat_k{s.key_dim}": dict(kind="ours", combine="concat", key_dim=s.key_dim, pad="dynamic"),
        f"concat_k{eq}": dict(kind="ours", combine="concat", key_dim=eq, pad="dynamic"),
        f"add_k{s.key_dim}": dict(kind="ours", combine="add", key_dim=s.key_dim, pad="dynamic"),
        "torch_layer": dict(kind="torch", combine="concat", key_dim=eq, pad="dynamic"),
        f"concat_k{s.key_dim}_pad{s.fixed_pad}": dict(kind="ours", combine="concat", key_dim=s.key_dim, pad="fixed"),
        f"add_k{s.key_dim}_pad{s.fixed_pad}": dict(kind="ours", combine="add", key_dim=s.key_dim, pad="fixed"),
    }


# ----------------------------------------------------------------------------------------------- data
def sample_lengths(n: int, s: Shapes, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mu = math.log(s.len_mean) - s.len_sigma**2 / 2  # lognormal mean = exp(mu + sigma^2 / 2)
    raw = torch.empty(n, dtype=torch.float64).log_normal_(mu, s.len_sigma, generator=g)
    return raw.round().clamp(s.len_min, s.len_max).long()


def make_batches(num: int, s: Shapes, seed: int) -> list[dict]:
    """``num`` batches of ``s.batch`` examples; ids in [1, vocab) (0 is pad; position 0 plays <cls>)."""
    g = torch.Generator().manual_seed(seed + 1)
    lengths = sample_lengths(num * s.batch, s, seed).view(num, s.batch)
    out = []
    for lens in lengths:
        t = int(lens.max())
        ids = torch.randint(1, s.vocab, (s.batch, t), generator=g)
        mask = torch.arange(t)[None, :] < lens[:, None]
        ids = ids.masked_fill(~mask, 0)
        labels = torch.randint(0, s.classes, (s.batch,), generator=g)
        out.append(dict(ids=ids, mask=mask, labels=labels, real=int(lens.sum())))
    return out


def pad_to(batch: dict, t: int) -> dict:
    extra = t - batch["ids"].shape[1]
    return dict(ids=F.pad(batch["ids"], (0, extra), value=0), mask=F.pad(batch["mask"], (0, extra), value=False),
                labels=batch["labels"], real=batch["real"])


# --------------------------------------------------------------------------------------------- models
class TorchLayerClassifier(nn.Module):
    """The same wrapper as TransformerClassifier (embedding, learned positions, dropout, one post-norm
    ReLU layer, <cls> pooling, linear head) around torch.nn.TransformerEncoderLayer."""

    def __init__(self, s: Shapes):
        super().__init__()
        self.token_embedding = nn.Embedding(s.vocab, s.embed_dim, padding_idx=0)
        self.position_embedding = nn.Embedding(s.fixed_pad, s.embed_dim)
        self.embed_dropout = nn.Dropout(s.dropout)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(s.embed_dim, s.num_heads, s.ffn_dim, s.dropout, activation="relu",
                                       batch_first=True, norm_first=False)
            for _ in range(s.num_layers))
        self.head = nn.Linear(s.embed_dim, s.classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(ids) + self.position_embedding.weight[: ids.shape[1]]
        x = self.embed_dropout(x)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=~mask)  # torch: True = padding
        return self.head(x[:, 0])


class OursWrapper(nn.Module):
    def __init__(self, s: Shapes, combine: str, key_dim: int):
        super().__init__()
        self.m = TransformerClassifier(s.vocab, s.classes, embed_dim=s.embed_dim, num_heads=s.num_heads,
                                       key_dim=key_dim, value_dim=None, head_combine=combine,
                                       num_layers=s.num_layers, ffn_dim=s.ffn_dim, dropout=s.dropout,
                                       max_len=s.fixed_pad, positional="learned", pooling="cls", pad_id=0)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.m(ids, mask).logits


def build(spec: dict, s: Shapes, seed: int):
    torch.manual_seed(seed)
    model = TorchLayerClassifier(s) if spec["kind"] == "torch" else OursWrapper(s, spec["combine"], spec["key_dim"])
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def value_dim(spec: dict, s: Shapes) -> int:
    return s.embed_dim // s.num_heads if spec["combine"] == "concat" else s.embed_dim


def step_flops(spec: dict, s: Shapes, b: int, t: int) -> float:
    """Matmul FLOPs of one training step on a (b, t) padded batch (2 per multiply-add; x3 fwd+bwd)."""
    d, h, dk, dv, f = s.embed_dim, s.num_heads, spec["key_dim"], value_dim(spec, s), s.ffn_dim
    n = b * t
    proj = 2 * n * d * (2 * h * dk + h * dv)  # Q, K, V projections
    scores = 2 * b * h * t * t * dk  # QK^T
    av = 2 * b * h * t * t * dv  # A V
    out_in = h * dv if spec["combine"] == "concat" else dv  # add: heads summed before out-proj
    out = 2 * n * out_in * d
    ffn = 2 * n * d * f * 2
    head = 2 * b * d * s.classes
    return 3.0 * (s.num_layers * (proj + scores + av + out + ffn) + head)


def train_step(model, opt, batch) -> None:
    logits = model(batch["ids"], batch["mask"])
    loss = F.cross_entropy(logits, batch["labels"])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


# --------------------------------------------------------------------------------------------- runner
def batches_for(spec: dict, s: Shapes, dyn: list[dict], n_fixed: int) -> list[dict]:
    if spec["pad"] == "fixed":
        return [pad_to(b, s.fixed_pad) for b in dyn[:n_fixed]]
    return dyn


def peak_rss_kb() -> int:
    """This process's peak RSS in KiB. VmHWM (Linux) belongs to the current address space; ru_maxrss is
    carried across fork+exec on Linux, so a child would start from the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def mem_child(args, s: Shapes) -> None:
    torch.set_num_threads(args.threads)
    name = args.mem_child
    spec = candidates(s)[name]
    dyn = make_batches(args.steps, s, args.seed)
    # the longest batch first, so the peak is reached regardless of how many steps run
    order = sorted(range(len(dyn)), key=lambda i: -dyn[i]["ids"].shape[1])
    dyn = [dyn[i] for i in order]
    bs = batches_for(spec, s, dyn, max(1, min(2, args.steps_fixed)))[: max(1, min(3, len(dyn)))]
    model, opt = build(spec, s, args.seed)
    before = peak_rss_kb()
    for b in bs:
        train_step(model, opt, b)
    after = peak_rss_kb()
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps(dict(name=name, delta_mb=(after - before) / 1024, t=bs[0]["ids"].shape[1],
                          state_mb=3 * n_params * 4 / 2**20)))  # grads + Adam exp_avg + exp_avg_sq


def measure_memory(args, names: list[str]) -> dict[str, dict]:
    res = {}
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--mem-child", name, "--threads", str(args.threads),
               "--steps", str(args.steps), "--steps-fixed", str(args.steps_fixed), "--seed", str(args.seed)]
        if args.quick:
            cmd.append("--quick")
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"[memory] {name} failed:\n{p.stderr[-2000:]}", file=sys.stderr)
            continue
        res[name] = json.loads(p.stdout.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds over all candidates (default 5; quick 2)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps (= distinct batches) per candidate per repeat (default 6; quick 3)")
    ap.add_argument("--steps-fixed", type=int, default=None,
                    help="steps per repeat for the fixed-512 candidates, the first N of the same batches "
                         "(default 1; quick 2)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps per candidate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, 2 repeats, no memory subprocesses (unless --memory): a few-second smoke run")
    ap.add_argument("--no-memory", action="store_true", help="skip the per-candidate subprocess memory runs")
    ap.add_argument("--memory", action="store_true", help="run the memory subprocesses even with --quick")
    ap.add_argument("--mem-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    s = QUICK if args.quick else Shapes()
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.steps = args.steps or (3 if args.quick else 6)
    args.steps_fixed = args.steps_fixed or (2 if args.quick else 1)
    if args.mem_child:
        return mem_child(args, s)

    torch.set_num_threads(args.threads)
    cands = candidates(s)
    names = list(cands)
    eq = s.embed_dim // s.num_heads
    n_concat, n_eq, n_add = f"concat_k{s.key_dim}", f"concat_k{eq}", f"add_k{s.key_dim}"
    n_cpad, n_apad = f"concat_k{s.key_dim}_pad{s.fixed_pad}", f"add_k{s.key_dim}_pad{s.fixed_pad}"

    dyn = make_batches(args.steps, s, args.seed)
    all_lens = sample_lengths(args.steps * s.batch, s, args.seed).float()
    pads = [b["ids"].shape[1] for b in dyn]
    print(f"torch {torch.__version__} | threads {torch.get_num_threads()} | nproc {os.cpu_count()} | "
          f"{platform.processor() or platform.machine()} | python {platform.python_version()}")
    print(f"shapes: batch {s.batch}, d {s.embed_dim}, heads {s.num_heads}, ffn {s.ffn_dim}, layers {s.num_layers}, "
          f"vocab {s.vocab}, classes {s.classes}, dropout {s.dropout}, Adam")
    print(f"lengths (seeded lognormal, clipped [{s.len_min}, {s.len_max}]): mean {all_lens.mean():.1f}, "
          f"median {all_lens.median():.0f}, p99 {all_lens.quantile(0.99):.0f}, max {all_lens.max():.0f}; "
          f"padded batch length per batch: mean {statistics.mean(pads):.1f}, min {min(pads)}, max {max(pads)}; "
          f"pad fraction {1 - sum(b['real'] for b in dyn) / sum(b['ids'].numel() for b in dyn):.2f}")
    print(f"repeats {args.repeats} (round-robin, rotated), {args.steps} steps/repeat (fixed-pad: {args.steps_fixed}), "
          f"warm-up {args.warmup} steps each\n")

    state = {}
    for name in names:
        spec = cands[name]
        model, opt = build(spec, s, args.seed)
        bs = batches_for(spec, s, dyn, args.steps_fixed)
        state[name] = dict(model=model, opt=opt, batches=bs, real=sum(b["real"] for b in bs),
                           flops=sum(step_flops(spec, s, *b["ids"].shape) for b in bs),
                           tok_s=[], flop_s=[], step_s=[])
    for name in names:  # warm-up (includes the longest batch, so allocations are sized)
        st = state[name]
        longest = max(st["batches"], key=lambda b: b["ids"].shape[1])
        for i in range(args.warmup):
            train_step(st["model"], st["opt"], longest if i == 0 else st["batches"][i % len(st["batches"])])

    t_start = time.perf_counter()
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            st = state[name]
            t0 = time.perf_counter()
            for b in st["batches"]:
                train_step(st["model"], st["opt"], b)
            dt = time.perf_counter() - t0
            st["tok_s"].append(st["real"] / dt)
            st["flop_s"].append(st["flops"] / dt)
            st["step_s"].append(dt / len(st["batches"]))
        print(f"  repeat {r + 1}/{args.repeats} done ({time.perf_counter() - t_start:.0f}s)", flush=True)

    skip_mem = args.no_memory or (args.quick and not args.memory)
    mem = {} if skip_mem else measure_memory(args, names)

    med = statistics.median
    print(f"\nmedian of {args.repeats} repeats (min-max of real tokens/s in brackets)")
    hdr = (f"{'candidate':<20}{'dk':>4}{'dv':>5}{'pad':>8}{'ms/step':>9}{'real tok/s':>12}{'[min-max]':>17}"
           f"{'GFLOP/step':>11}{'GFLOP/s':>9}{'peak dRSS MB':>18}")
    print(hdr)
    print("-" * len(hdr))
    for name in names:
        spec, st = cands[name], state[name]
        pad = "batch" if spec["pad"] == "dynamic" else str(s.fixed_pad)
        m = mem.get(name)
        mtxt = f"{m['delta_mb']:.1f} (T={m['t']})" if m else "-"
        rng = f"[{min(st['tok_s']):.0f}-{max(st['tok_s']):.0f}]"
        print(f"{name:<20}{spec['key_dim']:>4}{value_dim(spec, s):>5}{pad:>8}{1e3 * med(st['step_s']):>9.1f}"
              f"{med(st['tok_s']):>12.0f}{rng:>17}"
              f"{st['flops'] / len(st['batches']) / 1e9:>11.2f}{med(st['flop_s']) / 1e9:>9.1f}{mtxt:>18}")
    if mem:
        st_mb = {n: v["state_mb"] for n, v in mem.items()}
        print(f"(peak dRSS includes grads + Adam state, analytically "
              f"{min(st_mb.values()):.0f}-{max(st_mb.values()):.0f} MB for these models, mostly the embedding table)")

    def paired(a: str, b: str, key: str) -> float:
        return med([x / y for x, y in zip(state[a][key], state[b][key])])

    r_eq = paired(n_eq, "torch_layer", "tok_s")
    r_k16 = paired(n_concat, "torch_layer", "tok_s")
    r_flop = paired(n_add, n_concat, "flop_s")
    r_flop_eq = paired(n_add, n_eq, "flop_s")
    r_tok_add = paired(n_add, n_concat, "tok_s")
    r_pad_c = paired(n_concat, n_cpad, "tok_s")
    r_pad_a = paired(n_add, n_apad, "tok_s")
    print("\nratios (median of per-repeat paired ratios)")
    print(f"  {n_eq} / torch_layer   real tok/s : {r_eq:.3f}   (equal shapes, dk=dv={eq}; the target's comparison)")
    print(f"  {n_concat} / torch_layer   real tok/s : {r_k16:.3f}   (paper's key_dim={s.key_dim}; informational)")
    print(f"  {n_add} / {n_concat}       FLOP/s     : {r_flop:.3f}   (same key_dim; the target's comparison)")
    print(f"  {n_add} / {n_eq}       FLOP/s     : {r_flop_eq:.3f}   (informational)")
    print(f"  {n_add} / {n_concat}       real tok/s : {r_tok_add:.3f}   (add does more work by design)")
    print(f"  dynamic / pad{s.fixed_pad}  real tok/s : concat {r_pad_c:.2f}x, add {r_pad_a:.2f}x")
    print()
    print(f"{'PASS' if r_eq >= 0.9 else 'FAIL'}: concat (key_dim={eq}, equal shapes) >= 0.9x "
          f"torch.nn.TransformerEncoderLayer throughput: {r_eq:.3f}")
    print(f"{'PASS' if r_flop >= 0.9 else 'FAIL'}: add reaches >= 90% of concat's FLOP throughput "
          f"(key_dim={s.key_dim}): {100 * r_flop:.1f}%")


if __name__ == "__main__":
    main()

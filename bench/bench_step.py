"""Training-step speed at equal shapes: this project's encoder vs a reference-style encoder.

Both encoders get the same batch padded to 512 tokens (how the reference code feeds every batch), so
the comparison is about the layer's implementation, not about padding (bench_model.py and
bench_e2e.py measure dynamic padding). One training step = forward + cross-entropy + backward +
AdamW step. Shapes (the issue's): batch 64, 512 tokens, embed 128, 4 heads, key 16, one post-norm
layer, ReLU feed-forward 256, dropout 0.1, learned positions, <cls> pooling; value size d/h for
``concat`` and d for ``add``.

Candidates:

  ref_concat, ref_add   ``ReferenceStyleClassifier`` below: a re-creation of the reference code's
                        layer maths (declare-lab/identifiable-transformers, multi_head_attention.py):
                        sequence-first layout, separate q/k/v projections, q scaled, a (B*H, T, T)
                        padding mask built every step and applied with ``masked_fill_``, an explicit
                        ``softmax``, ``F.dropout`` on the weights, ``bmm``, heads concatenated
                        (``transpose().contiguous().view``) or added (``reduce(torch.add)`` over the
                        heads), output projection, post-norm residual blocks, ``nn.Dropout``,
                        ``torch.optim.AdamW`` with its defaults. Its correctness bugs are NOT
                        reproduced, so that only speed is compared: the mask hides padded keys of
                        the right example, ``add`` is a true sum over heads, logits are scaled by
                        1/sqrt(key size), the residuals are real residuals.
  ours_concat, ours_add this project's ``TextClassifier`` (lit_module) with the same sizes, and the
                        optimiser of its ``configure_optimizers``.
  ours_*_compiled       the same with ``compile=True`` (torch.compile), with ``--compile``.

All candidates live in one process; after a warm-up, each repeat runs every candidate for
``--steps`` steps, round-robin with a rotating start, and the figures are medians over repeats (the
ratios are medians of per-repeat ratios). Each repeat also times a 2048x2048 fp32 matmul (``peak``):
a step's FLOP/s (matmul FLOPs counted analytically: projections, QK^T, AV, output projection, FFN,
head; x3 for forward + backward) is reported as a share of it.

    python bench/bench_step.py                       # about 2 minutes on 2 idle cores
    python bench/bench_step.py --compile             # also the torch.compile candidates (about 4 minutes,
                                                     # plus 1-3 to compile the first time)
    python bench/bench_step.py --profile             # torch.profiler table of one step per candidate
    python bench/bench_step.py --quick               # tiny smoke run
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, replace
from functools import reduce

import torch
import torch.nn.functional as F
from torch import nn

from identifiable_transformers.modules.classifier import TextClassifier


@dataclass
class Shapes:
    batch: int = 64
    length: int = 512
    embed_dim: int = 128
    num_heads: int = 4
    key_dim: int = 16
    ffn_dim: int = 256
    vocab: int = 20_000
    classes: int = 4
    dropout: float = 0.1
    len_mean: float = 47.0  # real lengths (AG-News-like, lognormal); the rest of the 512 is padding


QUICK = replace(Shapes(), batch=8, length=64, embed_dim=32, key_dim=4, ffn_dim=32, vocab=500, len_mean=12.0)


def value_dim(s: Shapes, combine: str) -> int:
    return s.embed_dim // s.num_heads if combine == "concat" else s.embed_dim


# --------------------------------------------------------------------------------- reference-style
class ReferenceStyleAttention(nn.Module):
    """The reference code's attention maths, without its bugs (see the module docstring)."""

    def __init__(self, s: Shapes, combine: str):
        super().__init__()
        h, dk, dv = s.num_heads, s.key_dim, value_dim(s, combine)
        self.h, self.dk, self.dv, self.combine, self.p = h, dk, dv, combine, s.dropout
        self.q_proj, self.k_proj = nn.Linear(s.embed_dim, h * dk), nn.Linear(s.embed_dim, h * dk)
        self.v_proj = nn.Linear(s.embed_dim, h * dv)
        self.out_proj = nn.Linear(h * dv if combine == "concat" else dv, s.embed_dim)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        t, b, _ = x.shape  # sequence first, as the reference
        q = self.q_proj(x) * self.dk**-0.5
        k, v = self.k_proj(x), self.v_proj(x)
        q = q.view(t, b * self.h, self.dk).transpose(0, 1)  # (B*H, T, dk), batch-major
        k = k.view(t, b * self.h, self.dk).transpose(0, 1)
        v = v.view(t, b * self.h, self.dv).transpose(0, 1)
        w = torch.bmm(q, k.transpose(1, 2))  # (B*H, T, T)
        # A full (B*H, T, T) mask every step, as the reference builds; here it hides padded keys of the
        # right example (repeat_interleave keeps the batch-major order of w).
        mask = (key_padding_mask == 0)[:, None, :].expand(b, t, t).repeat_interleave(self.h, dim=0)
        w = w.masked_fill_(mask, -1e10)
        w = F.dropout(F.softmax(w, dim=-1), p=self.p, training=self.training)
        o = torch.bmm(w, v).transpose(0, 1).contiguous()  # (T, B*H, dv)
        if self.combine == "concat":
            o = o.view(t, b, self.h * self.dv)
        else:
            o = o.view(t, b, self.h, self.dv)
            o = reduce(torch.add, [o[:, :, i] for i in range(self.h)])  # a true sum over heads
        return self.out_proj(o)


class ReferenceStyleClassifier(nn.Module):
    def __init__(self, s: Shapes, combine: str):
        super().__init__()
        self.embedding = nn.Embedding(s.vocab, s.embed_dim, padding_idx=0)
        self.positional_encoding = nn.Embedding(s.length, s.embed_dim)
        self.self_attn = ReferenceStyleAttention(s, combine)
        self.linear1, self.linear2 = nn.Linear(s.embed_dim, s.ffn_dim), nn.Linear(s.ffn_dim, s.embed_dim)
        self.norm1, self.norm2 = nn.LayerNorm(s.embed_dim), nn.LayerNorm(s.embed_dim)
        self.dropout = nn.Dropout(s.dropout)
        self.fc = nn.Linear(s.embed_dim, s.classes)

    def forward(self, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embedding(text.transpose(0, 1)) + self.positional_encoding.weight[: text.shape[1], None]
        x = self.dropout(x)  # (T, B, d)
        x = self.norm1(x + self.dropout(self.self_attn(x, mask)))
        x = self.norm2(x + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x))))))
        return self.fc(x[0])


# ------------------------------------------------------------------------------------------ ours
class Ours(nn.Module):
    def __init__(self, s: Shapes, combine: str, compile: bool):
        super().__init__()
        self.lit = TextClassifier(s.vocab, s.classes, embed_dim=s.embed_dim, num_heads=s.num_heads,
                                  key_dim=s.key_dim, head_combine=combine, ffn_dim=s.ffn_dim, dropout=s.dropout,
                                  max_len=s.length, compile=compile)

    def forward(self, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lit.model(text, mask).logits


def build(name: str, s: Shapes, seed: int):
    torch.manual_seed(seed)
    combine = "add" if "add" in name else "concat"
    if name.startswith("ref"):
        model = ReferenceStyleClassifier(s, combine)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        model = Ours(s, combine, compile=name.endswith("compiled"))
        opt = model.lit.configure_optimizers()
    return model.train(), opt


def step_flops(s: Shapes, combine: str) -> float:
    """Matmul FLOPs of one training step (2 per multiply-add; x3 for forward + backward)."""
    d, h, dk, dv, f = s.embed_dim, s.num_heads, s.key_dim, value_dim(s, combine), s.ffn_dim
    b, t = s.batch, s.length
    n = b * t
    proj = 2 * n * d * (2 * h * dk + h * dv)
    scores, av = 2 * b * h * t * t * dk, 2 * b * h * t * t * dv
    out = 2 * n * (h * dv if combine == "concat" else dv) * d
    ffn = 2 * n * d * f * 2
    return 3.0 * (proj + scores + av + out + ffn + 2 * b * d * s.classes)


def make_batch(s: Shapes, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    sigma = 0.55
    lengths = torch.empty(s.batch, dtype=torch.float64).log_normal_(math.log(s.len_mean) - sigma**2 / 2, sigma,
                                                                    generator=g)
    lengths = lengths.round().clamp(2, s.length).long()
    mask = torch.arange(s.length)[None, :] < lengths[:, None]
    ids = torch.randint(1, s.vocab, (s.batch, s.length), generator=g).masked_fill(~mask, 0)
    return dict(ids=ids, mask=mask.long(), labels=torch.randint(0, s.classes, (s.batch,), generator=g))


def train_step(model, opt, batch) -> None:
    loss = F.cross_entropy(model(batch["ids"], batch["mask"]), batch["labels"])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def matmul_flops_per_s(n: int = 2048, reps: int = 3) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return reps * 2 * n**3 / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; quick 2)")
    ap.add_argument("--steps", type=int, default=2, help="training steps per candidate per repeat")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per candidate (compiled: +1)")
    ap.add_argument("--compile", action="store_true", help="add the compile=True candidates")
    ap.add_argument("--profile", action="store_true", help="print a torch.profiler table of one step per candidate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 2 repeats")
    args = ap.parse_args()
    s = QUICK if args.quick else Shapes()
    repeats = args.repeats or (2 if args.quick else 5)
    torch.set_num_threads(args.threads)

    names = ["ref_concat", "ours_concat", "ref_add", "ours_add"]
    if args.compile:
        names += ["ours_concat_compiled", "ours_add_compiled"]
    batch = make_batch(s, args.seed)
    print(f"torch {torch.__version__} | threads {torch.get_num_threads()} | nproc {os.cpu_count()} | "
          f"{platform.processor() or platform.machine()} | load average {os.getloadavg()[0]:.1f}")
    print(f"shapes: batch {s.batch}, length {s.length} (real tokens {int(batch['mask'].sum())}, the rest padding), "
          f"embed {s.embed_dim}, heads {s.num_heads}, key {s.key_dim}, value d/h (concat) or d (add), "
          f"ffn {s.ffn_dim}, one layer, dropout {s.dropout}, AdamW")
    print(f"repeats {repeats} x {args.steps} steps per candidate (round-robin, rotated), warm-up {args.warmup}\n")

    state = {}
    for name in names:
        model, opt = build(name, s, args.seed)
        t0 = time.perf_counter()
        for _ in range(args.warmup + name.endswith("compiled")):
            train_step(model, opt, batch)
        state[name] = dict(model=model, opt=opt, step_s=[], warmup_s=time.perf_counter() - t0)
    peaks = []
    for r in range(repeats):
        peaks.append(matmul_flops_per_s())
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            st = state[name]
            t0 = time.perf_counter()
            for _ in range(args.steps):
                train_step(st["model"], st["opt"], batch)
            st["step_s"].append((time.perf_counter() - t0) / args.steps)
        print(f"  repeat {r + 1}/{repeats} done", flush=True)

    med = statistics.median
    print(f"\nfp32 matmul 2048^3 (the peak): median {med(peaks) / 1e9:.1f} GFLOP/s "
          f"[{min(peaks) / 1e9:.1f}-{max(peaks) / 1e9:.1f}]")
    print(f"\n{'candidate':<22}{'ms/step':>9}{'[min-max]':>15}{'GFLOP/step':>12}{'GFLOP/s':>9}{'of peak':>9}"
          f"{'warm-up s':>11}")
    for name in names:
        st, flops = state[name], step_flops(s, "add" if "add" in name else "concat")
        share = med([flops / t / p for t, p in zip(st["step_s"], peaks)])
        rng = f"[{1e3 * min(st['step_s']):.0f}-{1e3 * max(st['step_s']):.0f}]"
        print(f"{name:<22}{1e3 * med(st['step_s']):>9.0f}{rng:>15}{flops / 1e9:>12.2f}"
              f"{flops / med(st['step_s']) / 1e9:>9.1f}{100 * share:>8.1f}%{st['warmup_s']:>11.1f}")

    def speedup(ours: str, ref: str) -> float:
        return med([a / b for a, b in zip(state[ref]["step_s"], state[ours]["step_s"])])

    print("\nspeed-up over the reference-style encoder (median of per-repeat ratios of step times)")
    for name in names[1:]:
        if name.startswith("ours"):
            ref = "ref_add" if "add" in name else "ref_concat"
            x = speedup(name, ref)
            print(f"  {name:<22} vs {ref:<11}: {x:.2f}x   {'PASS' if x >= 2 else 'below'} (goal >= 2x)")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in names:
            st = state[name]
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                train_step(st["model"], st["opt"], batch)
            print(f"\n== profile: {name}")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()

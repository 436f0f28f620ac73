"""GPU check: the attention layer's paths on CUDA against a float64 per-head loop on the CPU, and a step's speed.

The test suite runs on CPU only (CI has no GPU), so this script is what checks the CUDA side:

- every path of ``MultiHeadSelfAttention`` (torch's fused attention, the explicit path that returns weights,
  the explicit path with dropout) on CUDA, in fp32 and under bf16 autocast, for both head combines,
  forward and input gradient, against the same layer's weights run as a float64 per-head loop on the CPU
  (relative error ||out - ref|| / ||ref||: fp32 paths must be under 1e-4, bf16 under 3e-2);
- with dropout, the rate of dropped weights on CUDA (``keep_mask``'s random bits) against p;
- the training dropout inside torch's fused attention (the CUDA path without weights): padded keys at 0, kept
  weights scaled by 1 / (1 - p), the rate p;
- the training step (forward + backward + AdamW) of ``TransformerClassifier`` at batch 64 x 256 tokens,
  fp32 and bf16 autocast, CUDA events, median of 20 after warm-up (informative; no target).

    python bench/gpu_check.py          # needs a CUDA GPU; exits 1 if a check fails
    python bench/gpu_check.py --cpu    # the same checks on the CPU (a dry run of the script itself)
"""

from __future__ import annotations

import math
import statistics
import sys

import torch

from identifiable_transformers.models import MultiHeadSelfAttention, TransformerClassifier, attention
from identifiable_transformers.models import dropout as dropout_module
from identifiable_transformers.models.reference import loop_attention

DEVICE = torch.device("cuda")  # --cpu: the CPU


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.detach().double().cpu(), ref.detach()
    if not torch.isfinite(a).all():
        return math.inf
    return float((a - ref).norm() / ref.norm())


def check_paths(results: list) -> None:
    torch.manual_seed(0)
    b, t, d, h = 6, 48, 64, 4
    lengths = torch.tensor([48, 40, 33, 17, 5, 1])
    mask = torch.arange(t)[None] < lengths[:, None]
    for combine, dk in (("concat", None), ("concat", 2), ("add", 2), ("add", 64)):
        attn = MultiHeadSelfAttention(d, h, key_dim=dk, head_combine=combine, dropout=0.1)
        with torch.no_grad():
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
                lin.bias.normal_()
        x = torch.randn(b, t, d, dtype=torch.float64, requires_grad=True)
        ref_attn = MultiHeadSelfAttention(d, h, key_dim=dk, head_combine=combine).double()
        ref_attn.load_state_dict(attn.state_dict())
        ref = loop_attention(ref_attn, x, mask)
        (ref_grad,) = torch.autograd.grad(ref[mask].square().sum(), x)
        gpu = attn.to(DEVICE)
        xg = x.detach().float().to(DEVICE)
        for name, training, need_weights in (("fused", False, False), ("weights", False, True)):
            for dtype in (torch.float32, torch.bfloat16):
                xi = xg.clone().requires_grad_(True)
                gpu.train(training)
                with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                    out, _ = gpu(xi, mask.to(DEVICE), need_weights)
                (g,) = torch.autograd.grad(out.float()[mask.to(DEVICE)].square().sum(), xi)
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                err = max(rel(out.float(), ref), rel(g, ref_grad))
                results.append((f"{combine} dk={gpu.key_dim} {name} {str(dtype)[6:]}", err, tol))
        # torch's F.dropout (small tensors) and keep_mask's random bits (on CPU these sizes take the chunks instead)
        default_min = dropout_module.KEEP_MASK_MIN_NUMEL
        for small in (True, False) if DEVICE.type == "cuda" else (True,):
            dropout_module.KEEP_MASK_MIN_NUMEL = default_min if small else 0
            gpu.train()
            out, keep, scale = _forward_with_keep(gpu, xg, mask.to(DEVICE))
            dropped = ~keep.cpu()
            ref_drop = loop_attention(ref_attn, x.detach(), mask, drop=dropped, scale=scale)
            label = f"{combine} dk={gpu.key_dim} dropout {'F.dropout' if small else 'keep_mask'}"
            results.append((f"{label} fp32", rel(out, ref_drop), 1e-4))
            real = (mask[:, None, :, None] & mask[:, None, None, :]).expand_as(dropped)
            rate = float(dropped[real].float().mean())
            results.append((f"{label} rate {rate:.4f} vs 0.1", abs(rate - 0.1), 0.01))
        dropout_module.KEEP_MASK_MIN_NUMEL = default_min


def check_fused_dropout(results: list) -> None:
    """The training dropout inside torch's fused attention (CUDA; forced on the CPU with --cpu): one head whose
    projections are the identity, inputs x_j = s_j e_j, so that output row i / s is the dropped attention row i.
    Padded keys must stay at 0, a kept weight must be the softmax weight / (1 - p), and the rate must be p."""
    t, p = 32, 0.25
    attn = MultiHeadSelfAttention(t, 1, key_dim=t, value_dim=t, dropout=p).train()
    with torch.no_grad():
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            lin.weight.copy_(torch.eye(t))
            lin.bias.zero_()
    attn = attn.to(DEVICE)
    torch.manual_seed(0)
    scales = torch.rand(256, t) + 0.5
    x = torch.diag_embed(scales)
    mask = torch.arange(t)[None] < torch.tensor([32, 20] * 128)[:, None]
    logits = (x.double() @ x.double().transpose(1, 2) / math.sqrt(t)).masked_fill(~mask[:, None], -math.inf)
    expected = torch.softmax(logits, -1)
    real = mask[:, None, :].expand(-1, t, -1)
    devices = attention.SDPA_DROPOUT_DEVICES
    attention.SDPA_DROPOUT_DEVICES = (DEVICE.type,)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                out, _ = attn(x.to(DEVICE), mask.to(DEVICE))
            w = out.detach().double().cpu() / scales[:, None, :].double()
            name = f"fused dropout {str(dtype)[6:]}"
            results.append((f"{name} padded keys", float(w[~real].abs().max()), 0.0))
            kept = w[real] != 0
            results.append((f"{name} kept = w / (1 - p)", rel(w[real][kept], expected[real][kept] / (1 - p)),
                            1e-4 if dtype == torch.float32 else 3e-2))
            rate = 1 - float(kept.double().mean())
            results.append((f"{name} rate {rate:.4f} vs {p}", abs(rate - p), 0.01))
    finally:
        attention.SDPA_DROPOUT_DEVICES = devices


def _forward_with_keep(gpu: MultiHeadSelfAttention, xg: torch.Tensor, mask: torch.Tensor):
    """A training forward on the explicit path, with the keep mask it drew and the scale of the kept weights."""
    captured = {}
    original = MultiHeadSelfAttention._drop

    def spy(weights, p):
        dropped, scale = original(weights, p)
        captured["keep"] = (dropped != 0) | (weights == 0)
        # F.dropout scales the kept weights itself (and returns scale 1); keep_mask leaves it to the caller
        captured["scale"] = scale if scale != 1.0 else 1 / (1 - p)
        return dropped, scale

    MultiHeadSelfAttention._drop = staticmethod(spy)
    try:
        out, _ = gpu(xg, mask, need_weights=True)  # the explicit path (without weights CUDA drops inside SDPA)
    finally:
        MultiHeadSelfAttention._drop = staticmethod(original)
    return out, captured["keep"], captured["scale"]


def time_steps() -> None:
    torch.manual_seed(0)
    b, t = 64, 256
    ids = torch.randint(5, 20000, (b, t), device=DEVICE)
    lengths = torch.randint(t // 4, t + 1, (b,), device=DEVICE)
    attention_mask = torch.arange(t, device=DEVICE)[None] < lengths[:, None]
    labels = torch.randint(0, 2, (b,), device=DEVICE)
    for combine, dk in (("concat", None), ("add", 2)):
        model = TransformerClassifier(20000, 2, 64, 4, key_dim=dk, head_combine=combine, max_len=t).to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        for dtype in (torch.float32, torch.bfloat16):
            def step(model=model, opt=opt, dtype=dtype):
                with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(model(ids, attention_mask).logits.float(), labels)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            for _ in range(5):
                step()
            times = []
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            print(f"step {combine:6s} {str(dtype)[6:]:8s} batch {b} x {t}: {statistics.median(times):.2f} ms "
                  "(median of 20)")


def main() -> int:
    global DEVICE
    if "--cpu" in sys.argv:  # a dry run of the checks' logic on the CPU (no timings)
        DEVICE = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("Error: no CUDA GPU: this script checks the CUDA paths", file=sys.stderr)
        return 1
    print(f"{torch.cuda.get_device_name() if DEVICE.type == 'cuda' else 'CPU'}, torch {torch.__version__}")
    results: list = []
    check_paths(results)
    check_fused_dropout(results)
    failed = 0
    for name, err, tol in results:
        ok = err <= tol
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name:40s} {err:.2e} (<= {tol:g})")
    if DEVICE.type == "cuda":
        time_steps()
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

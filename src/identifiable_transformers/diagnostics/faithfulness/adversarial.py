"""Adversarial attention at a fixed prediction (Jain & Wallace 2019): how far can a head's row move?"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ...models import override_attention
from ._common import _eval_with_grad, _inputs
from .readout import _ClsReadout


def project_simplex(v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Euclidean projection of each row of v (..., n) onto the probability simplex over ``mask``'s entries.

    Duchi et al. (2008): sort descending, rho = max{j : u_j - (sum_{i<=j} u_i - 1) / j > 0},
    theta = (sum_{i<=rho} u_i - 1) / rho, w = max(v - theta, 0). Entries outside ``mask`` get 0.
    """
    if mask is None:
        mask = torch.ones_like(v, dtype=torch.bool)
    mask = mask.expand_as(v)
    u, idx = torch.sort(torch.where(mask, v, torch.full_like(v, -math.inf)), dim=-1, descending=True)
    valid = mask.gather(-1, idx)
    u = torch.where(valid, u, torch.zeros_like(u))
    css = u.cumsum(-1)
    j = torch.arange(1, v.shape[-1] + 1, device=v.device, dtype=v.dtype)
    cond = valid & (u - (css - 1) / j > 0)
    rho = cond.to(v.dtype).cumsum(-1).argmax(-1, keepdim=True)  # last True (cond is a prefix)
    theta = (css.gather(-1, rho) - 1) / (rho + 1).to(v.dtype)
    return torch.where(mask, (v - theta).clamp_min(0), torch.zeros_like(v))


def _jsd(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence (nats) between rows of p and q."""
    m = 0.5 * (p + q)
    kl = lambda a, b: (a * (a.clamp_min(1e-30).log() - b.clamp_min(1e-30).log())).sum(-1)  # noqa: E731
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def adversarial_attention(
    model, input_ids: Tensor, attention_mask: Tensor | None = None, *, eps: float = 0.01, steps: int = 300,
    restarts: int = 4, lr: float = 0.1, seed: int = 0, scan_steps: int = 8, return_details: bool = False,
):
    """Largest TV from the real attention found at a fixed prediction, per example and head: (B, H).

    For each head of the last layer separately, search the rows that reach the classifier -- the ``<cls>``
    query's row with cls pooling, every real query row with mean pooling (TV then averaged over those
    rows) -- on the simplex over the real keys for rows A' far from A in total variation while
    JSD(p', p) <= eps, p' the prediction with the head's rows set to A' (via ``override_attention``; JSD
    in nats). First a scan along the segments from A to every key's vertex (``scan_steps`` points each);
    then projected gradient ascent on TV(A', A) - (10/eps) relu(JSD - 0.9 eps) from ``restarts`` seeded
    starts (the scan's best point, a tenth of the way from A to the least attended key's vertex, then
    alternately a random key's vertex and a point halfway between A and a random point), ``steps`` steps,
    each clipped to ``lr`` per entry (decaying linearly to lr/10); last, a line search from A towards each
    final point. Only points with JSD <= eps count; A itself (TV 0) is feasible, so the result is in
    [0, 1] and a lower bound on the true maximum. ``return_details`` adds the best rows (B, H, T, T),
    their JSD and the searched query mask.
    """
    with _eval_with_grad(model):
        ids, mask = _inputs(model, input_ids, attention_mask)
        B, T = ids.shape
        dev = ids.device
        with torch.no_grad():
            out = model(ids, mask, output_attentions=True)
        p0 = out.logits.float().softmax(-1)
        A0 = out.attentions[-1].float()  # (B, H, T, T)
        H, L = A0.shape[1], len(out.attentions)
        qmask = torch.zeros_like(mask)  # queries whose rows reach the classifier
        if model.pooling == "cls":
            qmask[:, 0] = True
        else:
            qmask = mask.clone()
        readout = None
        if _ClsReadout.applies(model):  # the exact shortcut: only the <cls> row of the one layer matters
            with torch.no_grad():
                readout = _ClsReadout(model, ids)

        def run(x_in: Tensor, b: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
            """TV and JSD of copies of examples b with head h's searched rows set to x_in (S, T, T)."""
            q = qmask[b]
            if readout is not None:
                w = torch.where(F.one_hot(h, H).bool()[:, :, None], x_in[:, None, 0], readout.weights(b, mask[b]))
                logits = readout.logits(b, w).float()
            else:
                sel = F.one_hot(h, H).bool()[:, :, None, None] & q[:, None, :, None]  # (S, H, T, 1)

                def hook(layer: int, w: Tensor, _m) -> Tensor:
                    return torch.where(sel, x_in[:, None], w) if layer == L - 1 else w

                with override_attention(model, hook):
                    logits = model(ids[b], mask[b]).logits.float()
            jsd = _jsd(logits.softmax(-1), p0[b])
            tv = (0.5 * (x_in - A0[b, h]).abs().sum(-1) * q).sum(-1) / q.sum(1)
            return tv, jsd

        # 1. Scan the segments from A towards every real key's vertex (TV is convex: its maxima are vertices).
        pair_b = torch.arange(B, device=dev).repeat_interleave(H)  # (B H,)
        pair_h = torch.arange(H, device=dev).repeat(B)
        scan_best = torch.zeros(B * H, device=dev)
        scan_x = A0[pair_b, pair_h].clone()  # (B H, T, T)
        eye = torch.eye(T, device=dev)
        chunk = max(1, (1 << 24) // (T * T * T))  # pairs per pass: (chunk T, T, T) candidate maps
        with torch.no_grad():
            for c in range(0, B * H, chunk):
                pb, ph = pair_b[c : c + chunk], pair_h[c : c + chunk]
                P = len(pb)
                sb, sh = pb.repeat_interleave(T), ph.repeat_interleave(T)  # (P T,): pair, then key k
                k_real = mask[sb, torch.arange(T, device=dev).repeat(P)]
                vert = eye.repeat(P, 1)[:, None, :]  # (P T, 1, T): every searched row at vertex k
                a = A0[sb, sh]
                for t in torch.arange(1, scan_steps + 1, device=dev) / max(scan_steps, 1):
                    x = torch.where(qmask[sb][:, :, None], (1 - t) * a + t * vert, a)
                    tv, jsd = run(x, sb, sh)
                    tv = torch.where((jsd <= eps) & k_real, tv, torch.zeros_like(tv)).view(P, T)
                    val, k = tv.max(1)
                    better = val > scan_best[c : c + chunk]
                    scan_best[c : c + chunk] = torch.where(better, val, scan_best[c : c + chunk])
                    pick = x.view(P, T, T, T)[torch.arange(P, device=dev), k]
                    scan_x[c : c + chunk] = torch.where(better[:, None, None], pick, scan_x[c : c + chunk])

        # 2. Projected gradient ascent from `restarts` starts per (example, head).
        R = restarts
        E = B * H * R
        b_of, h_of = pair_b.repeat_interleave(R), pair_h.repeat_interleave(R)
        a0, q_e, key = A0[b_of, h_of], qmask[b_of], mask[b_of][:, None, :]  # (E, T, T), (E, T), (E, 1, T)
        g = torch.Generator().manual_seed(seed)
        r_of = torch.arange(R, device=dev).repeat(B * H)[:, None, None]
        far = F.one_hot(torch.where(key, a0, torch.full_like(a0, math.inf)).argmin(-1), T).to(a0.dtype)
        rand_key = torch.where(key, torch.rand(E, 1, T, generator=g).to(dev), torch.full_like(a0, -1.0))
        vertex = F.one_hot(rand_key.argmax(-1), T).to(a0.dtype)
        dirichlet = -torch.rand(E, T, T, generator=g).clamp_min(1e-12).log().to(dev)
        dirichlet = torch.where(key, dirichlet, torch.zeros_like(dirichlet))
        dirichlet = 0.5 * a0 + 0.5 * dirichlet / dirichlet.sum(-1, keepdim=True)
        x = torch.where(r_of == 0, scan_x.repeat_interleave(R, 0),
                        torch.where(r_of == 1, 0.9 * a0 + 0.1 * far, torch.where(r_of % 2 == 0, vertex, dirichlet)))
        x = torch.where(q_e[:, :, None], x, a0)

        best = scan_best.repeat_interleave(R)
        best_x = scan_x.repeat_interleave(R, 0)

        def keep_best(tv, jsd, x_in):
            nonlocal best, best_x
            better = (jsd <= eps) & (tv > best)
            best = torch.where(better, tv.detach(), best)
            best_x = torch.where(better[:, None, None], x_in.detach(), best_x)

        for it in range(steps):
            x_cur = x.detach().requires_grad_(True)
            tv, jsd = run(x_cur, b_of, h_of)
            keep_best(tv, jsd, x_cur)
            # The penalty aims a little inside the constraint so that iterates near it are feasible.
            obj = tv - 10.0 * torch.relu(jsd - 0.9 * eps) / eps
            (grad,) = torch.autograd.grad(obj.sum(), x_cur)
            grad = grad / grad.abs().amax(-1, keepdim=True).clamp_min(1.0)  # at most lr per entry and step
            step = lr * (1.0 - 0.9 * it / max(steps, 1))
            x = torch.where(q_e[:, :, None], project_simplex(x_cur.detach() + step * grad, key), a0)
        # 3. The ascent can end just outside the constraint: search the segment from A to each final point.
        with torch.no_grad():
            for t in torch.linspace(1.0, 0.0, 17, device=dev)[:-1]:
                x_cur = a0 + t * (x - a0)
                keep_best(*run(x_cur, b_of, h_of), x_cur)
        tv_bh = best.view(B, H, R).amax(-1)
        if not return_details:
            return tv_bh
        r_best = best.view(B, H, R).argmax(-1)  # (B, H)
        pick = torch.arange(B * H, device=dev) * R + r_best.flatten()
        rows = best_x[pick]
        with torch.no_grad():
            _, jsd = run(rows, pair_b, pair_h)
        return {"tv": tv_bh, "jsd": jsd.view(B, H), "rows": rows.view(B, H, T, T), "query_mask": qmask}

"""Adversarial attention at a fixed prediction (Jain & Wallace 2019): how far can a head's row move?"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ...models import override_attention
from ._common import _eval_with_grad, _inputs
from .last_layer import LastLayerReadout


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
    restarts: int = 4, lr: float = 0.1, seed: int = 0, scan_steps: int = 8, mixtures: int = 16,
    return_details: bool = False, progress: Callable[[int], object] | None = None,
):
    """Largest TV from the real attention found at a fixed prediction, per example and head: (B, H).

    For each head of the last layer separately, search the rows that reach the classifier -- the ``<cls>``
    query's row with cls pooling, every real query row with mean pooling (TV then averaged over those
    rows) -- on the simplex over the real keys for rows A' far from A in total variation while
    JSD(p', p) <= eps, p' the prediction with the head's rows set to A' (via ``override_attention``; JSD
    in nats). First a scan along the segments from A to every key's vertex (``scan_steps`` points each);
    with cls pooling, then the segments from A towards the ``mixtures`` most promising mixtures of two keys'
    one-hot rows (chosen on the prediction linearised at A), each searched by bisection up to the eps
    boundary; then projected gradient ascent on TV(A', A) - (10/eps) relu(JSD - 0.9 eps) from ``restarts`` seeded
    starts (the best point so far, a tenth of the way from A to the least attended key's vertex, then
    alternately a random key's vertex and a point halfway between A and a random point), ``steps`` steps,
    each clipped to ``lr`` per entry (decaying linearly to lr/10); last, a line search from A towards each
    final point. Only points with JSD <= eps count; A itself (TV 0) is feasible, so the result is in
    [0, 1] and a lower bound on the true maximum. ``return_details`` adds the best rows (B, H, T, T),
    their JSD and the searched query mask. ``progress(1)`` (e.g. a progress bar's ``update``) is called
    ``steps + 2`` times: after the scans, after every ascent step and after the last line search.
    """
    tick = progress or (lambda _n: None)
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
        # The exact shortcut: only the last layer's searched rows change (last_layer.py).
        readout = LastLayerReadout(model, ids, mask) if LastLayerReadout.applies(model) else None

        def probs(x_in: Tensor, b: Tensor, h: Tensor) -> Tensor:
            """Class probabilities (S, C) of copies of examples b with head h's searched rows set to x_in (S, T, T)."""
            q = qmask[b]
            if readout is not None:
                logits = readout.logits(b, h, x_in).float()
            else:  # whole forward passes with the head's rows overridden
                sel = F.one_hot(h, H).bool()[:, :, None, None] & q[:, None, :, None]  # (S, H, T, 1)

                def hook(layer: int, w: Tensor, _m) -> Tensor:
                    return torch.where(sel, x_in[:, None], w) if layer == L - 1 else w

                with override_attention(model, hook):
                    logits = model(ids[b], mask[b]).logits.float()
            return logits.softmax(-1)

        def run(x_in: Tensor, b: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
            """TV and JSD of copies of examples b with head h's searched rows set to x_in (S, T, T)."""
            q = qmask[b]
            jsd = _jsd(probs(x_in, b, h), p0[b])
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

        # 1b. Far points that keep the prediction often mix two keys' one-hot rows (at a tight eps the segments
        # above stay near A): try such mixtures, chosen on the linearised prediction, up to the eps boundary.
        if model.pooling == "cls" and mixtures > 0:
            x_mix, tv_mix = _mixture_search(probs, run, A0, mask, pair_b, pair_h, p0, eps, mixtures)
            better = tv_mix > scan_best
            scan_best = torch.where(better, tv_mix, scan_best)
            scan_x = torch.where(better[:, None, None], x_mix, scan_x)

        tick(1)

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
            tick(1)
        # 3. The ascent can end just outside the constraint: search the segment from A to each final point.
        with torch.no_grad():
            for t in torch.linspace(1.0, 0.0, 17, device=dev)[:-1]:
                x_cur = a0 + t * (x - a0)
                keep_best(*run(x_cur, b_of, h_of), x_cur)
        tick(1)
        tv_bh = best.view(B, H, R).amax(-1)
        if not return_details:
            return tv_bh
        r_best = best.view(B, H, R).argmax(-1)  # (B, H)
        pick = torch.arange(B * H, device=dev) * R + r_best.flatten()
        rows = best_x[pick]
        with torch.no_grad():
            _, jsd = run(rows, pair_b, pair_h)
        return {"tv": tv_bh, "jsd": jsd.view(B, H), "rows": rows.view(B, H, T, T), "query_mask": qmask}


def _mixture_search(probs, run, A0: Tensor, mask: Tensor, pair_b: Tensor, pair_h: Tensor, p0: Tensor, eps: float,
                    top: int, rounds: int = 2, bisections: int = 10, edge_points: int = 9) -> tuple[Tensor, Tensor]:
    """Best points towards mixtures of two keys' one-hot rows, per (example, head) pair: ((P, T, T), (P,)).

    The maxima of TV over the prediction-keeping set sit at its vertices, and with the prediction
    linearised (dp = J (x - x_b), J the (C, T) Jacobian of the probabilities in the <cls> row at a point
    x_b) the vertices of {x in the simplex : p(x_b) + J (x - x_b) = p} mix few one-hot rows: two for a
    binary classifier. For every pair of real keys (i, j) take the w in [0, 1] whose x = w e_i + (1 - w) e_j
    best keeps the linearised prediction (least squares), predict how far along the segment from x_b
    towards x the budget lasts (JSD ~ sum_c dp_c^2 / (8 p_c)), keep the ``top`` pairs that promise the
    largest TV from A, bisect the segment from x_b towards each on the real JSD, and also check each kept
    pair's mixtures at ``edge_points`` values of w on the real JSD. Round 1 starts at
    x_b = A; each further round re-linearises at the best point so far. Only points checked feasible
    are returned (A itself, TV 0, when none is).
    """
    P, T = pair_b.shape[0], A0.shape[-1]
    dev = A0.device
    a = A0[pair_b, pair_h]  # (P, T, T): the real maps; row 0 is the <cls> row searched
    row0 = torch.zeros(T, dtype=torch.bool, device=dev)
    row0[0] = True
    key = mask[pair_b]  # (P, T)
    top = min(top, T * T)
    ar = torch.arange(top, device=dev)
    sb, sh = pair_b.repeat_interleave(top), pair_h.repeat_interleave(top)
    base_maps = a.repeat_interleave(top, 0)  # (P top, T, T)
    step = max(1, (1 << 24) // (T * T))
    upper = torch.ones(T, T, dtype=torch.bool, device=dev).triu()

    def jsd_of(rows: Tensor) -> Tensor:
        """JSD of the (P top, T) <cls> rows, row r in the map of pair r // top."""
        out = torch.zeros(rows.shape[0], device=dev)
        for s in range(0, rows.shape[0], step):
            sl = slice(s, s + step)
            out[sl] = run(torch.where(row0[:, None], rows[sl, None, :], base_maps[sl]), sb[sl], sh[sl])[1]
        return out

    def feasible(rows: Tensor) -> Tensor:
        return jsd_of(rows) <= eps

    best = a[:, 0].clone()  # (P, T) the best feasible <cls> row so far (A: TV 0)
    best_tv = torch.zeros(P, device=dev)
    for _ in range(rounds):
        xb = best.detach().clone().requires_grad_(True)
        pb = probs(torch.where(row0[:, None], xb[:, None, :], a), pair_b, pair_h)  # (P, C)
        C = pb.shape[1]
        J = torch.stack([torch.autograd.grad(pb[:, c].sum(), xb, retain_graph=c < C - 1)[0] for c in range(C)], 1)
        J, pb = J.detach(), pb.detach()  # (P, C, T), (P, C)
        cand = a[:, 0, None, :].repeat(1, top, 1)  # (P, top, T); unused slots stay at A
        pair_i = torch.zeros(P, top, dtype=torch.long, device=dev)
        pair_j = torch.zeros(P, top, dtype=torch.long, device=dev)
        pair_ok = torch.zeros(P, top, dtype=torch.bool, device=dev)
        with torch.no_grad():
            for i in range(P):  # one (C, T, T) table of pairs per row keeps memory at C T^2
                ai, xi, Ji = a[i, 0], best[i], J[i]
                d = Ji[:, :, None] - Ji[:, None, :]  # (C, T_i, T_j): J_i - J_j
                r0 = (Ji - (Ji @ xi)[:, None] + (pb[i] - p0[pair_b[i]])[:, None])[:, None, :]  # (C, 1, T_j)
                w = (-(d * r0).sum(0) / (d * d).sum(0).clamp_min(1e-30)).clamp(0.0, 1.0)  # (T, T); i = j: e_j
                dp = w * d + r0  # linearised p(x) - p at x = w e_i + (1 - w) e_j
                jsd_lin = (dp * dp / (8 * p0[pair_b[i]].clamp_min(1e-12)[:, None, None])).sum(0)
                tv = 0.5 * ((w - ai[:, None]).abs() + (1 - w - ai[None, :]).abs() + (1 - ai[:, None] - ai[None, :]))
                tv = torch.where(torch.eye(T, dtype=torch.bool, device=dev), 1 - ai[:, None], tv)
                reach = tv * (eps / jsd_lin.clamp_min(1e-30)).sqrt().clamp(max=1.0)
                valid = key[i][:, None] & key[i][None, :] & upper  # (i, j) and (j, i) are one edge
                reach = torch.where(valid, reach, torch.full_like(reach, -1.0)).flatten()
                k = min(top, int(valid.sum()))
                flat = reach.topk(k).indices
                ki, kj, wk = flat // T, flat % T, w.flatten()[flat]
                pair_i[i, :k], pair_j[i, :k], pair_ok[i, :k] = ki, kj, True
                cand[i, :k] = 0.0
                cand[i, ar[:k], ki] += wk
                cand[i, ar[:k], kj] += 1 - wk
            # Bisect each segment x_b -> candidate on the real JSD: lo is always a point checked feasible.
            start = best.repeat_interleave(top, 0)  # (P top, T)
            direction = cand.reshape(P * top, T) - start
            lo, hi = torch.zeros(P * top, device=dev), torch.ones(P * top, device=dev)
            at_one = feasible(start + direction)
            lo = torch.where(at_one, hi, lo)
            for _ in range(bisections):
                mid = 0.5 * (lo + hi)
                ok = feasible(start + mid[:, None] * direction) & ~at_one
                lo, hi = torch.where(ok, mid, lo), torch.where(ok | at_one, hi, mid)
            pts = (start + lo[:, None] * direction).view(P, top, T)
            # The linearisation is poor far from x_b: also search each kept pair's edge itself on the real JSD.
            edge = _edge_search(jsd_of, a[:, 0], pair_i, pair_j, pair_ok, eps, edge_points, bisections)
            pts = torch.cat([pts, edge], 1)
            tv = 0.5 * (pts - a[:, 0, None, :]).abs().sum(-1)  # (P, 2 top): the cls row is the only searched row
            tv, pick = tv.max(1)
            better = tv > best_tv
            best_tv = torch.where(better, tv, best_tv)
            best = torch.where(better[:, None], pts[torch.arange(P, device=dev), pick], best)
    return torch.where(row0[:, None], best[:, None, :], a), best_tv


def _edge_search(jsd_of, a: Tensor, pair_i: Tensor, pair_j: Tensor, pair_ok: Tensor, eps: float, points: int,
                 iters: int) -> Tensor:
    """The farthest feasible point found on each edge w e_i + (1 - w) e_j: (P, top, T) rows (A where none).

    Scan w on a grid of ``points`` values, refine the lowest-JSD one by golden-section search in its grid
    cell, and when that point is feasible bisect from it towards each end of the edge; keep the farthest in TV.
    """
    P, top = pair_i.shape
    T = a.shape[-1]
    dev = a.device
    ai = a.gather(1, pair_i)  # (P, top): A's mass on key i, on key j
    aj = a.gather(1, pair_j)

    def rows(w: Tensor) -> Tensor:  # (P, top) weights -> (P top, T) rows
        x = torch.zeros(P, top, T, device=dev)
        x.scatter_add_(2, pair_i[..., None], w[..., None])
        x.scatter_add_(2, pair_j[..., None], (1 - w)[..., None])
        return x.view(P * top, T)

    def jsd(w: Tensor) -> Tensor:
        return jsd_of(rows(w)).view(P, top)

    def tv(w: Tensor) -> Tensor:  # TV of the edge point from A (i != j; i = j is the vertex e_j at any w)
        same = pair_i == pair_j
        return torch.where(same, 1 - aj, 0.5 * ((w - ai).abs() + (1 - w - aj).abs() + (1 - ai - aj)))

    grid = torch.linspace(0.0, 1.0, points, device=dev)
    vals = torch.stack([jsd(g.expand(P, top)) for g in grid], -1)  # (P, top, G)
    tv_grid = torch.stack([tv(g.expand(P, top)) for g in grid], -1)
    tv_grid = torch.where(vals <= eps, tv_grid, torch.full_like(tv_grid, -1.0))  # -1: infeasible
    tv_best, g_idx = tv_grid.max(-1)
    w_best = grid[g_idx]
    # Golden-section search for the lowest JSD in the cell around the lowest grid value.
    h = 1.0 / max(points - 1, 1)
    c = grid[vals.argmin(-1)]
    lo, hi = (c - h).clamp(0.0, 1.0), (c + h).clamp(0.0, 1.0)
    r = (math.sqrt(5) - 1) / 2
    for _ in range(iters):
        m1, m2 = hi - r * (hi - lo), lo + r * (hi - lo)
        left = jsd(m1) <= jsd(m2)
        lo, hi = torch.where(left, lo, m1), torch.where(left, m2, hi)
    w_min = 0.5 * (lo + hi)
    ok = jsd(w_min) <= eps
    # From the feasible minimum, bisect towards BOTH ends of the edge and keep the point farther from A in TV: TV is
    # piecewise linear in w with its minimum at A's own split, so the feasible interval's far end can lie towards
    # either end of the edge, whichever end is farther from A.
    for end in (0.0, 1.0):
        inside, outside = w_min, torch.full_like(w_min, end)  # when the end itself is feasible, the grid has it
        for _ in range(iters):
            mid = 0.5 * (inside + outside)
            good = jsd(mid) <= eps
            inside, outside = torch.where(good, mid, inside), torch.where(good, outside, mid)
        tv_far = torch.where(ok, tv(inside), torch.full_like(w_min, -1.0))
        use = tv_far > tv_best
        w_best, tv_best = torch.where(use, inside, w_best), torch.where(use, tv_far, tv_best)
    found = (tv_best >= 0) & pair_ok
    return torch.where(found[..., None], rows(w_best).view(P, top, T), a[:, None, :])

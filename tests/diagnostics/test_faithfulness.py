"""Faithfulness explainers and metrics against known answers and independent computations."""

import copy
import math

import numpy as np
import pytest
import torch
from diag_helpers import random_batch, random_model
from scipy.stats import kendalltau

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.models import TransformerClassifier

CLS, MARK = 2, 5  # the <cls> id and the one token the hand-built model reads


def _one_token_model() -> TransformerClassifier:
    """Class 0's logit reads token MARK only: the <cls> query puts ~all attention on MARK's key, only MARK
    has a nonzero value, and nothing else reaches <cls>. Without MARK the attention output is 0 and class 1 wins.
    """
    m = TransformerClassifier(10, 2, embed_dim=4, num_heads=1, key_dim=1, ffn_dim=4, dropout=0.0,
                              positional="none")
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for ln in (m.layers[0].norm1, m.layers[0].norm2):
            ln.weight.fill_(1.0)
        emb = torch.zeros(10, 4)
        emb[CLS] = torch.tensor([0.0, 0.0, 1.0, -1.0])
        emb[MARK] = torch.tensor([1.0, 0.0, 0.0, 0.0])
        for t in (1, 3, 4, 6, 7, 8, 9):
            emb[t, 1:] = torch.randn(3, generator=torch.Generator().manual_seed(t))
        m.token_embedding.weight.copy_(emb)
        attn = m.layers[0].attn
        attn.q_proj.bias.fill_(1.0)
        attn.k_proj.weight[0, 0] = 30.0  # MARK's key logit 30 vs 0 for every other token
        attn.v_proj.weight[0, 0] = 1.0  # value = (x_0, 0, 0, 0): nonzero for MARK only
        attn.out_proj.weight[:, 0] = torch.tensor([1.0, -1.0, 0.0, 0.0])
        m.head.weight[0, 0] = 3.0
        m.head.bias[1] = 0.5
    return m.eval()


def _marked_batch(B=8, n=9, seed=0):
    """<cls> + n tokens, MARK once at a random position >= 1, other tokens from the non-special ids."""
    rng = np.random.default_rng(seed)
    ids = torch.tensor(rng.choice([1, 3, 4, 6, 7, 8, 9], size=(B, n + 1)))
    ids[:, 0] = CLS
    where = torch.tensor(rng.integers(1, n + 1, B))
    ids[torch.arange(B), where] = MARK
    return ids, torch.ones_like(ids, dtype=torch.bool), where


def _prob_of(model, ids, cls):
    """Probability of ``cls`` for one sequence run by itself (1, t)."""
    with torch.no_grad():
        return float(model(ids[None]).logits.softmax(-1)[0, cls])


def _argmax(model, ids):
    with torch.no_grad():
        return int(model(ids[None]).logits.argmax(-1))


# ------------------------------------------------------------------------------- one-token model
def test_one_token_model_known_answers():
    model = _one_token_model()
    ids, mask, where = _marked_batch()
    rep = F.faithfulness_report(model, ids, mask)
    s = rep["scores"]
    assert (rep["predicted"] == 0).all()
    for name in ("loo", "grad_input", "attention"):
        assert torch.equal(s[name].argmax(1), where), name
    B, n = ids.shape[0], ids.shape[1] - 1
    for b in range(B):
        kept = torch.cat([ids[b, : where[b]], ids[b, where[b] + 1 :]])
        drop = _prob_of(model, ids[b], 0) - _prob_of(model, kept, 0)  # the shorter sequence, run by itself
        assert drop > 0.3
        # Every bin removes MARK first, and nothing else matters: each bin's drop is the full drop.
        assert rep["per_example"]["loo/comprehensiveness"][b] == pytest.approx(drop, abs=1e-5)
        assert rep["per_example"]["grad_input/comprehensiveness"][b] == pytest.approx(drop, abs=1e-5)
        assert rep["per_example"]["loo/sufficiency"][b] == pytest.approx(0.0, abs=1e-5)
        assert rep["per_example"]["loo/flip_frac"][b] == pytest.approx(1 / n)
    # The seeded random order is a control: it does not put MARK first in general.
    assert (s["random"].argmax(1) == where).float().mean() < 0.5
    assert rep["metrics"]["random/comprehensiveness"] < rep["metrics"]["loo/comprehensiveness"]


def test_scores_are_zero_at_cls_and_padding_and_random_is_seeded():
    model = random_model()
    ids, mask = random_batch()
    s = F.explain(model, ids, mask, F.CHEAP_EXPLAINERS, seed=3)
    for name, v in s.items():
        assert v.shape == ids.shape and v.dtype == torch.float32, name
        assert (v[:, 0] == 0).all() and (v[~mask] == 0).all(), name
    assert torch.equal(F.explain(model, ids, mask, ["random"], seed=3)["random"], s["random"])
    assert not torch.equal(F.explain(model, ids, mask, ["random"], seed=4)["random"], s["random"])
    assert model.training is False


def test_attention_explainer_is_the_cls_row_mean_over_heads_and_mean_pooling_row():
    for pooling in ("cls", "mean"):
        model = random_model(pooling=pooling, layers=2)
        ids, mask = random_batch()
        with torch.no_grad():
            A = model(ids, mask, output_attentions=True).attentions[-1]  # (B, H, T, T)
        s = F.explain(model, ids, mask, ["attention"])["attention"]
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            row = A[b, :, 0, :n].mean(0) if pooling == "cls" else A[b, :, :n, :n].mean(0).mean(0)
            assert torch.allclose(s[b, 1:n], row[1:n], atol=1e-6)


def test_rollout_matches_explicit_product():
    model = random_model(layers=3, head_combine="add")
    ids, mask = random_batch()
    with torch.no_grad():
        atts = model(ids, mask, output_attentions=True).attentions
    s = F.explain(model, ids, mask, ["rollout"])["rollout"]
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        R = torch.eye(n, dtype=torch.float64)
        for A in atts:
            a = A[b, :, :n, :n].double().mean(0)
            R = (0.5 * torch.eye(n, dtype=torch.float64) + 0.5 * a / a.sum(-1, keepdim=True)) @ R
        assert torch.allclose(s[b, 1:n].double(), R[0, 1:n], atol=1e-5)


def test_norm_is_kobayashi_weighted_vector_norm():
    model = random_model(head_combine="concat")
    ids, mask = random_batch()
    attn = model.layers[0].attn
    with torch.no_grad():
        A = model(ids, mask, output_attentions=True).attentions[0]
        x = model.token_embedding(ids)  # positional none, post-norm: the attention input is the embedding
        v = attn.v_proj(x).view(*ids.shape, attn.num_heads, attn.value_dim)  # (B, T, H, dv)
        w_o = attn.out_proj.weight.t().reshape(attn.num_heads, attn.value_dim, -1)
    s = F.explain(model, ids, mask, ["norm"])["norm"]
    b, j = 0, 4
    ref = sum((A[b, h, 0, j] * (v[b, j, h] @ w_o[h])).norm() for h in range(attn.num_heads))
    assert float(s[b, j]) == pytest.approx(float(ref.detach()), rel=1e-5)


def test_effective_equals_attention_when_identifiable_and_differs_when_not():
    ids, mask = random_batch(B=2, T=9)
    add = random_model(head_combine="add")  # value size d = 8
    s = F.explain(add, ids[1:2, :6], mask[1:2, :6], ["attention", "effective"])  # 6 tokens <= d = 8: identifiable
    assert torch.allclose(s["attention"], s["effective"], atol=1e-6)
    concat = random_model(head_combine="concat")  # value size 4 < 9 tokens: a null space
    s = F.explain(concat, ids[:1], mask[:1], ["attention", "effective"])
    assert (s["attention"] - s["effective"]).abs().max() > 1e-3


# ------------------------------------------------------------------------------- erasure semantics
@pytest.mark.parametrize("head_combine", ["concat", "add"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("layers,norm_first", [(1, False), (1, True), (2, False)])
@pytest.mark.parametrize("positional", ["none", "learned"])
def test_loo_equals_running_the_shorter_sequence(head_combine, pooling, layers, norm_first, positional):
    model = random_model(head_combine=head_combine, pooling=pooling, layers=layers, norm_first=norm_first,
                          positional=positional)
    ids, mask = random_batch()
    loo = F.explain(model, ids, mask, ["loo"])["loo"]
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        seq = ids[b, :n]
        pred = _argmax(model, seq)
        p = _prob_of(model, seq, pred)
        for j in range(1, n):
            if positional == "none":  # the truly shorter sequence, run by itself
                ref = _prob_of(model, torch.cat([seq[:j], seq[j + 1 :]]), pred)
            else:  # learned positions stay with their slots: the one sequence without j's key, by itself
                keep = torch.ones(n, dtype=torch.bool)
                keep[j] = False
                with torch.no_grad():
                    ref = float(model(seq[None], keep[None]).logits.softmax(-1)[0, pred])
            assert float(loo[b, j]) == pytest.approx(p - ref, abs=1e-5)


@pytest.mark.parametrize("head_combine", ["concat", "add"])
@pytest.mark.parametrize("layers,chunk", [(1, None), (1, 40), (2, None), (2, 40)])
def test_erasure_metrics_against_explicit_loops(head_combine, layers, chunk, monkeypatch):
    """``chunk``: the masked copies run a few rows at a time (the one-layer shortcut's and the forward passes'
    chunks), which must not change any figure."""
    if chunk:
        from identifiable_transformers.diagnostics.faithfulness import readout
        monkeypatch.setattr(readout, "_CHUNK_WEIGHTS", chunk)  # 2 heads x 9 keys: 2 copies a chunk
        monkeypatch.setattr(readout, "_CHUNK_TOKENS", chunk)  # 9 keys: 4 copies a chunk
    model = random_model(head_combine=head_combine, layers=layers)
    ids, mask = random_batch()
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(ids.shape, generator=g)
    scores[0, 3] = scores[0, 5]  # a tie: broken by position (3 before 5)
    rep = F.faithfulness_report(model, ids, mask, explainers=["random"], precomputed={"random": scores})
    _check_erasure_against_loops(model, ids, mask, rep["per_example"], {"random": scores})
    assert rep["metrics"]["random/comprehensiveness"] == pytest.approx(
        float(rep["per_example"]["random/comprehensiveness"].mean()), abs=1e-6)


def _check_erasure_against_loops(model, ids, mask, per_example, scores):
    """comprehensiveness, sufficiency and flip_frac of each explainer against running every shorter sequence by
    itself (positional="none": removing a token is running the sequence without it); returns the flip fractions."""
    flips = {}
    for name, sc in scores.items():
        for b in range(ids.shape[0]):
            n_all = int(mask[b].sum())
            seq, n = ids[b, :n_all], n_all - 1
            pred = _argmax(model, seq)
            p = _prob_of(model, seq, pred)
            order = sorted(range(1, n_all), key=lambda j: (-float(sc[b, j]), j))
            comp, suff = [], []
            for k in F.AOPC_BINS:
                top = set(order[: min(n, max(1, math.ceil(k * n / 100)))])
                comp.append(p - _prob_of(model, seq[[j for j in range(n_all) if j not in top]], pred))
                suff.append(p - _prob_of(model, seq[[0, *sorted(top)]], pred))
            flip = 1.0
            for s in range(1, n + 1):
                if _argmax(model, seq[[j for j in range(n_all) if j not in order[:s]]]) != pred:
                    flip = s / n
                    break
            flips[name, b] = flip
            assert float(per_example[f"{name}/comprehensiveness"][b]) == pytest.approx(np.mean(comp), abs=1e-5)
            assert float(per_example[f"{name}/sufficiency"][b]) == pytest.approx(np.mean(suff), abs=1e-5)
            assert float(per_example[f"{name}/flip_frac"][b]) == pytest.approx(flip), (name, b)
    return flips


def test_erasure_of_many_explainers_at_once_scans_the_curve_only_to_its_first_flip(monkeypatch):
    """Three explainers (two with the same scores) on examples of up to 30 tokens, so that the removal curve is
    scanned over several windows: every figure as the explicit loops give it; the copy a second explainer shares
    runs once; and the curve is not run past a flip (fewer copies than every explainer's n + 2 K)."""
    from identifiable_transformers.diagnostics.faithfulness import readout

    model = random_model(layers=2, pooling="mean", seed=3)
    with torch.no_grad():
        model.head.weight.mul_(8.0)  # a sharp head: removals flip the prediction at various points
    ids, mask = random_batch(T=30, seed=2)
    g = torch.Generator().manual_seed(4)
    a = torch.randn(ids.shape, generator=g)
    rows = []
    real = readout._MaskedCopies.__call__
    monkeypatch.setattr(readout._MaskedCopies, "__call__", lambda self, e, m: rows.append(len(e)) or real(self, e, m))
    for names in (["a", "reversed"], ["a", "same", "reversed"]):
        rows.clear()
        scores = {"a": a, "same": a.clone(), "reversed": -a}
        rep = F.faithfulness_report(model, ids, mask, explainers=names, precomputed={k: scores[k] for k in names},
                                    random_draws=1)
        ran = sum(rows) - int(_scorable_count(mask))  # less the loo explainer's copies
        if len(names) == 2:
            flips = _check_erasure_against_loops(model, ids, mask, rep["per_example"], {k: scores[k] for k in names})
            two = ran
        else:
            _check_erasure_against_loops(model, ids, mask, rep["per_example"], {k: scores[k] for k in names})
            assert ran == two  # "same" added no copy
    n = mask.sum(1) - 1
    eager = 2 * int((n + 2 * len(F.AOPC_BINS)).sum())
    assert any(f < 0.5 for f in flips.values()) and ran < eager


def _scorable_count(mask):
    return (mask.sum(1) - 1).sum()


def test_cls_only_input_gives_nan_metrics_that_the_mean_skips():
    model = random_model()
    ids, mask = random_batch(B=2)
    mask[1, 1:] = False
    rep = F.faithfulness_report(model, ids, mask, explainers=["attention"])
    assert math.isnan(float(rep["per_example"]["attention/comprehensiveness"][1]))
    assert rep["metrics"]["attention/comprehensiveness"] == pytest.approx(
        float(rep["per_example"]["attention/comprehensiveness"][0]))


def test_bad_masks_are_rejected():
    model = random_model()
    ids, mask = random_batch()
    mask[0, 0] = False
    with pytest.raises(ValueError, match="position 0"):
        F.explain(model, ids, mask)
    with pytest.raises(ValueError, match="unknown explainers"):
        F.explain(model, ids, None, ["attentio"])


# ------------------------------------------------------------------------------- tau
@pytest.mark.parametrize("chunk", [None, 25])
def test_kendall_tau_b_known_values_and_scipy(chunk, monkeypatch):
    """``chunk``: a row (5 x 5 pairs) at a time, which must not change any value."""
    if chunk:
        from identifiable_transformers.diagnostics.faithfulness import agreement
        monkeypatch.setattr(agreement, "_CHUNK_PAIRS", chunk)
    x = torch.tensor([[0.0, 1, 2, 3, 4], [0.0, 1, 1, 2, 0]])
    y = torch.tensor([[0.0, 1, 3, 2, 4], [0.0, 1, 2, 3, 0]])
    valid = torch.tensor([[False, True, True, True, True], [False, True, True, True, False]])
    tau = F.kendall_tau_b(x, y, valid)
    assert float(tau[0]) == pytest.approx(4 / 6)  # 6 pairs, one discordant
    assert float(tau[1]) == pytest.approx(2 / math.sqrt(2 * 3))  # a tie in x: tau-b's denominator
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 4, (3, 12)).astype(float), rng.normal(size=(3, 12))  # chunk 25: 3 chunks of a row
    ours = F.kendall_tau_b(torch.tensor(a), torch.tensor(b), torch.ones(3, 12, dtype=torch.bool))
    for i in range(3):
        assert float(ours[i]) == pytest.approx(kendalltau(a[i], b[i]).statistic, abs=1e-12)
    short = F.kendall_tau_b(x[:1], y[:1], torch.tensor([[False, True, False, False, False]]))
    assert math.isnan(float(short[0]))  # n < 2: skipped


def test_tau_of_loo_with_itself_is_one():
    model = random_model()
    ids, mask = random_batch(B=3)
    rep = F.faithfulness_report(model, ids, mask, explainers=["loo", "grad_input"])
    assert rep["metrics"]["loo/tau_loo"] == pytest.approx(1.0)
    t = rep["per_example"]["grad_input/tau_loo"]
    loo, gi = rep["scores"]["loo"], rep["scores"]["grad_input"]
    for b in range(3):
        n = int(mask[b].sum())
        assert float(t[b]) == pytest.approx(kendalltau(gi[b, 1:n], loo[b, 1:n]).statistic, abs=1e-6)


# ------------------------------------------------------------------------------- gradients
def test_integrated_gradients_completeness():
    # Learned positions (the default): with positional="none" the all-<pad> baseline is a zero input,
    # where post-norm LayerNorm is singular and a 64-step Riemann sum cannot converge.
    model = random_model(head_combine="add", layers=2, positional="learned")
    ids, mask = random_batch()
    scores, delta = F.integrated_gradients(model, ids, mask, n_steps=64)
    with torch.no_grad():
        logits = model(ids, mask).logits
        base = model(torch.full_like(ids, model.pad_id), mask).logits
    pred = logits.argmax(-1)
    gap = (logits - base).gather(1, pred[:, None]).squeeze(1)
    assert (gap.abs() > 0.05).all()  # the check below is not vacuous
    assert (delta.abs() < 0.01).all()
    assert (scores[:, 0] == 0).all() and (scores[~mask] == 0).all()


def test_grad_input_matches_autograd():
    model = random_model(positional="learned")
    ids, mask = random_batch()
    s = F.explain(model, ids, mask, ["grad_input"])["grad_input"]
    emb = model.token_embedding(ids).detach().requires_grad_(True)
    x = emb + model.position_embedding.weight[: ids.shape[1]]
    for layer in model.layers:
        x, _ = layer(x, mask)
    logits = model.head(x[:, 0])
    pred = logits.argmax(-1)
    (g,) = torch.autograd.grad(logits.gather(1, pred[:, None]).sum(), emb)
    ref = (g * emb).sum(-1).masked_fill(~mask, 0)
    assert torch.allclose(s[:, 1:], ref[:, 1:].detach(), atol=1e-6)


# ------------------------------------------------------------------------------- uniform attention
def test_uniform_swap_is_softmax_of_zero_logits():
    model = random_model(head_combine="add", layers=2)
    ids, mask = random_batch()
    flat = copy.deepcopy(model)
    with torch.no_grad():
        for layer in flat.layers:  # zero queries and keys: softmax of zeros = 1/n over the real keys
            for lin in (layer.attn.q_proj, layer.attn.k_proj):
                lin.weight.zero_()
                lin.bias.zero_()
        ref = flat(ids, mask).logits
    assert torch.allclose(F.uniform_attention_logits(model, ids, mask), ref, atol=1e-6)


def test_uniform_swap_leaves_constant_value_model_unchanged_and_gap():
    model = random_model(head_combine="concat")
    with torch.no_grad():
        model.layers[0].attn.v_proj.weight.zero_()
        model.layers[0].attn.v_proj.bias.normal_()
    ids, mask = random_batch()
    with torch.no_grad():
        logits = model(ids, mask).logits
    assert torch.allclose(F.uniform_attention_logits(model, ids, mask), logits, atol=1e-6)
    labels = logits.argmax(-1)
    rep = F.faithfulness_report(model, ids, mask, labels=labels, explainers=["attention"])
    assert rep["uniform_acc_gap"] == 0.0
    assert F.faithfulness_report(model, ids, mask, explainers=["attention"])["uniform_acc_gap"] is None


def test_uniform_gap_of_the_one_token_model():
    # Uniform attention dilutes MARK's value to 1/n: class 0 still wins iff 3 * LN(...)_0 > 0.5.
    model = _one_token_model()
    ids, mask, _ = _marked_batch()
    labels = torch.zeros(ids.shape[0], dtype=torch.long)
    rep = F.faithfulness_report(model, ids, mask, labels=labels, explainers=["attention"])
    u = F.uniform_attention_logits(model, ids, mask).argmax(-1)
    assert rep["uniform_acc_gap"] == pytest.approx(1.0 - float((u == 0).double().mean()))

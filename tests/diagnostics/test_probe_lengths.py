"""Probes across every length (issue 30): the stratified probe, cumulative length bins, per-bin metrics of both
callbacks against an explicit loop over the per-example reports, and the identifiability maths on a device."""

import json
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from diag_helpers import VOCAB, TinyData, TinyModule
from lightning.pytorch.loggers import CSVLogger

from identifiable_transformers.diagnostics import attention_identifiability
from identifiable_transformers.diagnostics.callbacks.faithfulness import FaithfulnessCallback, binned_metrics
from identifiable_transformers.diagnostics.callbacks.identifiability import IdentifiabilityCallback, summarize_report
from identifiable_transformers.diagnostics.callbacks.probes import (
    doubling_strata,
    resolve_length_bins,
    select_probe_indices,
)
from identifiable_transformers.diagnostics.faithfulness import CHEAP_EXPLAINERS, faithfulness_report
from identifiable_transformers.diagnostics.faithfulness import uniform_attention_logits as uniform_logits
from identifiable_transformers.models import TransformerClassifier


# ------------------------------------------------------------------------------------------- bins
def test_length_bins_resolve_the_symbols_and_clip_to_the_longest_length():
    default = ["dv+1", "2d+2", "max/2", "max"]
    # d = 64, 4 heads: concat d_v + 1 = 17, add 65; 2d + 2 = 130
    assert resolve_length_bins(default, embed_dim=64, head_stochastic=17, max_length=512) == [17, 130, 256, 512]
    assert resolve_length_bins(default, embed_dim=64, head_stochastic=65, max_length=512) == [65, 130, 256, 512]
    # rt_offline (128 tokens): 2d + 2 = 130 holds the same examples as 128, so it is the max bin
    assert resolve_length_bins(default, embed_dim=64, head_stochastic=17, max_length=128) == [17, 64, 128]
    assert resolve_length_bins([40, "max", 300], embed_dim=8, head_stochastic=3, max_length=100) == [40, 100]
    assert resolve_length_bins([], embed_dim=8, head_stochastic=3, max_length=100) == []
    for bad in (["d+1"], [0], [True], [1.5]):
        with pytest.raises(ValueError, match="length_bins"):
            IdentifiabilityCallback(length_bins=bad)
    with pytest.raises(ValueError, match="max_length"):
        FaithfulnessCallback(max_length="half")


# --------------------------------------------------------------------------------- the probe set
def _imdb_like_lengths(n, seed=0):
    """Review lengths (tokens, <cls> included): a log-normal around 200, clipped to [4, 512]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(200), 1.0, n)), 4, 512).astype(int)


def test_the_stratified_probe_covers_every_stratum_and_every_bin():
    lengths = _imdb_like_lengths(3000)
    strata = doubling_strata(512)
    assert strata == [8, 16, 32, 64, 128, 256, 512]
    idx = select_probe_indices(lengths, 64, seed=0, max_length=512, strata=strata)
    assert idx == select_probe_indices(lengths, 64, seed=0, max_length=512, strata=strata)  # seeded
    assert idx != select_probe_indices(lengths, 64, seed=1, max_length=512, strata=strata)
    assert len(set(idx)) == 64 and idx == sorted(idx, key=lambda i: (lengths[i], i))
    picked = lengths[idx]
    # every interval (lo, hi] gets an equal share (64 / 7 = 9 or 10) unless it has fewer examples: then all of them
    lower = [0, *strata[:-1]]
    available = [int(((lengths > lo) & (lengths <= hi)).sum()) for lo, hi in zip(lower, strata)]
    got = [int(((picked > lo) & (picked <= hi)).sum()) for lo, hi in zip(lower, strata)]
    assert sum(got) == 64
    for a, g in zip(available, got):
        assert g == a if a < 9 else g >= 9, (available, got)
    assert min(available) < 9  # the test data has a sparse short stratum, whose share the others took up
    # every default bin of both designs holds probes (d = 64, max_length 512), the long ones far more than the
    # plain range spread gives the short one
    for b in (17, 65, 130, 256, 512):
        assert (picked <= b).sum() >= min(9, (lengths <= b).sum()), b
    assert (picked > 256).sum() >= 9
    # no strata: the old draw, targets evenly spaced over the whole range
    plain = lengths[select_probe_indices(lengths, 64, seed=0, max_length=512)]
    assert (plain <= 17).sum() < (picked <= 17).sum()


def test_strata_share_the_probe_equally_and_redistribute_what_a_stratum_cannot_fill():
    lengths = np.r_[np.full(3, 5), np.arange(9, 17).repeat(10), np.arange(17, 33).repeat(10)]  # 3, 80, 160
    idx = select_probe_indices(lengths, 30, seed=0, strata=[8, 16, 32])
    picked = lengths[idx]
    counts = ((picked <= 8).sum(), ((picked > 8) & (picked <= 16)).sum(), (picked > 16).sum())
    assert counts == (3, 13, 14)  # round-robin from the longest: it gets the odd one
    assert picked.max() <= 32 and len(set(idx)) == 30
    assert len(select_probe_indices(lengths, 1000, seed=0, strata=[8, 16])) == len(lengths)  # too few: all


# ------------------------------------------------------------------------------ identifiability
def _model(combine="concat", key_dim=2, **kw):
    torch.manual_seed(0)
    return TransformerClassifier(VOCAB, 2, embed_dim=16, num_heads=4, head_combine=combine, key_dim=key_dim,
                                 max_len=64, **kw).eval()


def _batch(lengths, seed=0):
    rng = np.random.default_rng(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.tensor([2, *rng.integers(3, VOCAB, n - 1)])
    return ids, ids != 0


def test_identifiability_bin_metrics_equal_an_explicit_loop_over_the_examples():
    lengths = [3, 5, 5, 8, 12, 20, 20, 30]  # a known probe
    ids, mask = _batch(lengths)
    model = _model(num_layers=2)
    report = attention_identifiability(model, ids, mask)
    metrics = summarize_report(report, bins=[2, 5, 10, 20, 64])
    assert "val/ident/len_le_2/null_dim" not in metrics  # no probe that short: no keys
    metric_keys = {"null_dim": "null_dim", "stochastic_null_dim": "stochastic_null_dim", "alt_tv": "alt_attention_tv",
                   "effective_gap": "effective_gap", "sigma_ratio": "sigma_ratio", "entropy": "attention_entropy"}
    for b, count in ((5, 3), (10, 4), (20, 7), (64, 8)):
        p = f"val/ident/len_le_{b}"
        assert metrics[f"{p}/probe_count"] == count
        rows = [i for i, n in enumerate(lengths) if n <= b]
        for name, key in metric_keys.items():
            values = [float(report[key][i, l, h]) for i in rows for l in range(2) for h in range(4)]
            assert metrics[f"{p}/{name}"] == pytest.approx(sum(values) / len(values), rel=1e-12, abs=1e-15), name
        heads = [(i, l, h) for i in rows for l in range(2) for h in range(4)]
        assert metrics[f"{p}/identifiable_frac"] == pytest.approx(
            sum(int(report["null_dim"][x]) == 0 for x in heads) / len(heads))
        assert metrics[f"{p}/stochastic_identifiable_frac"] == pytest.approx(
            sum(int(report["stochastic_null_dim"][x]) == 0 for x in heads) / len(heads))
        joint = [int(report["joint_null_dim"][i, l]) for i in rows for l in range(2)]
        assert metrics[f"{p}/joint_null_dim"] == pytest.approx(sum(joint) / len(joint))
        assert metrics[f"{p}/joint_identifiable_frac"] == pytest.approx(sum(j == 0 for j in joint) / len(joint))
        assert metrics[f"{p}/witness_rel_error_max"] == max(float(report["witness_rel_error"][x]) for x in heads)
    # the whole-probe bin is the overall mean; concat d_v = 4: closed form max(0, n - 4) per head
    assert metrics["val/ident/len_le_64/null_dim"] == pytest.approx(metrics["val/ident/null_dim"])
    assert metrics["val/ident/len_le_10/null_dim"] == pytest.approx(np.mean([0, 1, 1, 4]))


def test_the_maths_gives_identical_results_on_every_device_path():
    """device=None (the CPU, as before), device="cpu", and, with a GPU, the GPU (ranks equal, values close)."""
    ids, mask = _batch([3, 6, 6, 17, 30])
    model = _model("add")
    ref = attention_identifiability(model, ids, mask, return_maps=True)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        got = attention_identifiability(model.to(dev), ids.to(dev), mask.to(dev), return_maps=True, device=dev)
        for key, value in ref.items():
            if isinstance(value, torch.Tensor):
                assert got[key].device.type == "cpu", key
                if dev == "cpu" or value.dtype == torch.long:
                    assert torch.equal(got[key], value), (dev, key)
                else:
                    torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-9)
        for a, b in zip(got["maps"], ref["maps"]):
            for key in a:
                torch.testing.assert_close(a[key], b[key], rtol=0 if dev == "cpu" else 1e-6, atol=1e-9)
    model.cpu()
    module = SimpleNamespace(device=torch.device("mps"))
    assert IdentifiabilityCallback().maths_device(module) == torch.device("cpu")  # no float64 on MPS
    cuda_module = SimpleNamespace(device=torch.device("cuda"))
    assert IdentifiabilityCallback(device="cpu").maths_device(cuda_module).type == "cpu"
    assert IdentifiabilityCallback().maths_device(cuda_module).type == "cuda"
    assert IdentifiabilityCallback().maths_device(SimpleNamespace(device=torch.device("cpu"))).type == "cpu"


# ------------------------------------------------------------------------------ through a fit
def _rows(n_rows, seed, lo=2, hi=60):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_rows):
        n = int(rng.integers(lo, hi))
        out.append({"input_ids": [2] + rng.integers(3, VOCAB, n - 1).tolist(), "labels": int(rng.integers(0, 2)),
                    "rationale": [1, n - 1] if n > 2 else [1]})
    return out


def long_data():
    return TinyData(_rows(32, 0), _rows(80, 1), has_rationales=True, max_length=60)


def _fit(tmp_path, faith):
    ident = IdentifiabilityCallback(probe_size=24, plots=False, key_aware_examples=0)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, default_root_dir=tmp_path,
                         callbacks=[ident, faith], logger=CSVLogger(tmp_path, name="csv"), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    module = TinyModule(_model("concat").train())
    trainer.fit(module, datamodule=long_data())
    return trainer, module, json.loads((tmp_path / "identifiability" / "probe.json").read_text())


def _bin_means(per_example, lengths, b):
    """The explicit loop: mean of one per-example metric over the examples of at most b tokens, NaN skipped."""
    values = [float(v) for v, n in zip(per_example, lengths) if n <= b and not np.isnan(float(v))]
    return sum(values) / len(values)


def test_both_callbacks_log_every_bin_and_faithfulness_bins_equal_an_explicit_loop(tmp_path):
    torch.manual_seed(0)
    trainer, module, probe = _fit(tmp_path, FaithfulnessCallback(final=False, random_draws=2))
    # d = 16, concat, 4 heads: dv+1 = 5, 2d+2 = 34, max/2 = 30, max = 60 (the data's max_length, not 2d + 2)
    assert probe["length_bins"] == [5, 30, 34, 60] and probe["max_probe_length"] == 60
    assert probe["strata"] == [8, 16, 32, 60] and max(probe["lengths"]) > 34
    logged = trainer.logged_metrics
    lengths = probe["lengths"]
    for b in probe["length_bins"]:
        count = sum(n <= b for n in lengths)
        assert float(logged[f"val/ident/len_le_{b}/probe_count"]) == count
        assert float(logged[f"val/ident/len_le_{b}/null_dim"]) == pytest.approx(
            np.mean([max(0, n - 4) for n in lengths if n <= b]))  # concat d_v = 4: the closed form
    # faithfulness: recompute the per-example report on the probe with the trained model, then bin by hand
    batch = long_data().collate([long_data().val_dataset[i] for i in probe["indices"]])
    rationale = torch.zeros_like(batch["attention_mask"])
    for r, i in enumerate(probe["indices"]):
        rationale[r, long_data().val_dataset[i]["rationale"]] = True
    rep = faithfulness_report(module.model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                              explainers=CHEAP_EXPLAINERS, seed=0, rationale_mask=rationale, random_draws=2)
    uniform = uniform_logits(module.model, batch["input_ids"], batch["attention_mask"]).argmax(-1)
    gap = [float(p == y) - float(u == y) for p, u, y in zip(rep["predicted"], uniform, batch["labels"])]
    assert float(logged["val/faith/uniform_acc_gap"]) == pytest.approx(rep["uniform_acc_gap"], abs=1e-6)
    for b in probe["length_bins"]:
        assert float(logged[f"val/faith/len_le_{b}/uniform_acc_gap"]) == pytest.approx(
            _bin_means(gap, lengths, b), abs=1e-6)
        for key, values in rep["per_example"].items():
            e, m = key.split("/")
            assert float(logged[f"val/faith/{e}/len_le_{b}/{m}"]) == pytest.approx(
                _bin_means(values, lengths, b), rel=1e-5, abs=1e-6), (b, key)
    # bins that end exactly at probe lengths (an off-by-one at the edge would show)
    edges = sorted({lengths[3], lengths[len(lengths) // 2]})
    binned = binned_metrics({**rep["per_example"], "uniform_acc_gap": torch.tensor(gap)}, lengths, edges)
    for b in edges:
        assert binned[f"val/faith/len_le_{b}/probe_count"] == sum(n <= b for n in lengths)
        assert binned[f"val/faith/len_le_{b}/uniform_acc_gap"] == pytest.approx(_bin_means(gap, lengths, b))
        for key, values in rep["per_example"].items():
            e, m = key.split("/")
            assert binned[f"val/faith/{e}/len_le_{b}/{m}"] == pytest.approx(_bin_means(values, lengths, b), rel=1e-9)
    saved = json.loads((tmp_path / "identifiability" / "epoch_000" / "faith_metrics.json").read_text())
    assert saved["val/faith/attention/len_le_5/comprehensiveness"] == pytest.approx(
        float(logged["val/faith/attention/len_le_5/comprehensiveness"]))


def test_faithfulness_max_length_scores_only_the_short_part_of_the_probe(tmp_path):
    trainer, _, probe = _fit(tmp_path, FaithfulnessCallback(final=False, random_draws=1, max_length="2d+2"))
    ex = json.loads((tmp_path / "identifiability" / "explanations.json").read_text())
    short = [(i, n) for i, n in zip(probe["indices"], probe["lengths"]) if n <= 34]
    assert list(zip(ex["indices"], ex["lengths"])) == short and len(short) < len(probe["indices"])
    logged = trainer.logged_metrics
    assert float(logged["val/faith/len_le_34/probe_count"]) == len(short)
    assert "val/faith/attention/len_le_30/comprehensiveness" in logged
    assert not any("len_le_60" in k for k in logged if k.startswith("val/faith/"))
    assert "val/ident/len_le_60/null_dim" in logged  # the identifiability probe keeps every length


def test_long_attention_maps_are_averaged_down_to_the_image_size():
    """A 300-token map becomes a 100 x 100 image of 3 x 3 block means (the W&B probe table at 512 tokens)."""
    from matplotlib import colormaps

    from identifiable_transformers.diagnostics.callbacks.media import attention_image

    rng = np.random.default_rng(0)
    w = rng.random((300, 300))
    image = attention_image(w, pixels=128)
    assert image.shape == (100, 100, 3)
    blocks = np.array([[w[3 * i : 3 * i + 3, 3 * j : 3 * j + 3].mean() for j in range(100)] for i in range(100)])
    expected = (colormaps["viridis"](blocks / blocks.max())[..., :3] * 255).astype(np.uint8)
    assert np.array_equal(image, expected)
    assert attention_image(rng.random((20, 20)), pixels=128).shape == (120, 120, 3)  # short maps: scaled up as before


def test_a_faithfulness_max_length_below_every_probe_is_a_user_error(tmp_path):
    with pytest.raises(ValueError, match="max_length=1 .* leaves no probe example"):
        _fit(tmp_path, FaithfulnessCallback(final=False, random_draws=1, max_length=1))

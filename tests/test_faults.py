"""Faults a user meets through train.py and analyze.py: bad labels, runs that train nothing,
damaged, foreign and crafted checkpoints, and resuming into a new run directory."""

import hashlib
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from identifiable_transformers.modules.checkpoint import CheckpointError
from identifiable_transformers.modules.classifier import TextClassifier
from identifiable_transformers.run.training import run

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- labels
def _csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


TRAIN = [(f"good film number {i}", "pos") if i % 2 else (f"bad film number {i}", "neg") for i in range(40)]
TRAIN_INT = [(t, "1" if y == "pos" else "0") for t, y in TRAIN]


def _local(make_cfg, tmp_path, train, **files):
    extra = [f"data.{split}_file={_csv(tmp_path / f'{split}.csv', rows)}" for split, rows in files.items()]
    return make_cfg("data=local", f"data.train_file={_csv(tmp_path / 'train.csv', train)}", *extra)


@pytest.mark.parametrize("split", ["test", "validation"])
def test_a_label_only_another_split_has_is_an_error(make_cfg, tmp_path, split):
    rows = [("a fine film", "pos"), ("a dull film", "neutral")]
    with pytest.raises(ValueError, match=f"label 'neutral' in the {split} split at .*line 3.* never occurs in the "
                                         "training split"):
        run(_local(make_cfg, tmp_path, TRAIN, **{split: rows}))


def test_an_integer_label_only_the_test_split_has_is_an_error(make_cfg, tmp_path):
    with pytest.raises(ValueError, match="label '2' in the test split at .*line 2.* never occurs"):
        run(_local(make_cfg, tmp_path, TRAIN_INT, test=[("a fine film", "2"), ("a dull film", "0")]))


def test_a_fractional_label_is_an_error(make_cfg, tmp_path):
    with pytest.raises(ValueError, match=r"label '1.5' in the train split at .*line 4.* is not an integer class id"):
        run(_local(make_cfg, tmp_path, [*TRAIN_INT[:2], ("an odd film", "1.5"), *TRAIN_INT[2:]]))


def test_integral_decimal_labels_are_the_integers(tmp_path):
    from identifiable_transformers.data import TextDataModule

    f = _csv(tmp_path / "train.csv", [(t, f"{y}.0" if i % 3 == 0 else y) for i, (t, y) in enumerate(TRAIN_INT)])
    dm = TextDataModule(source="local", train_file=str(f), cache_dir=str(tmp_path / "c"), min_frequency=1)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.label_names == ["0", "1"]  # "1.0" is the class 1, not a third class


# ----------------------------------------------------------------------------- runs that train nothing
@pytest.mark.parametrize("override", ["trainer.max_epochs=0", "trainer.limit_train_batches=0"])
def test_a_run_that_trains_no_step_reports_no_test_metrics(make_cfg, tmp_path, override):
    with pytest.raises(ValueError, match="training ran no step"):
        run(make_cfg(override, "callbacks=[model_checkpoint]"))
    assert not (tmp_path / "run" / "metrics.json").exists()


# ----------------------------------------------------------------------------- checkpoints
@pytest.fixture
def trained(make_cfg, tmp_path):
    """A short run with checkpoints: (result, checkpoints dir)."""
    result = run(make_cfg("trainer.max_epochs=2", "callbacks=[model_checkpoint,last_checkpoint]", "test=false",
                          out="trained"))
    return result, tmp_path / "trained" / "checkpoints"


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def test_checkpoints_have_a_checksum_and_the_tokenizer_once(trained):
    result, ckpts = trained
    files = sorted(p.name for p in ckpts.glob("*.ckpt"))
    assert files == sorted([Path(result["best_model_path"]).name, "last.ckpt"])
    assert sorted(p.name for p in ckpts.glob("*.sha256")) == [f + ".sha256" for f in files]  # replaced ones removed
    for f in files:
        line = (ckpts / f"{f}.sha256").read_text()
        assert line == f"{hashlib.sha256((ckpts / f).read_bytes()).hexdigest()}  {f}\n"  # `sha256sum -c` format
    tokenizer = (Path(ckpts).parent / "tokenizer.json").read_text()
    ckpt = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True)
    import json

    found = [s for s in _strings(ckpt) if s.startswith("{") and '"WordLevel"' in s]
    assert len(found) == 1 and json.loads(found[0]) == json.loads(tokenizer)


def _flip(src: Path, dst: Path, keep_checksum: bool) -> Path:
    data = bytearray(src.read_bytes())
    for i in (len(data) // 3, len(data) // 2):
        data[i] ^= 0xFF
    dst.write_bytes(bytes(data))
    if keep_checksum:
        (dst.parent / f"{dst.name}.sha256").write_text((src.parent / f"{src.name}.sha256").read_text())
    return dst


def test_damaged_and_foreign_checkpoints_are_refused_with_one_line(make_cfg, trained, tmp_path):
    _, ckpts = trained
    good = ckpts / "last.ckpt"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.ckpt").write_bytes(b"")
    (bad / "truncated.ckpt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (bad / "random.ckpt").write_bytes(os.urandom(4096))
    torch.save({"weights": torch.zeros(3)}, bad / "foreign.ckpt")
    _flip(good, bad / "flipped.ckpt", keep_checksum=True)
    pwned = tmp_path / "pwned"

    class Code:  # pickles as a call of open(pwned, "w")
        def __reduce__(self):
            return open, (str(pwned), "w")

    torch.save({"state_dict": {}, "hyper_parameters": Code()}, bad / "code.ckpt")
    cases = {"empty": "is empty", "truncated": "not a readable PyTorch checkpoint", "code": "never loaded",
             "random": "not a readable PyTorch checkpoint", "foreign": "not a checkpoint written by train.py",
             "flipped": "does not match its checksum"}
    for name, message in cases.items():
        for mode in (["train=false"], ["train=true"]):  # evaluating it, resuming from it
            with pytest.raises(CheckpointError, match=message) as ei:
                run(make_cfg(*mode, f"ckpt_path={bad / name}.ckpt", out=f"{name}-{mode[0]}"))
            assert str(bad / name) in str(ei.value) and "\n" not in str(ei.value)
        with pytest.raises(CheckpointError, match=message):
            TextClassifier.load_from_checkpoint(bad / f"{name}.ckpt")
    assert not pwned.exists()
    # a model of another size: the differing settings and shapes are named
    with pytest.raises(CheckpointError, match=r"another size.*embed_dim.*shapes"):
        run(make_cfg("train=false", "model.embed_dim=32", f"ckpt_path={good}", out="size"))


def test_a_checkpoint_trained_with_another_tokenizer_is_refused(make_cfg, trained, tmp_path):
    import json

    _, ckpts = trained
    ckpt = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True)
    tok = json.loads(ckpt["hyper_parameters"]["tokenizer_json"])
    vocab = tok["model"]["vocab"]
    a, b = "good", "bad"
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, so the weights fit: only the words differ
    ckpt["hyper_parameters"]["tokenizer_json"] = json.dumps(tok)
    torch.save(ckpt, tmp_path / "other_tokenizer.ckpt")
    with pytest.raises(CheckpointError, match="another tokenizer"):
        run(make_cfg("train=false", f"ckpt_path={tmp_path / 'other_tokenizer.ckpt'}", out="tok"))


def test_a_checkpoint_without_checksum_loads_with_a_warning(trained, tmp_path):
    _, ckpts = trained
    alone = tmp_path / "alone.ckpt"
    alone.write_bytes((ckpts / "last.ckpt").read_bytes())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = TextClassifier.load_from_checkpoint(alone)
    assert any("unverified" in str(w.message) for w in caught)
    assert module.tokenizer is not None and module.label_names == ["negative", "positive"]


def test_best_checkpoint_damaged_after_training_is_refused_at_test(make_cfg, tmp_path, monkeypatch):
    import identifiable_transformers.run.training as training

    real = training.read_checkpoint

    def damage_then_read(path, what="checkpoint"):  # the disk changes the file between save and test
        if what == "best checkpoint":
            _flip(Path(path), Path(path), keep_checksum=False)
        return real(path, what)

    monkeypatch.setattr(training, "read_checkpoint", damage_then_read)
    with pytest.raises(CheckpointError, match="best checkpoint .*does not match its checksum"):
        run(make_cfg("callbacks=[model_checkpoint]"))


# ----------------------------------------------------------------------------- analyze.py
def test_analyze_never_runs_a_target_named_by_a_checkpoint(trained, tmp_path, run_analyze, rewrite_checkpoint):
    _, ckpts = trained
    pwned = tmp_path / "pwned"
    crafted = rewrite_checkpoint(ckpts / "last.ckpt", tmp_path / "crafted.ckpt",
                             _target_="builtins.open", file=str(pwned), mode="w")
    assert torch.load(crafted, weights_only=True)  # passes weights_only loading
    with pytest.raises(ValueError, match="builtins.open"):
        run_analyze([f"ckpt_path={crafted}", "split=validation", f"output_dir={tmp_path / 'out'}",
                     f"paths.cache_dir={tmp_path / 'cache'}"])
    assert not pwned.exists()


def test_analyze_uses_its_own_cache_dir(trained, tmp_path, run_analyze, rewrite_checkpoint):
    _, ckpts = trained
    elsewhere = rewrite_checkpoint(ckpts / "last.ckpt", tmp_path / "elsewhere.ckpt",
                                   cache_dir="/nonexistent/training/cache")
    cache = tmp_path / "analyze_cache"
    path = run_analyze([f"ckpt_path={elsewhere}", "split=validation", "num_examples=2",
                        f"output_dir={tmp_path / 'out'}", f"paths.cache_dir={cache}"])
    assert Path(path).is_file() and list(cache.rglob("meta.json"))
    assert not Path("/nonexistent/training/cache").exists()


# ----------------------------------------------------------------------------- resuming into a new directory
# 3 epochs of 4 steps; a tiny learning rate (1e-5 broke the tie once evaluation splits were shuffled), so that the
# later epochs tie with epoch 0 on val/acc while their weights (and test loss) still differ.
TIES = ["trainer.max_epochs=3", "trainer.deterministic=true", "callbacks=[model_checkpoint,last_checkpoint]",
        "model.lr=1e-6", "test=true"]


def test_resume_into_a_new_directory_tests_the_same_best_checkpoint(make_cfg, tmp_path, run_killed_at):
    straight = run(make_cfg(*TIES, out="straight"))
    assert straight["best_epoch"] == 0, "precondition: later epochs only tie, so epoch 0 stays best"
    run_killed_at(make_cfg(*TIES, out="killed"), 6)
    resumed = run(make_cfg(*TIES, f"ckpt_path={tmp_path / 'killed' / 'checkpoints' / 'last.ckpt'}", out="resumed"))

    assert resumed["metrics"] == straight["metrics"]  # test/* included: the same best checkpoint was tested
    assert (resumed["best_epoch"], resumed["best_val_acc"]) == (straight["best_epoch"], straight["best_val_acc"])
    assert Path(resumed["best_model_path"]).parent == tmp_path / "resumed" / "checkpoints"  # self-contained
    assert (tmp_path / "resumed" / "checkpoints" / "epoch_000.ckpt.sha256").is_file()
    assert (tmp_path / "killed" / "checkpoints" / "epoch_000.ckpt").is_file()  # the old run is left alone
    # testing epoch 0's checkpoint restores callback states: the history must still hold all 3 epochs
    for folder in ("straight", "resumed"):
        rows = (tmp_path / folder / "metrics_history.csv").read_text().splitlines()
        assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2"], folder


# ----------------------------------------------------------------------------- through the command line
def test_cli_refuses_a_damaged_checkpoint(trained, tmp_path, cache_dir):
    _, ckpts = trained
    flipped = _flip(ckpts / "last.ckpt", tmp_path / "flipped.ckpt", keep_checksum=True)
    proc = run_cli(
        [sys.executable, str(ROOT / "train.py"), "train=false", f"ckpt_path={flipped}", "logger=none", "trainer=cpu",
         "model.embed_dim=16", "model.ffn_dim=32", "data.max_length=64", "data.batch_size=16",
         f"paths.log_dir={tmp_path}/logs", f"paths.cache_dir={cache_dir}"],
        cwd=tmp_path, timeout=600, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode != 0
    assert "does not match its checksum" in proc.stderr and str(flipped) in proc.stderr


def test_cli_analyze_refuses_a_crafted_checkpoint(trained, tmp_path, rewrite_checkpoint):
    _, ckpts = trained
    pwned = tmp_path / "pwned"
    crafted = rewrite_checkpoint(ckpts / "last.ckpt", tmp_path / "crafted.ckpt",
                             _target_="builtins.open", file=str(pwned), mode="w")
    proc = run_cli(
        [sys.executable, str(ROOT / "analyze.py"), f"ckpt_path={crafted}", "split=validation",
         f"output_dir={tmp_path / 'out'}", f"paths.cache_dir={tmp_path / 'cache'}", f"paths.log_dir={tmp_path}/logs"],
        cwd=tmp_path, timeout=600, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode != 0
    assert "builtins.open" in proc.stderr and "never run" in proc.stderr
    assert not pwned.exists()

"""SIGTERM inside a per-epoch diagnostic pass (the identifiability probe, its key-aware count, the faithfulness
explainers, the equivalence ranges) stops the pass at its next chunk: the run exits within seconds with the resume
line, its last.ckpt holds the epoch's training, and the epoch has none of the stopped passes' numbers. The printed
command resumes it and finishes the end-of-fit stage.

Through the command line, as tests/test_signals.py: a callback of the test's own makes, in the last epoch, one step
of the pass that KILL_AT names send this process SIGTERM as it ends, and every pass step after it take SLOW seconds
more. A pass that ran on past the signal would hold the exit back by at least SLOW; a stopped one by the epoch's end,
the checkpoint's save and the interpreter's exit.
"""

import csv
import math
import os
import shlex
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from cli_runner import run_cli

from identifiable_transformers.diagnostics.callbacks.equivalence import EquivalenceCallback, range_metrics
from identifiable_transformers.diagnostics.callbacks.faithfulness import FaithfulnessCallback
from identifiable_transformers.diagnostics.callbacks.identifiability import IdentifiabilityCallback, summarize_report
from identifiable_transformers.diagnostics.callbacks.key_aware_probe import key_aware_metrics
from identifiable_transformers.diagnostics.faithfulness import faithfulness_report
from identifiable_transformers.diagnostics.faithfulness.equivalent import equivalent_explanations
from identifiable_transformers.diagnostics.maths import attention_identifiability
from identifiable_transformers.modules.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SLOW = 10.0  # seconds each pass step takes after the signal
LIMIT = 4.0  # seconds from the signal to the process's exit; a pass running on takes SLOW more

PLUGIN = f'''
import os
import signal
import time
from pathlib import Path

import lightning.pytorch as pl


class SlowAfterSigterm(pl.Callback):
    """In the last epoch: the first call of the step KILL_AT names sends SIGTERM as it ends (the time goes to
    MARK_DIR/killed_at); after that every wrapped step of every pass sleeps {SLOW} s first."""

    def __init__(self):
        self.at, self.last, self.sent = os.environ.get("KILL_AT", ""), False, False

    def on_train_epoch_start(self, trainer, pl_module):
        self.last = trainer.current_epoch == trainer.max_epochs - 1

    def on_fit_start(self, trainer, pl_module):
        if not self.at:
            return
        from identifiable_transformers.diagnostics.callbacks import equivalence, identifiability, key_aware_probe
        from identifiable_transformers.diagnostics.faithfulness import report

        equivalence.CHUNK_EXAMPLES = 2  # a few chunks on the small probe
        self._wrap(identifiability, "attention_identifiability", "identifiability")  # per chunk of 2 examples
        self._wrap(key_aware_probe, "key_aware_alternative_dims", "key_aware")  # per example
        self._wrap(report, "explain", "faithfulness")  # inside the faithfulness report: its explainers
        self._wrap(report, "_erasure_metrics", "erasure")
        self._wrap(equivalence, "equivalent_explanations", "equivalence")  # per chunk

    def _wrap(self, module, name, step):
        original = getattr(module, name)

        def slow(*args, **kwargs):
            if self.sent:
                time.sleep({SLOW})
            out = original(*args, **kwargs)
            if self.last and step == self.at and not self.sent:
                self.sent = True
                Path(os.environ["MARK_DIR"], "killed_at").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGTERM)
            return out

        setattr(module, name, slow)
'''

SETTINGS = ["trainer=cpu", "logger=none", "trainer.max_epochs=2", "trainer.limit_train_batches=5",
            "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "model.embed_dim=16", "model.ffn_dim=32", "data.batch_size=16",
            "data.max_length=64", "callbacks.identifiability.probe_size=8", "callbacks.identifiability.plots=false",
            "callbacks.faithfulness.ig_steps=8", "callbacks.faithfulness.adversarial_examples=2",
            "callbacks.faithfulness.adversarial_steps=10"]

# what each stopped step leaves out of the stopped epoch: a file of epoch_001/, and metrics of its history row
LEFT_OUT = {
    "identifiability": (["ident_metrics.json", "faith_metrics.json", "equivalence.json"],
                        ["val/ident/null_dim", "val/ident/key_aware_alternative_dim", "val/faith/loo/comprehensiveness",
                         "val/ident/range_free_frac"]),
    "key_aware": (["ident_metrics.json", "key_aware.json", "faith_metrics.json", "equivalence.json"],
                  ["val/ident/null_dim", "val/ident/key_aware_alternative_dim", "val/faith/loo/comprehensiveness",
                   "val/ident/range_free_frac"]),
    "faithfulness": (["faith_metrics.json", "equivalence.json"],
                     ["val/faith/loo/comprehensiveness", "val/faith/uniform_acc_gap", "val/ident/range_free_frac"]),
    "equivalence": (["equivalence.json"], ["val/ident/range_free_frac", "val/ident/range_loo"]),
}


def _train(args: list[str], tmp_path: Path, kill_at: str = ""):
    env = {**os.environ, "HYDRA_FULL_ERROR": "", "KILL_AT": kill_at, "MARK_DIR": str(tmp_path),
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = run_cli([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, timeout=600, env=env)
    return proc, time.time()


def _history(folder: Path) -> dict[int, dict[str, str]]:
    with open(folder / "metrics_history.csv", newline="") as f:
        return {int(row["epoch"]): row for row in csv.DictReader(f)}


@pytest.mark.parametrize("step", list(LEFT_OUT))
def test_sigterm_inside_a_per_epoch_pass_stops_it_and_the_run_at_once(tmp_path, cache_dir, step):
    (tmp_path / "slow_passes.py").write_text(PLUGIN)
    folder = tmp_path / "run"
    args = [*SETTINGS, "+callbacks.slow._target_=slow_passes.SlowAfterSigterm", f"hydra.run.dir={folder}",
            f"paths.cache_dir={cache_dir}", f"paths.log_dir={tmp_path / 'logs'}"]
    first, ended = _train(args, tmp_path, kill_at=step)
    assert first.returncode == 143, first.stderr[-3000:]
    delay = ended - float((tmp_path / "killed_at").read_text())
    print(f"{step}: exited {delay:.2f} s after SIGTERM")
    assert delay < LIMIT, f"exited {delay:.1f} s after SIGTERM (a pass that runs on takes {SLOW} s more)"

    # the run's own SIGTERM ending: where it stopped, and the command that resumes it from last.ckpt
    line = first.stderr.strip().splitlines()[-1]
    assert line.startswith("Interrupted: SIGTERM received after training (finished at step 10)"), line
    last = folder / "checkpoints" / "last.ckpt"
    resume = shlex.split(line.split("with: ", 1)[1])
    assert resume[:2] == ["python", "train.py"] and f"ckpt_path={last}" in resume
    assert "stopped by SIGTERM" in first.stdout + first.stderr and "Traceback" not in first.stderr
    ckpt, _ = read_checkpoint(last, what="last.ckpt")  # its checksum matches, and it reads
    assert ckpt["global_step"] == 10 and ckpt["epoch"] == 1  # the stopped epoch's training is kept

    # nothing of the stopped passes for that epoch: no files, no metrics (not even the epoch before's)
    files, keys = LEFT_OUT[step]
    epoch_dir = folder / "identifiability" / "epoch_001"
    assert not [f for f in files if (epoch_dir / f).exists()]
    rows = _history(folder)
    assert all(rows[0][k] for k in keys), [k for k in keys if not rows[0][k]]
    assert not [k for k in keys if rows[1].get(k)], rows[1]
    assert rows[1]["val/acc"]  # the validation itself was logged
    assert not (folder / "metrics.json").exists()

    if step != "faithfulness":
        return
    # resumed: nothing left to train; the end-of-fit stage scores the final weights the stopped pass did not
    second, _ = _train(resume[2:], tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (folder / "identifiability" / "faithfulness_final.json").is_file()
    assert (folder / "metrics.json").is_file()
    assert not _history(folder)[1].get("val/faith/loo/comprehensiveness")  # the stopped epoch stays without


def test_sigterm_in_on_train_end_skips_the_end_of_fit_stage(make_cfg, tmp_path, monkeypatch):
    """Noted where Lightning's loops no longer stop: the faithfulness tier and the key-aware count of the end of fit
    do not start (they would run for minutes before the run stops)."""
    from test_signals_stages import Killer, _killed

    cfg = make_cfg("callbacks.identifiability.key_aware_every_n_epochs=null", "callbacks.identifiability.plots=false")
    started = time.perf_counter()
    err = _killed(cfg, Killer("on_train_end"), monkeypatch)
    assert err.code == 143 and "after training" in str(err), str(err)
    ident = tmp_path / "run" / "identifiability"
    assert (ident / "epoch_000" / "faith_metrics.json").is_file()  # the epoch's pass ran before the signal
    assert not (ident / "explanations.json").exists() and not (ident / "final").exists()
    assert time.perf_counter() - started < 120
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu",
                      weights_only=True)["global_step"] == 4


class Reference(pl.Callback):
    """After the passes of each validation: what the whole-probe library calls give (the passes' code before they
    were cut into chunks for SIGTERM), beside what the passes computed and what Lightning holds of it."""

    def __init__(self):
        self.epochs: list[dict[str, dict]] = []

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        ident, faith, equiv = (next(c for c in trainer.callbacks if isinstance(c, kind))
                               for kind in (IdentifiabilityCallback, FaithfulnessCallback, EquivalenceCallback))
        model, dev = pl_module.model, pl_module.device
        probe = ident._probe
        ids, mask = probe["batch"]["input_ids"].to(dev), probe["batch"]["attention_mask"].to(dev)
        report = attention_identifiability(model, ids, mask, device=ident.maths_device(pl_module),
                                           chunk_size=ident.chunk_size)
        ref = summarize_report(report, bins=probe["length_bins"])
        ref.update(key_aware_metrics(model, ident._key_aware_probe["batch"], dev)[0])
        part = faith._scored
        ids, mask = part["batch"]["input_ids"].to(dev), part["batch"]["attention_mask"].to(dev)
        faith_report = faithfulness_report(model, ids, mask, None, explainers=faith.explainers, seed=faith.seed,
                                           rationale_mask=FaithfulnessCallback._rationale_mask(part),
                                           random_draws=faith.random_draws)
        ref.update({f"val/faith/{k}": v for k, v in faith_report["metrics"].items()})
        part = equiv._scored
        ids, mask = part["batch"]["input_ids"].to(dev), part["batch"]["attention_mask"].to(dev)
        loo = equiv._loo(trainer, part)
        assert loo is not None  # the callback reuses the faithfulness pass's leave-one-out scores
        rep = equivalent_explanations(model, ids, mask, rationale_mask=FaithfulnessCallback._rationale_mask(part),
                                      loo=loo, token_ranges=equiv.token_ranges)
        ranges = range_metrics(rep, rep["layer"], part["length_bins"])
        ref.update(ranges)
        ref = {k: v for k, v in ref.items() if not k.endswith("compute_s")}
        self.epochs.append({
            "reference": ref, "equivalence": set(ranges),
            # what the passes computed (and wrote to their JSON files), and what Lightning holds of it (float32)
            "computed": {**ident.last_metrics, **faith.last_metrics, **equiv.last_metrics},
            "logged": {k: float(v) for k, v in trainer.callback_metrics.items()},
        })


def _same(a: float, b: float) -> bool:
    return a == b or math.isnan(a) and math.isnan(b)


def test_without_a_signal_the_passes_log_what_the_whole_probe_calls_give(make_cfg, monkeypatch):
    """Each pass in several chunks (identifiability: 2 examples, key-aware: 1, equivalence: whole length groups of
    2 or more) and the faithfulness report told its stages: what is logged is what the whole probe gives, exactly.
    The equivalence ranges' float64 values may move in their last bits (their LPs' inputs come from the model and
    an einsum run on a chunk's rows); their logged float32 values are compared exactly."""
    from identifiable_transformers.diagnostics.callbacks import equivalence
    from identifiable_transformers.run import training

    monkeypatch.setattr(equivalence, "CHUNK_EXAMPLES", 2)
    reference = Reference()
    instantiate = training._instantiate_dict
    monkeypatch.setattr(training, "_instantiate_dict", lambda node: [*instantiate(node), reference])
    training.run(make_cfg("trainer.max_epochs=2", "callbacks.identifiability.plots=false"))
    assert len(reference.epochs) == 2
    for epoch in reference.epochs:
        ref, computed, logged = epoch["reference"], epoch["computed"], epoch["logged"]
        assert {"val/ident/null_dim", "val/ident/key_aware_alternative_dim", "val/faith/loo/comprehensiveness",
                "val/ident/range_free_frac", "val/ident/l0_h0/range_loo"} <= set(ref)
        differ = {k: (v, logged[k]) for k, v in ref.items() if not _same(float(torch.tensor(v)), logged[k])}
        assert not differ, differ
        differ = {k: (v, computed[k]) for k, v in ref.items() if not (
            _same(v, computed[k]) or k in epoch["equivalence"] and math.isclose(v, computed[k], rel_tol=1e-12))}
        assert not differ, differ

"""W&B as a user sees it, checked on the records of real offline runs (and the sweep and workspace
files offline): the epoch axis, max/min summaries, tables, group, name, overrides, metrics.json.

The run file is read back with a small reader of its format (wandb 0.31 ships none): LevelDB's
log, a 7-byte file header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each
with a 7-byte header (crc32 uint32, length uint16, type uint8: 1 full, 2 first, 3 middle, 4 last);
a block tail shorter than a chunk header is padding.
"""

import io
import json
import logging
import os
import shlex
import struct
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict

from identifiable_transformers.run.training import run
from identifiable_transformers.tracking.loggers import hydra_runtime, log_once

BLOCK = 32 * 1024
HEADER = 7


def read_records(path: str | Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B run file"
    records, pos, chunks = [], HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        pos += HEADER
        chunks += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def _key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


class OfflineRun:
    """What a test asks of a run: run record, metric definitions, history rows, final summary, files."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.records = read_records(path)
        kinds = defaultdict(list)
        for r in self.records:
            kinds[r.WhichOneof("record_type")].append(r)
        self.run = kinds["run"][0].run
        self.config = {u.key: json.loads(u.value_json) for r in kinds["run"] + kinds["config"]
                       for u in (r.run.config.update if r.HasField("run") else r.config.update)}
        self.metrics = [r.metric for r in kinds["metric"]]
        self.history = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in kinds["history"]]
        self.summary: dict = {}
        for r in kinds["summary"]:
            for u in r.summary.update:
                self.summary[_key(u)] = json.loads(u.value_json)
        self.files = [f.path for r in kinds["files"] for f in r.files.files]
        self.artifacts = [r.artifact for r in kinds["artifact"]]

    def metric(self, name: str):
        """The definition of a metric name or glob (the first one: W&B uses the first that matches)."""
        return next(m for m in self.metrics if name in (m.name, m.glob_name))


def offline_run(root: str | Path, timeout: float = 60) -> OfflineRun:
    """The one offline run under ``root``, once W&B's service has written all of it: ``wandb.finish()``
    returns before the service has flushed the file, whose last record is then ``exit``."""
    runs = sorted(Path(root).rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, f"expected one offline W&B run under {root}, found {runs}"
    deadline = time.monotonic() + timeout
    while True:
        run = OfflineRun(runs[0])
        if run.records[-1].WhichOneof("record_type") == "exit" or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """W&B offline with all its state (settings, staging, cache) inside tmp_path."""
    for var, sub in {"WANDB_CONFIG_DIR": "wconf", "WANDB_CACHE_DIR": "wcache", "WANDB_DATA_DIR": "wdata",
                     "WANDB_ARTIFACT_DIR": "wart"}.items():
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)


@pytest.mark.parametrize("async_plots", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_offline_run_has_epoch_axis_summaries_tables_group_overrides_and_files(make_cfg, tmp_path, offline_wandb,
                                                                                 caplog, async_plots):
    cfg = make_cfg("logger=wandb", "logger.wandb.log_model=true", "trainer.max_epochs=2",
                   "trainer.limit_train_batches=2", "seed=5", f"callbacks.identifiability.async_plots={async_plots}",
                   f"callbacks.identifiability.plot_every_n_epochs={1 if async_plots else 10}")
    with caplog.at_level(logging.INFO, logger="identifiable_transformers.run.training"):
        result = run(cfg)
    out = tmp_path / "run"
    [block] = [m.splitlines() for m in caplog.messages if m.startswith("Run finished")]  # where things are
    assert block[1:] == [
        f"  metrics          {out / 'metrics.json'}",
        f"  best checkpoint  {result['best_model_path']} (val/acc {result['best_val_acc']:.4f})",
        f"  identifiability  {out / 'identifiability'} (probe.json, epoch_XXX/ metrics and plots)",
        f"  analyze          python analyze.py ckpt_path={result['best_model_path']} "
        "'text=\"a gripping, beautiful film\"'",
        f"  report           python -m identifiable_transformers.report {out}",
    ]
    rec = offline_run(tmp_path / "run")

    # the epoch axis: defined before Lightning's catch-all '*' (W&B uses the first glob that matches)
    names = [m.name or m.glob_name for m in rec.metrics]
    assert names.index("val/*") < names.index("*") and rec.metric("*").step_metric == "trainer/global_step"
    for key in ("val/*", "val/acc", "val/loss", "train/acc", "train/loss_epoch"):
        assert rec.metric(key).step_metric == "epoch", key
    assert rec.metric("val/acc").summary.max and rec.metric("val/loss").summary.min

    val_rows = [h for h in rec.history if "val/acc" in h]
    assert [h["epoch"] for h in val_rows] == [0, 1]
    assert rec.summary["val/acc"] == {"max": max(h["val/acc"] for h in val_rows)}
    assert rec.summary["val/loss"] == {"min": min(h["val/loss"] for h in val_rows)}
    for key in ("val/f1", "train/f1"):  # the best epoch's macro-F1, not the last one's
        assert rec.summary[key] == {"max": max(h[key] for h in rec.history if key in h)}, key
    assert rec.summary["best_val_acc"] == pytest.approx(result["best_val_acc"])

    # the per-head table, and images drawn in place, share their epoch's row; images drawn in the plot
    # thread come later in a row of their own, with their epoch's epoch and trainer/global_step
    last = val_rows[-1]
    image_rows = [h for h in rec.history if "val/ident/attention/count" in h]
    assert all(h["val/ident/null_dim_vs_length/_type"] == "images/separated" for h in image_rows)
    assert all(h["val/ident/attention/count"] == 2 for h in image_rows)
    if async_plots:
        assert [h["epoch"] for h in image_rows] == [0, 1] and not any("val/acc" in h for h in image_rows)
        assert [h["trainer/global_step"] for h in image_rows] == [h["trainer/global_step"] for h in val_rows]
    else:
        assert image_rows == [last]  # drawn on the last epoch only (plot_every_n_epochs=10)
    # the layer x head overview (issue 56): an image every epoch, in a row of its own at the end of its training epoch,
    # after its epoch's values and before the next epoch's (trainer/global_step never goes back)
    overview = [h for h in rec.history if "val/ident/overview/_type" in h]
    assert [h["epoch"] for h in overview] == [0, 1] and not any("val/acc" in h for h in overview)
    rows = [h for h in rec.history if "val/acc" in h or "val/ident/overview/_type" in h]
    assert [h["epoch"] for h in rows] == [0, 0, 1, 1]
    assert [h["trainer/global_step"] for h in rows] == sorted(h["trainer/global_step"] for h in rows)
    assert all(h["val/ident/overview/_type"] == "image-file" for h in overview)
    heads = 4  # one layer, 4 heads; the table holds every epoch so far
    assert [h["val/ident/heads/nrows"] for h in val_rows] == [heads, 2 * heads]
    assert last["val/ident/heads/ncols"] == 15  # epoch, layer, head, 10 metrics (4 of them epsilon), 2 fractions
    probe = [h for h in rec.history if "val/ident/probe/nrows" in h]
    assert len(probe) == 1 and probe[0]["val/ident/probe/nrows"] == 8 * heads and probe[0]["epoch"] == 1
    files = rec.path.parent / "files"
    table = json.loads((files / last["val/ident/heads/path"]).read_text())
    rows = {tuple(r[:3]): dict(zip(table["columns"], r)) for r in table["data"]}
    assert sorted(rows) == [(e, 0, h) for e in (0, 1) for h in range(heads)]
    written = json.loads((out / "identifiability" / "epoch_001" / "ident_metrics.json").read_text())
    for h in range(heads):
        for name in ("null_dim", "stochastic_null_dim", "identifiable_frac", "alt_tv", "effective_gap"):
            assert rows[(1, 0, h)][name] == pytest.approx(written[f"val/ident/l0_h{h}/{name}"]), name
    table = json.loads((files / probe[0]["val/ident/probe/path"]).read_text())
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    lengths = json.loads((out / "identifiability" / "probe.json").read_text())["lengths"]
    assert sorted(r["length"] for r in rows) == sorted(n for n in lengths for _ in range(heads))
    assert max(lengths) > 16  # the add design's values are d = 16 wide: null dim max(0, n - 16) (generic rank)
    assert all(r["null_dim"] == max(0, r["length"] - 16) and r["identifiable"] == (r["length"] <= 16) for r in rows)
    assert all(r["attention"] == "Image" and r["text"] for r in rows)  # the images travel in the table's artifact
    [probe_artifact] = [a for a in rec.artifacts if a.type == "run_table" and "probe" in a.name]
    paths = [c.path for c in probe_artifact.manifest.contents]
    assert len([p for p in paths if p.endswith(".png")]) == 8 * heads and "val/ident/probe.table.json" in paths

    # group by experiment, a name without seeds and paths, the overrides in the config
    assert rec.run.run_group == "rt_offline-identifiable"
    assert "trainer.max_epochs=2" in rec.run.display_name and "model.embed_dim=16" in rec.run.display_name
    assert "seed" not in rec.run.display_name and "paths." not in rec.run.display_name
    assert "logger" not in rec.run.display_name
    assert "seed=5" in rec.config["hydra"]["overrides"] and "trainer.max_epochs=2" in rec.config["hydra"]["overrides"]
    assert rec.config["hydra"]["choices"]["model"] == "identifiable"
    assert (rec.config["design"], rec.config["key_dim"]) == ("identifiable", 2)

    # metrics.json in the run's files, the best checkpoint as a model artifact
    assert "metrics.json" in rec.files
    saved = rec.path.parent / "files" / "metrics.json"
    assert json.loads(saved.read_text()) == json.loads((tmp_path / "run" / "metrics.json").read_text())
    from identifiable_transformers.report import load_runs

    assert len(load_runs(out)) == 1  # a sweep report counts the run once, not again for W&B's copy
    models = [a for a in rec.artifacts if a.type == "model"]
    assert len(models) == 1 and "best" in models[0].aliases
    assert [c.path for c in models[0].manifest.contents] == ["model.ckpt"]
    assert Path(result["best_model_path"]).name in models[0].metadata


def _hydra_cfg(*overrides, mode=RunMode.RUN):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = mode
        cfg.hydra.sweep.dir = "/logs/train/multiruns/2026-01-02_03-04-05"
    HydraConfig().set_config(cfg)
    return cfg


@pytest.mark.parametrize(("overrides", "mode", "sweep_id", "group"), [
    (["model=baseline", "data=imdb_offline"], RunMode.RUN, None, "imdb_offline-baseline"),
    ([], RunMode.RUN, None, "rt_offline-identifiable"),
    (["model=baseline"], RunMode.MULTIRUN, None, "sweep-2026-01-02_03-04-05"),
    (["model=baseline"], RunMode.RUN, "abc123", "sweep-abc123"),
])
def test_group_is_the_sweep_or_the_experiment(monkeypatch, overrides, mode, sweep_id, group):
    if sweep_id:
        monkeypatch.setenv("WANDB_SWEEP_ID", sweep_id)
    else:
        monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    _hydra_cfg(*overrides, mode=mode)
    assert hydra_runtime()[2] == group
    GlobalHydra.instance().clear()


def test_run_name_is_the_overrides_without_seeds_paths_and_logger_settings():
    _hydra_cfg("seed=3", "model=baseline", "paths.log_dir=/tmp/x", "paths.cache_dir=/tmp/c", "logger=wandb",
               "logger.wandb.log_model=true", "model.key_dim=4", "tags=[a]", "trainer.enable_progress_bar=false")
    assert hydra_runtime()[1] == "model.key_dim=4,model=baseline"
    _hydra_cfg("seed=3")
    assert hydra_runtime()[1] == "defaults"
    GlobalHydra.instance().clear()


def _agent_command(sweep: dict, point: dict) -> list[str]:
    """The command `wandb agent` runs for one grid point (its macro expansion, wandb_agent.py)."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

    macros = create_sweep_command_args({"args": {k: {"value": v} for k, v in point.items()}})
    macros.update(interpreter=["python"], program=[sweep["program"]], env=["/usr/bin/env"])
    out = []
    for part in create_sweep_command(sweep["command"]):
        out += macros[part[2:-1]] if part.startswith("${") and part.endswith("}") else [part]
    return out


def test_wandb_sweep_file_runs_train_py_with_hydra_overrides_of_the_key_size_grid():
    sweep = yaml.safe_load((ROOT / "multirun_sweeps" / "wandb" / "key_size.yaml").read_text())
    assert sweep["program"] == "train.py" and (ROOT / sweep["program"]).is_file()
    grid = {k: v["values"] for k, v in sweep["parameters"].items()}
    # the same grid as the Hydra preset of the study
    hydra_grid = yaml.safe_load((ROOT / "multirun_sweeps" / "sweep" / "key_size_offline.yaml").read_text())
    expected = {k: [yaml.safe_load(x) for x in str(v).split(",")]
                for k, v in hydra_grid["hydra"]["sweeper"]["params"].items()}
    assert grid == expected
    command = _agent_command(sweep, {"model": "baseline", "model.key_dim": 4, "seed": 1})
    assert command[:3] == ["/usr/bin/env", "python", "train.py"]
    cfg = _hydra_cfg(*command[3:])  # every argument is a Hydra override that composes
    assert (cfg.model.head_combine, cfg.model.key_dim, cfg.seed) == ("concat", 4, 1)
    assert "wandb" in cfg.logger and "key_size" in cfg.tags
    GlobalHydra.instance().clear()


def test_workspace_builder_builds_the_key_size_panels_offline(capsys):
    from identifiable_transformers.tracking.workspace import key_size_workspace, main

    view = key_size_workspace("someone")._to_model().model_dump(by_alias=True, exclude_none=True)
    sections = {s["name"]: [p["config"] for p in s["panels"]]
                for s in view["spec"]["section"]["panelBankConfig"]["sections"]}
    assert list(sections) == ["Accuracy", "Identifiability"]
    lines = [p for panels in sections.values() for p in panels if "metrics" in p]
    scatters = [p for panels in sections.values() for p in panels if "metrics" not in p]
    assert {m for p in lines for m in p["metrics"]} >= {"val/acc", "val/ident/identifiable_frac", "val/ident/null_dim"}
    assert all(p["xAxis"] == "epoch" and p["groupBy"] == "design.value" for p in lines)
    assert {(p["xAxis"], p["yAxis"]) for p in scatters} >= {
        ("config:key_dim.value", "summary:test/acc"), ("config:key_dim.value", "summary:val/ident/identifiable_frac")}
    assert main(["--entity", "someone", "--dry-run"]) == 0
    assert "test accuracy against key size" in capsys.readouterr().out


def test_workspace_builder_without_a_route_to_wandb_fails_fast_with_a_message(monkeypatch, capsys):
    from identifiable_transformers.tracking import workspace as wandb_workspace

    monkeypatch.setattr(wandb_workspace, "host_reachable", lambda host: False)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert wandb_workspace.main(["--entity", "someone"]) == 1
    assert "wandb.example.org is unreachable" in capsys.readouterr().err


def _readme_analyze_args(checkpoint: Path) -> list[str]:
    """The README's analyze example, split as a shell splits it, with ``checkpoint`` put in."""
    line = next(l for l in (ROOT / "README.md").read_text().splitlines() if l.startswith("python analyze.py"))
    args = shlex.split(line.split("  #")[0].replace("logs/.../checkpoints/epoch_004.ckpt", str(checkpoint)))
    assert args[:2] == ["python", "analyze.py"]
    return args[2:]


def _analyze_cli(args: list[str], tmp_path: Path) -> Path:
    proc = run_cli([sys.executable, str(ROOT / "analyze.py"), *args, f"output_dir={tmp_path / 'report'}",
                    f"hydra.run.dir={tmp_path / 'analyze'}"], cwd=tmp_path,
                   env={**os.environ, "HYDRA_FULL_ERROR": "1"}, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return tmp_path / "report" / "report.html"


@pytest.fixture(scope="module")
def tiny_checkpoint(one_step_checkpoint) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from identifiable_transformers.modules.classifier import TextClassifier

    words = "a gripping , beautiful film dull".split()
    tok = Tokenizer(WordLevel({"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words)}}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    module = TextClassifier(tok.get_vocab_size(), 2, embed_dim=8, num_heads=2, label_names=["neg", "pos"],
                            tokenizer_json=tok.to_str())
    return one_step_checkpoint(module, tok.get_vocab_size())


def test_readme_analyze_example_with_a_comma_works_through_the_cli(tiny_checkpoint, tmp_path):
    args = _readme_analyze_args(tiny_checkpoint)
    text = next(a for a in args if a.startswith("text="))
    assert "," in text  # the case Hydra would otherwise read as a sweep
    page = _analyze_cli(args, tmp_path).read_text()
    assert "a gripping, beautiful film" in page


@pytest.mark.slow
def test_cli_logs_once_names_outputs_and_its_analyze_command_works(tmp_path, cache_dir):
    fast = ["trainer=cpu", "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false", "model.embed_dim=16",
            "model.ffn_dim=32", "data.max_length=64", "callbacks.identifiability.probe_size=4",
            "callbacks.identifiability.plots=false", "logger=none"]
    run_dir = tmp_path / "run"
    proc = run_cli([sys.executable, str(ROOT / "train.py"), *fast, f"hydra.run.dir={run_dir}",
                    f"paths.cache_dir={cache_dir}"], cwd=tmp_path,
                   env={**os.environ, "HYDRA_FULL_ERROR": "1"}, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("`Trainer.fit` stopped") == 1, out  # Lightning's INFO lines once, not twice
    best = next(run_dir.glob("checkpoints/epoch_*.ckpt"))
    analyze = next(l.split("analyze", 1)[1].strip() for l in out.splitlines() if l.strip().startswith("analyze "))
    assert analyze.startswith(f"python analyze.py ckpt_path={best} ")
    page = _analyze_cli(shlex.split(analyze)[2:], tmp_path).read_text()  # the printed command, as a shell splits it
    assert "a gripping, beautiful film" in page


def test_lightning_lines_reach_the_root_handlers_once():
    import lightning  # noqa: F401 - its package logger gets its own console handler on import

    class Count(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    root, counted = logging.getLogger(), Count()
    own = {name: logging.StreamHandler(io.StringIO()) for name in ("lightning", "lightning.pytorch")}
    for name, handler in own.items():  # as lightning/__init__.py and lightning/pytorch/__init__.py add them
        logging.getLogger(name).addHandler(handler)
    logging.getLogger("lightning.pytorch").propagate = False
    root.addHandler(counted)  # as Hydra's job logging does
    try:
        log_once()
        logging.getLogger("lightning.pytorch.utilities.rank_zero").warning("fit stopped")
        assert counted.messages == ["fit stopped"]
        assert all(h.stream.getvalue() == "" for h in own.values())
    finally:
        root.removeHandler(counted)
        for name, handler in own.items():
            logging.getLogger(name).removeHandler(handler)



@pytest.mark.parametrize("sync_tensorboard", [False, True])  # True: Lightning's own experiment starts the run
def test_a_run_is_started_without_the_anonymous_setting(monkeypatch, tmp_path, capfd, sync_tensorboard):
    """W&B prints "The anonymous setting has no effect" for any ``anonymous`` given to wandb.init (Lightning's
    logger passes None). The reference: W&B's own settings warn for Lightning's value; ours pass none."""
    from unittest import mock

    import wandb
    import wandb.errors.term
    from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger

    from identifiable_transformers.tracking.wandb_logging import WandbLogger

    calls = []
    monkeypatch.setattr(wandb, "init", lambda **kw: calls.append(kw) or mock.MagicMock())
    monkeypatch.setattr(wandb, "run", None)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for cls in (LightningWandbLogger, WandbLogger):
        _ = cls(project="p", save_dir=str(tmp_path), offline=True, sync_tensorboard=sync_tensorboard).experiment
    lightning_kwargs, ours = calls
    assert "anonymous" in lightning_kwargs and "anonymous" not in ours
    assert {k: v for k, v in lightning_kwargs.items() if k != "anonymous"} == ours  # nothing else changed
    monkeypatch.setattr(wandb.errors.term, "_printed_messages", set())
    # an earlier W&B run in this process may have silenced its terminal or sent it to a logger
    monkeypatch.setattr(wandb.errors.term, "_silent", False)
    monkeypatch.setattr(wandb.errors.term, "_show_warnings", True)
    monkeypatch.setattr(wandb.errors.term, "_logger", None)
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    wandb.Settings(anonymous=lightning_kwargs["anonymous"])
    assert "The anonymous setting has no effect" in capfd.readouterr().err


def test_overview_image_is_the_probes_mean_per_head_and_logged_once_each_diagnosed_epoch(tmp_path):
    """The per-epoch overview (model=pretrained runs log it like any other): its grids are the probe's mean null dim
    and witness TV per head (reference: explicit loops over the report), sent once per epoch the diagnostics ran."""
    from types import SimpleNamespace

    import torch
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    from identifiable_transformers.diagnostics.callbacks.identifiability import IdentifiabilityCallback
    from identifiable_transformers.diagnostics.callbacks.media import overview_figure

    g = torch.Generator().manual_seed(0)
    B, L, H = 3, 2, 4
    report = {"null_dim": torch.randint(0, 9, (B, L, H), generator=g),
              "stochastic_null_dim": torch.randint(0, 2, (B, L, H), generator=g),
              "alt_attention_tv": torch.rand(B, L, H, generator=g), "lengths": torch.tensor([5, 9, 12])}
    fig = overview_figure(report, epoch=2)
    null_grid, tv_grid = (ax.images[0].get_array() for ax in fig.axes if ax.images)
    for grid, key in ((null_grid, "null_dim"), (tv_grid, "alt_attention_tv")):
        for l in range(L):
            for h in range(H):
                assert grid[l, h] == pytest.approx(sum(float(report[key][b, l, h]) for b in range(B)) / B)
    counts = [t.get_text() for t in fig.axes[0].texts if t.get_text().endswith(f"/{H}")]
    assert counts == [f"{sum(any(int(report['stochastic_null_dim'][b, l, h]) > 0 for b in range(B)) for h in range(H))}"
                      f"/{H}" for l in range(L)]

    class FakeRun:
        def __init__(self):
            self.calls = []

        def log(self, data, commit=None):
            self.calls.append((data, commit))

    class FakeWandb(WandbLogger):
        def __init__(self):  # no W&B run: only experiment.log is used
            self.run = FakeRun()

        @property
        def experiment(self):
            return self.run

    wb = FakeWandb()
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=7))
    trainer = SimpleNamespace(loggers=[wb], current_epoch=2, is_global_zero=True, fit_loop=loop)
    cb = IdentifiabilityCallback(probe_size=4)
    cb.last_report, cb._last_epoch = report, 1
    cb.on_train_epoch_end(trainer, None)
    assert wb.run.calls == []  # the diagnostics did not run this epoch (every_n_epochs > 1): nothing to show
    cb._last_epoch = 2
    cb.on_train_epoch_end(trainer, None)
    cb.on_train_epoch_end(trainer, None)
    [(data, commit)] = wb.run.calls
    assert commit is True and (data["epoch"], data["trainer/global_step"]) == (2, 7)
    image = data["val/ident/overview"]
    assert isinstance(image, wandb.Image) and image._caption == "epoch 2"
    assert max(image.image.size) <= 4000

"""The runs of a sweep (one row per job's ``metrics.json``), its failed jobs, and the results table
(mean ± std per configuration)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pandas as pd

from ..common.errors import UserError
from .markdown import markdown_table


class ReportWarning(UserWarning):
    """A run the report skips, or leaves out of a table (the command line prints it as ``warning: ...``)."""

COLUMNS = {  # column -> key in metrics.json["metrics"]
    "test_acc": "test/acc",
    "test_f1": "test/f1",
    "val_acc_best": "val/acc_best",
    "identifiable_frac": "val/ident/identifiable_frac",
    "null_dim": "val/ident/null_dim",
    "stochastic_null_dim": "val/ident/stochastic_null_dim",
    "alt_tv": "val/ident/alt_tv",
    "uniform_acc_gap": "val/faith/uniform_acc_gap",
}
GROUP = ["data", "head_combine", "embed_dim", "num_heads", "key_dim", "value_dim"]
# Besides COLUMNS, every run's metrics under these prefixes become columns (``val/`` dropped): every faithfulness
# metric, per-epoch ones and the end-of-fit val/faith/final/*, identifiability per cumulative length bin, and the
# equivalence-class ranges (val/ident/range_*: report/equivalence.py, report/factorial.py).
PER_RUN_PREFIXES = ("val/faith/", "val/ident/len_le_", "val/ident/range_")


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]  # job 10 after job 9


def _check_sweep_dir(sweep_dir: Path) -> None:
    if not sweep_dir.exists():
        raise FileNotFoundError(f"{sweep_dir} does not exist: pass the directory of a finished sweep "
                                "(e.g. logs/train/multiruns/<date>) or run")
    if not sweep_dir.is_dir():
        raise UserError(f"{sweep_dir} is a file, not a folder: pass the directory of a finished sweep "
                        "(e.g. logs/train/multiruns/<date>) or run")


def _metrics_files(sweep_dir: Path) -> list[Path]:
    # a run's W&B folder holds a copy (files/metrics.json): count each run once
    return sorted(f for f in sweep_dir.rglob("metrics.json") if "wandb" not in f.relative_to(sweep_dir).parts)


def failed_jobs(sweep_dir: Path) -> list[str]:
    """The job folders of a sweep (those Hydra gave a ``.hydra/``) that hold no ``metrics.json``: jobs that
    failed, or have not finished. Their names relative to ``sweep_dir``, in job order."""
    sweep_dir = Path(sweep_dir)
    jobs = {d.parent for d in sweep_dir.rglob(".hydra") if d.is_dir()
            and "wandb" not in d.relative_to(sweep_dir).parts}
    done = {f.parent for f in _metrics_files(sweep_dir)}
    return sorted((str(j.relative_to(sweep_dir)) or "." for j in jobs - done), key=_natural)


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def expected_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the sweep's ``multirun.yaml`` (Hydra's record of the sweep) lists: the product of the sizes of
    its sweeps (``key=a,b,c``, ``range(...)``; the command line's and ``hydra.sweeper.params``). None when there is
    no such file, or another sweeper (Optuna: its trial count) or a sweep this cannot count."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    record = Path(sweep_dir) / "multirun.yaml"
    if not record.is_file():
        return None
    try:
        hydra = OmegaConf.load(record).hydra
        if OmegaConf.select(hydra, "sweeper._target_") != BASIC_SWEEPER:
            return None
        params = OmegaConf.to_container(hydra.sweeper.params) if hydra.sweeper.get("params") else {}
        # As the basic sweeper does: the command line's value of a key replaces the preset's sweep of it.
        by_key = {}
        for o in OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()),
                                                           *hydra.overrides.task]):
            by_key[o.get_key_element()] = o
        count = 1
        for o in by_key.values():
            if o.is_sweep_override():
                count *= len(list(o.sweep_string_iterator()))
        return count
    except Exception:  # noqa: BLE001 - a record this cannot read: the count is only a hint
        return None


def missing_jobs(sweep_dir: Path) -> list[str]:
    """The jobs ``multirun.yaml`` lists (numbered 0..N-1, Hydra's default ``hydra.sweep.subdir``) that have no
    folder at all: never started, or deleted. Empty when the count is unknown."""
    n = expected_jobs(sweep_dir)
    return [] if n is None else [str(i) for i in range(n) if not (Path(sweep_dir) / str(i)).exists()]


def _numbers(metrics: dict) -> dict:
    """The metrics the tables use, each a number or null; anything else is not train.py's metrics.json."""
    used = {*COLUMNS.values(), *(k for k in metrics if k.startswith(PER_RUN_PREFIXES))}
    for key in sorted(used & set(metrics)):
        value = metrics[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"metrics[{key!r}]={value!r} is not a number")
    return metrics


def _row(result: dict, run: str, run_dir: Path) -> dict:
    model, metrics = result["config"]["model"], _numbers(result["metrics"])
    d, h, combine = model["embed_dim"], model["num_heads"], model["head_combine"]
    return {
        "run": run,
        "data": result["config"]["data"],
        "seed": result["config"]["seed"],
        # a capped output rank (model.out_rank) is another arm: concat_r16 is concat with a rank-16 output projection
        "head_combine": combine if not model.get("out_rank") else f"{combine}_r{model['out_rank']}",
        "embed_dim": d,
        "num_heads": h,
        # resolve the null defaults as the model does (docs/identifiability.md section 3)
        "key_dim": model["key_dim"] or d // h,
        "value_dim": model["value_dim"] or (d // h if combine == "concat" else d),
        "best_epoch": result.get("best_epoch"),
        # the code that produced the run (run/provenance.py); None for runs written before metrics.json recorded it
        "commit": (result.get("provenance") or {}).get("commit"),
        "dirty": (result.get("provenance") or {}).get("dirty"),
        "runtime_s": result.get("runtime_s"),
        **{col: metrics.get(key) for col, key in COLUMNS.items()},
        **{k[len("val/"):]: v for k, v in sorted(metrics.items())
           if k.startswith(PER_RUN_PREFIXES) and k != COLUMNS["uniform_acc_gap"]},
        "_dir": str(run_dir),
        "_best_model_path": result.get("best_model_path"),
    }


def load_runs(sweep_dir: Path) -> pd.DataFrame:
    """One row per job's ``metrics.json``. A file that is not JSON (truncated) is an error naming it; a
    run whose metrics.json lacks what the tables need (``config``, ``metrics``, the model settings) is
    skipped with a :class:`ReportWarning`."""
    sweep_dir = Path(sweep_dir)
    _check_sweep_dir(sweep_dir)
    files = _metrics_files(sweep_dir)
    if not files:
        failed = failed_jobs(sweep_dir)
        also = f" ({len(failed)} job folder(s) without one: failed or unfinished)" if failed else ""
        raise FileNotFoundError(f"no metrics.json under {sweep_dir}{also}: pass the directory of a finished sweep")
    rows = []
    for f in files:
        try:
            result = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{f} is not valid JSON ({e}): the file is truncated or damaged. Rerun that job, or "
                            f"move its folder out of {sweep_dir}") from None
        run = str(f.parent.relative_to(sweep_dir))
        try:
            rows.append(_row(result, run, f.parent))
        except (KeyError, TypeError, AttributeError) as e:  # someone else's file, or an older train.py's
            what = (f"has no {e.args[0]!r}" if isinstance(e, KeyError)
                    else f"is not laid out as train.py writes it ({e})")
            warnings.warn(f"{run}: skipped, {f} {what}", ReportWarning, stacklevel=2)
    if not rows:
        raise UserError(f"no run under {sweep_dir} has a usable metrics.json (each was skipped, see the warnings)")
    return pd.DataFrame(rows)


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    present = [c for c in COLUMNS if c in runs and runs[c].notna().any()]
    table = runs.groupby(GROUP)[present].agg(["mean", "std"])
    table.columns = [f"{c}_{stat}" for c, stat in table.columns]
    table["runs"] = runs.groupby(GROUP).size()
    return table.reset_index()


def to_markdown(table: pd.DataFrame) -> str:
    return markdown_table(table, GROUP)

"""The files beside a run's ``metrics.json`` that the report reads: ``identifiability/explanations.json`` (seed
agreement), ``identifiability/key_aware.json`` (the key-aware table) and ``identifiability/probe.json`` (the default
key-aware lengths).

A damaged file (truncated, or valid JSON of another layout) leaves its run out of the table it feeds, with a
:class:`ReportWarning` naming the run and the file; the run's other results stay in the report.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pandas as pd

from .faithfulness import DISTRIBUTION_EXPLAINERS
from .key_aware import COUNTS, KEY_AWARE_LENGTHS
from .runs import ReportWarning


class Damaged(ValueError):
    """A run file that is not laid out as train.py or the report writes it (the message says how)."""


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_explanations(data) -> None:
    """Raise :class:`Damaged` unless ``data`` is laid out as the faithfulness callback writes explanations.json:
    ``indices`` and ``lengths`` (one per probe example), ``scores`` (explainer -> one list of numbers per example,
    covering its length), the distribution explainers' scores (attention, norm, rollout) non-negative."""
    if not isinstance(data, dict):
        raise Damaged(f"is a JSON {type(data).__name__}, not an object")
    for key in ("indices", "lengths", "scores"):
        if key not in data:
            raise Damaged(f"has no {key!r}")
    indices, lengths, scores = data["indices"], data["lengths"], data["scores"]
    if not (isinstance(indices, list) and isinstance(lengths, list) and len(indices) == len(lengths)):
        raise Damaged("'indices' and 'lengths' are not two lists of the same length")
    if not all(isinstance(i, int) for i in indices) or not all(isinstance(n, int) and n >= 1 for n in lengths):
        raise Damaged("'indices' and 'lengths' are not lists of whole numbers")
    if not isinstance(scores, dict):
        raise Damaged("'scores' is not an object (explainer -> scores per example)")
    for explainer, rows in scores.items():
        if not isinstance(rows, list) or len(rows) != len(indices):
            raise Damaged(f"'scores'[{explainer!r}] does not hold one list per probe example ({len(indices)})")
        for idx, n, row in zip(indices, lengths, rows):
            if not isinstance(row, list) or len(row) < n or not all(_number(x) for x in row[:n]):
                raise Damaged(f"{explainer} scores of probe example {idx} are not {n} numbers")
            if explainer in DISTRIBUTION_EXPLAINERS and any(x < 0 for x in row[1:n]):
                raise Damaged(f"{explainer} scores of probe example {idx} are negative: not a distribution")


def check_key_aware(data) -> None:
    """Raise :class:`Damaged` unless ``data`` is laid out as the report writes key_aware.json: ``lengths`` (one per
    example) and the counts as [example][layer][head] lists of numbers."""
    if not isinstance(data, dict):
        raise Damaged(f"is a JSON {type(data).__name__}, not an object")
    lengths = data.get("lengths")
    if not isinstance(lengths, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
        raise Damaged("'lengths' is not a list of whole numbers")
    targets = data.get("targets", [])
    if not (isinstance(targets, list) and all(isinstance(t, int) for t in targets)):
        raise Damaged("'targets' is not a list of whole numbers")
    optional = ("random_alternative_dim", "margin")
    for key in (*COUNTS, *(k for k in optional if k in data)):
        value = data.get(key)
        if not isinstance(value, list) or len(value) != len(lengths) or not all(
                isinstance(layers, list) and layers and all(
                    isinstance(heads, list) and heads and all(_number(x) or (x is None and key == "margin")
                                                              for x in heads) for heads in layers)
                for layers in value):
            raise Damaged(f"{key!r} is not a list of [layer][head] numbers per example ({len(lengths)})")


FILES = {"explanations.json": (check_explanations, "the seed agreement"),
         "key_aware.json": (check_key_aware, "the key-aware table")}


def usable(runs: pd.DataFrame, name: str) -> pd.Series:
    """Per run, whether ``<run>/identifiability/<name>`` can be used: a missing file is (the table says so itself);
    a damaged one is not, with a warning naming the run, the file and what to do."""
    check, table = FILES[name]
    ok = []
    for _, r in runs.iterrows():
        path = Path(r["_dir"]) / "identifiability" / name
        reason = None
        if path.is_file():
            try:
                check(json.loads(path.read_text()))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                reason = f"is not valid JSON ({e}): the file is truncated or damaged"
            except Damaged as e:
                reason = f"is not laid out as train.py writes it ({e})"
        if reason:
            fix = ("move it away and rerun the report to recount it" if name == "key_aware.json"
                   else "rerun that job to rewrite it")
            warnings.warn(f"{r['run']}: left out of {table}, {path} {reason}; {fix}", ReportWarning, stacklevel=2)
        ok.append(reason is None)
    return pd.Series(ok, index=runs.index, dtype=bool)


def _longest_example(run_dir: Path) -> int | None:
    """The run's longest validation example in tokens (``<cls>`` included), as far as its files tell: the probe's
    longest example when no validation example was too long for it (the probe spans the eligible lengths, so it
    holds the longest), else the data's ``max_length`` (examples are cut to it); None when neither is known."""
    try:
        probe = json.loads((run_dir / "identifiability" / "probe.json").read_text())
        if probe.get("num_too_long") == 0 and probe.get("lengths"):
            return max(int(n) for n in probe["lengths"])
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    try:
        from omegaconf import OmegaConf

        value = OmegaConf.select(OmegaConf.load(run_dir / "config_resolved.yaml"), "data.max_length")
        return int(value) if value is not None else None
    except Exception:  # no config_resolved.yaml, or not one train.py wrote: nothing known
        return None


def _counted_at(run_dir: Path) -> tuple[int, ...] | None:
    """The lengths of the run's key_aware.json, when it has a usable one."""
    try:
        data = json.loads((run_dir / "identifiability" / "key_aware.json").read_text())
        check_key_aware(data)
        return tuple(int(t) for t in data["targets"]) if data.get("targets") else None
    except (OSError, ValueError):
        return None


def default_key_aware_lengths(runs: pd.DataFrame) -> tuple[tuple[int, ...], str]:
    """Key-aware lengths for runs given no ``--key-aware-lengths``. The lengths every run's key_aware.json was
    counted at, when they all were, at the same ones (an earlier report's counts are kept, not recounted); else n,
    n/4 and n/16 (at least 8), n the shortest of the runs' longest validation examples, so that every length is
    reached by an example of every run's data. Returns the lengths and where they come from;
    :data:`KEY_AWARE_LENGTHS` when no run's files tell."""
    from ..diagnostics.callbacks.key_aware_probe import key_aware_targets

    counted = {_counted_at(Path(d)) for d in runs["_dir"]}
    if len(counted) == 1 and None not in counted:
        return counted.pop(), "the lengths every run was counted at before"
    known = [n for n in (_longest_example(Path(d)) for d in runs["_dir"]) if n is not None and n >= 2]
    if not known:
        return KEY_AWARE_LENGTHS, "no run records its data's lengths: the fixed default"
    n = min(known)
    lengths = tuple(sorted(t for t in set(key_aware_targets(3, n)) if t <= n)) or (n,)
    return lengths, f"the longest validation example{'s' if len(known) > 1 else ''} of the runs' data: {n} tokens"

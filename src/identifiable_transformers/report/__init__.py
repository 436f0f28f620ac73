"""Aggregate a sweep: python -m identifiable_transformers.report SWEEP_DIR [--out DIR] [--overwrite] [--no-key-aware]
[--key-aware-lengths N,N,...] [--cache-dir DIR]

Reads every job's ``metrics.json`` under SWEEP_DIR and writes ``results.csv`` (one row per job, every
``val/faith/*`` metric included), ``results.md`` (mean ± std per configuration) and plots of accuracy
and identifiability against the key size. When the runs logged the faithfulness suite
(docs/faithfulness.md) it also writes ``faithfulness.md``/``.csv`` (mean ± std over seeds per
configuration and explainer) and ``seed_agreement.md``/``.csv`` (Jensen-Shannon divergence between the
seeds' explanations of the same probe examples, from each run's ``identifiability/explanations.json``).
When the runs logged per-length-bin metrics (``len_le_<N>``), ``lengths.md``/``.csv`` give identifiability and
raw and effective attention's faithfulness per configuration and bin (:mod:`.lengths`).
``key_aware.md``/``.csv`` tabulate the docs/identifiability.md 2.5 key-aware count of alternatives per
configuration and input length (``--key-aware-lengths``; by default n, n/4 and n/16 with n the runs' longest
validation example, :func:`.run_files.default_key_aware_lengths`), beside matched random heads,
with the key-aware identifiable length per configuration (``key_aware_length.csv``) and
``key_aware_vs_length.png``; the counts of each best checkpoint go to ``<run>/identifiability/key_aware.json``
when missing or counted at other lengths (``--no-key-aware``: use only the files already there).

When the runs are a 2x2 factorial of ``head_combine`` x value size (multirun_sweeps/sweep/factorial.yaml),
``factorial.md``/``.csv`` replace ``faithfulness_designs.md``: the value-size (identifiability) and head-combination
main effects, their interaction, TOST at the preset's margins and the ranges' superiority test (:mod:`.factorial`).

Every study that compares arms also gets ``findings.md``/``.csv`` (:mod:`.findings`): one row per task, key size,
explainer, metric and contrast, with the verdict its statistics give under one rule and whether the test could have
failed. Every markdown table ends with a line naming the commits behind its runs (from ``metrics.json``'s
``provenance``), marked **Mixed code** when they are several or dirty. ``--update-docs`` (no SWEEP_DIR) rebuilds
every committed study's findings from docs/results/*/runs.tar.* and writes them into docs/results.md's findings blocks
(:mod:`.docs`).

A checkpoint is someone else's file: the runs' data is rebuilt from the data settings it holds as
plain ``TextDataModule`` arguments (:func:`identifiable_transformers.modules.checkpoint.data_module_from_checkpoint`),
never by instantiating its ``_target_``; a refused checkpoint skips that run's key-aware count with a
warning. A damaged explanations.json or key_aware.json leaves its run out of the table it feeds, with a warning
naming the run and the file; a metrics.json with a non-number metric skips its run with a warning. A report is never
written over an earlier one without ``--overwrite``. A user mistake ends with one ``Error: ...`` line and exit
status 1.

One idea per module: :mod:`.runs` (loading the runs, the results table), :mod:`.markdown` (the
markdown tables), :mod:`.faithfulness` (faithfulness table, seed agreement), :mod:`.lengths` (the per-length
table), :mod:`.key_aware` (the key-aware count per checkpoint and its table), :mod:`.run_files` (the per-run files
beside metrics.json: their checks, the default key-aware lengths), :mod:`.plots`, :mod:`.cli` (arguments and
``main``).
"""

from .cli import main
from .faithfulness import (
                           DISTRIBUTION_EXPLAINERS,
                           EXPLAINER_ORDER,
                           FAITH_KEY,
                           FAITH_METRICS,
                           faithfulness_table,
                           js_divergence,
                           load_explanations,
                           seed_agreement,
)
from .key_aware import KEY_AWARE_LENGTHS, ensure_key_aware, key_aware_counts, key_aware_lengths, key_aware_table
from .markdown import markdown_table
from .plots import plot, plot_key_aware
from .run_files import default_key_aware_lengths
from .runs import COLUMNS, GROUP, ReportWarning, failed_jobs, load_runs, summarise, to_markdown

__all__ = ["COLUMNS", "DISTRIBUTION_EXPLAINERS", "EXPLAINER_ORDER", "FAITH_KEY", "FAITH_METRICS", "GROUP",
           "KEY_AWARE_LENGTHS", "ReportWarning", "default_key_aware_lengths", "ensure_key_aware", "failed_jobs",
           "faithfulness_table", "js_divergence", "key_aware_counts", "key_aware_lengths", "key_aware_table",
           "load_explanations", "load_runs", "main", "markdown_table", "plot", "plot_key_aware", "seed_agreement",
           "summarise", "to_markdown"]

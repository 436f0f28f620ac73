"""Arguments and ``main`` of ``python -m identifiable_transformers.report``.

A user mistake (a missing or empty folder, a truncated metrics.json, ``--out`` naming a file) ends with
one ``Error: ...`` line and exit status 1, as train.py's do (``HYDRA_FULL_ERROR=1`` shows the traceback);
a run the report skips is a ``warning: ...`` line, and the others go on.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings
from pathlib import Path

from ..common.errors import UserError, ensure_output_dir, user_error_message
from ..common.files import DiskFullError, atomic_write
from .code_note import code_note
from .designs import write_design_comparison
from .docs import update_docs
from .equivalence import equivalence_table
from .explainer_agreement import explainer_agreement
from .factorial import is_factorial, left_out_of_factorial
from .factorial_markdown import write_factorial
from .faithfulness import faithfulness_table, load_explanations, seed_agreement
from .findings_markdown import write_findings
from .key_aware import KEY_AWARE_LENGTHS, default_cache_dir, ensure_key_aware, key_aware_lengths, key_aware_table
from .lengths import length_table
from .markdown import markdown_table
from .plots import plot, plot_key_aware
from .run_files import default_key_aware_lengths, usable
from .runs import GROUP, ReportWarning, expected_jobs, failed_jobs, load_runs, missing_jobs, summarise, to_markdown

DESCRIPTION = ("Aggregate a sweep: python -m identifiable_transformers.report SWEEP_DIR [--out DIR] [--overwrite] "
               "[--no-key-aware] [--key-aware-lengths N,N,...] [--cache-dir DIR]; or rewrite docs/results.md's "
               "findings from the committed runs: python -m identifiable_transformers.report --update-docs")
# What a report writes first: a folder holding one already holds a report.
REPORT_FILES = ("results.md", "results.csv")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # a bad argument is a user mistake: one Error: line, exit status 1
        self.print_usage(sys.stderr)
        print(f"Error: {message}", file=sys.stderr)
        raise SystemExit(1)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m identifiable_transformers.report", description=DESCRIPTION)
    parser.add_argument("sweep_dir", type=Path, nargs="?")
    parser.add_argument("--update-docs", action="store_true",
                        help="rebuild every study's findings.md/.csv from its committed runs "
                             "(docs/results/*/runs.tar.*) and write them into docs/results.md's findings blocks (run "
                             "from the repository's root)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: SWEEP_DIR)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the report already in the output directory (refused without it)")
    parser.add_argument("--no-key-aware", action="store_true",
                        help="do not compute missing identifiability/key_aware.json files (seconds per head at 512 "
                             "tokens)")
    parser.add_argument("--key-aware-lengths", type=_lengths, default=None, metavar="N,N,...",
                        help="input lengths of the key-aware count, <cls> included (default: those every run was "
                             "counted at, else from the data: n, n/4 and n/16, n the runs' longest validation example; "
                             f"{','.join(map(str, KEY_AWARE_LENGTHS))} when the runs do not record it); runs counted "
                             "at other lengths are recounted")
    parser.add_argument("--cache-dir", default=None,
                        help="tokenized-data cache for rebuilding the runs' probe examples (default: $IDT_CACHE_DIR "
                             "or ~/.cache/identifiable_transformers, as train.py's paths.cache_dir)")
    return parser


def _lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 2:
        raise argparse.ArgumentTypeError(f"expected comma-separated lengths >= 2 such as 16,64,256; got {text!r}")
    return lengths


def _noted(markdown: str, runs) -> str:
    """A table with the line naming the code behind it (report/code_note.py)."""
    return markdown + "\n" + code_note(runs) + "\n"


def _report(args: argparse.Namespace) -> None:
    runs = load_runs(args.sweep_dir)
    failed = failed_jobs(args.sweep_dir)
    if failed:
        warnings.warn(f"{len(failed)} job(s) have no metrics.json (failed or unfinished), left out: "
                      f"{', '.join(failed)}", ReportWarning, stacklevel=2)
    missing = missing_jobs(args.sweep_dir)
    if missing:
        warnings.warn(f"multirun.yaml lists {expected_jobs(args.sweep_dir)} jobs; {len(missing)} have no folder "
                      f"(never started, or removed), left out: {', '.join(missing)}", ReportWarning, stacklevel=2)
    out = ensure_output_dir(args.out or args.sweep_dir, "--out")
    earlier = [name for name in REPORT_FILES if (out / name).exists()]
    if earlier and not args.overwrite:
        raise UserError(f"{out} already holds a report ({', '.join(earlier)}): pass --out to write this one "
                        "elsewhere, or --overwrite to replace it")
    table = summarise(runs)
    atomic_write(out / "results.csv", runs.drop(columns=["_dir", "_best_model_path"]).to_csv(index=False))
    footnote = f"\nFailed jobs (no metrics.json, left out): {', '.join(failed)}\n" if failed else ""
    footnote += f"\nMissing jobs (listed in multirun.yaml, no folder): {', '.join(missing)}\n" if missing else ""
    atomic_write(out / "results.md", _noted(to_markdown(table), runs) + footnote)
    written = [out / "results.md", out / "results.csv"]
    faith = faithfulness_table(runs)
    notes: list[str] = []
    if faith is not None:
        atomic_write(out / "faithfulness.csv", faith.to_csv(index=False))
        atomic_write(out / "faithfulness.md", _noted(markdown_table(faith, GROUP + ["explainer"]), runs))
        if is_factorial(runs):  # head_combine alone no longer names the design: the factorial's contrasts instead
            odd = left_out_of_factorial(runs)
            if odd:
                warnings.warn(odd, ReportWarning, stacklevel=2)
            written += write_factorial(runs, out)
        else:
            written += write_design_comparison(runs, out)  # pooled over key sizes, and per key size where both ran
        written += write_findings(runs, out)  # the verdicts of the tables above, under one rule
        explained = runs[usable(runs, "explanations.json")]  # each damaged file warned about once
        load = functools.cache(load_explanations)  # read once, for the seed and the explainer agreement
        agreement, notes = seed_agreement(explained, load)
        written += [out / "faithfulness.md", out / "faithfulness.csv"]
        if agreement is not None:
            atomic_write(out / "seed_agreement.csv", agreement.to_csv(index=False))
            atomic_write(out / "seed_agreement.md", _noted(markdown_table(agreement, GROUP + ["explainer"]), explained))
            written += [out / "seed_agreement.md", out / "seed_agreement.csv"]
        closeness = explainer_agreement(explained, load)
        if closeness is not None:  # how close attention comes to value zeroing and ALTI
            atomic_write(out / "explainer_agreement.csv", closeness.to_csv(index=False))
            atomic_write(out / "explainer_agreement.md", _noted(markdown_table(closeness, GROUP + ["pair"]), explained))
            written += [out / "explainer_agreement.md", out / "explainer_agreement.csv"]
        if out / "faithfulness_designs.md" not in written and set(runs["head_combine"]) >= {"add", "concat"} \
                and not is_factorial(runs):
            notes.append("no faithfulness_designs.md: no dataset and key size has two runs of each design "
                         "(identifiable and baseline)")
    ranges = equivalence_table(runs)
    if ranges is not None:  # how far explanations move at a fixed output (docs/identifiability.md 2.8)
        atomic_write(out / "equivalence.csv", ranges.to_csv(index=False))
        atomic_write(out / "equivalence.md", _noted(markdown_table(ranges, GROUP), runs))
        written += [out / "equivalence.md", out / "equivalence.csv"]
    lengths_table = length_table(runs)
    if lengths_table is not None:  # identifiability and faithfulness per cumulative length bin
        atomic_write(out / "lengths.csv", lengths_table.to_csv(index=False))
        atomic_write(out / "lengths.md", _noted(markdown_table(lengths_table, GROUP + ["length_le"], digits=3), runs))
        written += [out / "lengths.md", out / "lengths.csv"]
    targets = args.key_aware_lengths
    if targets is None:
        targets, source = default_key_aware_lengths(runs)
        if not args.no_key_aware:
            print(f"key-aware lengths {','.join(map(str, targets))} ({source}; --key-aware-lengths to choose)")
    ka_runs = runs[usable(runs, "key_aware.json")]
    notes += ensure_key_aware(ka_runs, compute=not args.no_key_aware, cache_dir=args.cache_dir or default_cache_dir(),
                              targets=targets)
    ka = key_aware_table(ka_runs)
    plots = plot(table, out)
    if ka is not None:
        atomic_write(out / "key_aware.csv", ka.to_csv(index=False))
        lengths = key_aware_lengths(ka)
        atomic_write(out / "key_aware_length.csv", lengths.to_csv(index=False))
        atomic_write(
            out / "key_aware.md",
            markdown_table(ka, GROUP + ["n"], digits=1)
            + "\n\nKey-aware identifiable length (longest tested n with no generatable alternative in any head):\n\n"
            + _noted(markdown_table(lengths, list(lengths.columns)), ka_runs))
        written += [out / "key_aware.md", out / "key_aware.csv", out / "key_aware_length.csv"]
        plots += plot_key_aware(ka, out)
    for note in notes:
        print(f"note: {note}")
    failed_text = f", {len(failed)} failed job(s) left out ({', '.join(failed)})" if failed else ""
    failed_text += f", {len(missing)} missing job(s) ({', '.join(missing)})" if missing else ""
    print(f"{len(runs)} runs{failed_text}, {len(table)} configurations -> {', '.join(str(p) for p in written)}, "
          f"{', '.join(p.name for p in plots)}")


def main(argv: list[str] | None = None) -> int:
    """Run the report; returns the exit status (1 after a user mistake's ``Error:`` line). Bugs raise."""
    args = _parser().parse_args(argv)
    shown = warnings.showwarning

    def show(message, category, *rest, **kw):  # the report's own warnings as one plain line each
        if issubclass(category, ReportWarning):
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, *rest, **kw)

    with warnings.catch_warnings():
        warnings.simplefilter("always", ReportWarning)
        warnings.showwarning = show
        try:
            if args.update_docs:
                if args.sweep_dir is not None:
                    raise UserError("--update-docs reads the committed runs under docs/results/: pass no SWEEP_DIR")
                print("updated " + ", ".join(str(p) for p in update_docs()))
            elif args.sweep_dir is None:
                raise UserError("pass the directory of a finished sweep (SWEEP_DIR), or --update-docs")
            else:
                _report(args)
        except Exception as ex:
            message = user_error_message(ex)
            if message is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            if isinstance(ex, DiskFullError):  # the files written before it are there: a rerun must replace them
                message += (" Then run the report again with --overwrite (it replaces the files this one wrote), "
                            "or pass --out DIR on a disk with room.")
            sys.stdout.flush()
            print(f"Error: {message}", file=sys.stderr, flush=True)
            return 1
    return 0

"""Arguments and ``main`` of ``python -m identifiable_transformers.report``.

A user mistake (a missing or empty folder, a truncated metrics.json, ``--out`` naming a file) ends with
one ``Error: ...`` line and exit status 1, as train.py's do (``HYDRA_FULL_ERROR=1`` shows the traceback);
a run the report skips is a ``warning: ...`` line, and the others go on.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from ..cli import ensure_output_dir, user_error_message
from .designs import write_design_comparison
from .faithfulness import faithfulness_table, seed_agreement
from .key_aware import KEY_AWARE_LENGTHS, default_cache_dir, ensure_key_aware, key_aware_lengths, key_aware_table
from .markdown import markdown_table
from .plots import plot, plot_key_aware
from .runs import GROUP, ReportWarning, failed_jobs, load_runs, summarise, to_markdown

DESCRIPTION = ("Aggregate a sweep: python -m identifiable_transformers.report SWEEP_DIR [--out DIR] [--no-key-aware] "
               "[--cache-dir DIR]")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # a bad argument is a user mistake: one Error: line, exit status 1
        self.print_usage(sys.stderr)
        print(f"Error: {message}", file=sys.stderr)
        raise SystemExit(1)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m identifiable_transformers.report", description=DESCRIPTION)
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: SWEEP_DIR)")
    parser.add_argument("--no-key-aware", action="store_true",
                        help="do not compute missing identifiability/key_aware.json files (seconds per head at 512 tokens)")
    parser.add_argument("--key-aware-lengths", type=_lengths, default=KEY_AWARE_LENGTHS, metavar="N,N,...",
                        help="input lengths of the key-aware count, <cls> included (default: "
                             f"{','.join(map(str, KEY_AWARE_LENGTHS))}); runs counted at other lengths are recounted")
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


def _report(args: argparse.Namespace) -> None:
    runs = load_runs(args.sweep_dir)
    failed = failed_jobs(args.sweep_dir)
    if failed:
        warnings.warn(f"{len(failed)} job(s) have no metrics.json (failed or unfinished), left out: "
                      f"{', '.join(failed)}", ReportWarning, stacklevel=2)
    out = ensure_output_dir(args.out or args.sweep_dir, "--out")
    table = summarise(runs)
    runs.drop(columns=["_dir", "_best_model_path"]).to_csv(out / "results.csv", index=False)
    footnote = f"\nFailed jobs (no metrics.json, left out): {', '.join(failed)}\n" if failed else ""
    (out / "results.md").write_text(to_markdown(table) + footnote)
    written = [out / "results.md", out / "results.csv"]
    faith = faithfulness_table(runs)
    notes: list[str] = []
    if faith is not None:
        faith.to_csv(out / "faithfulness.csv", index=False)
        (out / "faithfulness.md").write_text(markdown_table(faith, GROUP + ["explainer"]))
        written += write_design_comparison(runs, out)  # pooled over key sizes, and per key size where both ran
        agreement, notes = seed_agreement(runs)
        written += [out / "faithfulness.md", out / "faithfulness.csv"]
        if agreement is not None:
            agreement.to_csv(out / "seed_agreement.csv", index=False)
            (out / "seed_agreement.md").write_text(markdown_table(agreement, GROUP + ["explainer"]))
            written += [out / "seed_agreement.md", out / "seed_agreement.csv"]
    notes += ensure_key_aware(runs, compute=not args.no_key_aware, cache_dir=args.cache_dir or default_cache_dir(),
                              targets=args.key_aware_lengths)
    ka = key_aware_table(runs)
    plots = plot(table, out)
    if ka is not None:
        ka.to_csv(out / "key_aware.csv", index=False)
        lengths = key_aware_lengths(ka)
        lengths.to_csv(out / "key_aware_length.csv", index=False)
        (out / "key_aware.md").write_text(
            markdown_table(ka, GROUP + ["n"], digits=1)
            + "\n\nKey-aware identifiable length (longest tested n with no generatable alternative in any head):\n\n"
            + markdown_table(lengths, list(lengths.columns)))
        written += [out / "key_aware.md", out / "key_aware.csv", out / "key_aware_length.csv"]
        plots += plot_key_aware(ka, out)
    for note in notes:
        print(f"note: {note}")
    failed_text = f", {len(failed)} failed job(s) left out ({', '.join(failed)})" if failed else ""
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
            _report(args)
        except Exception as ex:
            message = user_error_message(ex)
            if message is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            sys.stdout.flush()
            print(f"Error: {message}", file=sys.stderr, flush=True)
            return 1
    return 0

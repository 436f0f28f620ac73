"""Arguments and ``main`` of ``python -m identifiable_transformers.report``."""

from __future__ import annotations

import argparse
from pathlib import Path

from .faithfulness import faithfulness_table, seed_agreement
from .key_aware import ensure_key_aware, key_aware_table
from .markdown import markdown_table
from .plots import plot
from .runs import GROUP, load_runs, summarise, to_markdown

DESCRIPTION = "Aggregate a sweep: python -m identifiable_transformers.report SWEEP_DIR [--out DIR] [--no-key-aware]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m identifiable_transformers.report", description=DESCRIPTION)
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: SWEEP_DIR)")
    parser.add_argument("--no-key-aware", action="store_true",
                        help="do not compute missing identifiability/key_aware.json files (slow: dense Jacobians)")
    args = parser.parse_args(argv)
    out = args.out or args.sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(args.sweep_dir)
    table = summarise(runs)
    runs.drop(columns=["_dir", "_best_model_path"]).to_csv(out / "results.csv", index=False)
    (out / "results.md").write_text(to_markdown(table))
    written = [out / "results.md", out / "results.csv"]
    faith = faithfulness_table(runs)
    notes: list[str] = []
    if faith is not None:
        faith.to_csv(out / "faithfulness.csv", index=False)
        (out / "faithfulness.md").write_text(markdown_table(faith, GROUP + ["explainer"]))
        agreement, notes = seed_agreement(runs)
        written += [out / "faithfulness.md", out / "faithfulness.csv"]
        if agreement is not None:
            agreement.to_csv(out / "seed_agreement.csv", index=False)
            (out / "seed_agreement.md").write_text(markdown_table(agreement, GROUP + ["explainer"]))
            written += [out / "seed_agreement.md", out / "seed_agreement.csv"]
    notes += ensure_key_aware(runs, compute=not args.no_key_aware)
    ka = key_aware_table(runs)
    if ka is not None:
        ka.to_csv(out / "key_aware.csv", index=False)
        (out / "key_aware.md").write_text(markdown_table(ka, GROUP + ["n"], digits=1))
        written += [out / "key_aware.md", out / "key_aware.csv"]
    plots = plot(table, out)
    for note in notes:
        print(f"note: {note}")
    print(f"{len(runs)} runs, {len(table)} configurations -> {', '.join(str(p) for p in written)}, "
          f"{', '.join(p.name for p in plots)}")
    return 0

"""Which code produced a table: one line under every markdown table the report writes, from the runs' provenance
(``metrics.json``'s ``provenance``, written by run/provenance.py). A table whose runs come from several commits, or
from a checkout with changed tracked files, says so in that line: its numbers may not all come from one code."""

from __future__ import annotations

import pandas as pd

SHORT = 7  # characters of a commit shown, as git log --oneline


def code_note(runs: pd.DataFrame) -> str:
    """One line naming the commit(s) behind ``runs`` (with the number of runs of each), the runs from a dirty tree,
    and those that recorded no commit; it starts with "**Mixed code**" when they are not one clean commit."""
    n = len(runs)
    commits = runs["commit"] if "commit" in runs else pd.Series([None] * n, index=runs.index)
    dirty = runs["dirty"] if "dirty" in runs else pd.Series([None] * n, index=runs.index)
    known = commits.dropna()
    if known.empty:
        return f"Code: not recorded ({n} runs from before metrics.json named its commit)."
    counts = known.value_counts()
    parts = [f"{c[:SHORT]} ({k} run{'s' if k > 1 else ''})" for c, k in sorted(counts.items(), key=lambda t: -t[1])]
    n_dirty = int((dirty == True).sum())  # noqa: E712 - None (unknown) is neither
    unknown_dirty = int((dirty.isna() & commits.notna()).sum())
    missing = n - len(known)
    notes = []
    if n_dirty:
        notes.append(f"{n_dirty} from a tree with changed tracked files (dirty)")
    if unknown_dirty:
        notes.append(f"{unknown_dirty} whose tree state is unknown")
    if missing:
        notes.append(f"{missing} with no recorded commit")
    mixed = len(counts) > 1 or n_dirty or missing
    head = "**Mixed code**: this table's runs come from " if mixed else "Code: "
    what = "commits " if len(counts) > 1 else "commit "
    return head + what + ", ".join(parts) + (f"; {', '.join(notes)}" if notes else "") + "."

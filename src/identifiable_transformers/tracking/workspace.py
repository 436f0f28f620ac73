"""A saved W&B workspace for the key-size study (docs/training.md, "W&B"):

    python -m identifiable_transformers.tracking.workspace --entity ENTITY [--project identifiable-transformers]

Needs a W&B login and a route to W&B (``--dry-run`` builds it and prints its sections without
saving). Runs are grouped by ``design`` (the model config: baseline or identifiable) and plotted
against ``epoch``; ``design`` and ``key_dim`` are the flat run-config keys ``train.py`` logs.
"""

from __future__ import annotations

import argparse
import os
import sys
from urllib.parse import urlparse

from ..data.sources import host_reachable

PROJECT = "identifiable-transformers"


def _libraries():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as err:  # pragma: no cover - it is in requirements.txt
        raise SystemExit(f"the workspace builder needs wandb-workspaces: pip install wandb-workspaces ({err})") from err
    return ws, wr


def key_size_workspace(entity: str, project: str = PROJECT, name: str = "Key-size study", tag: str | None = "key_size"):
    """The workspace object (not saved): accuracy and identifiability by epoch, grouped by design,
    and the final test accuracy and identifiable fraction against the key size."""
    ws, wr = _libraries()
    design = wr.Config("design")
    by_design = dict(groupby=design, groupby_aggfunc="mean", groupby_rangefunc="stderr")

    def by_epoch(title: str, *keys: str):
        return wr.LinePlot(title=title, x="epoch", y=list(keys), title_x="epoch", **by_design)

    def by_key_size(title: str, key: str):
        return wr.ScatterPlot(title=title, x=wr.Config("key_dim"), y=wr.SummaryMetric(key), log_x=True)

    accuracy = ws.Section(name="Accuracy", is_open=True, panels=[
        by_epoch("val/acc by epoch", "val/acc"),
        by_epoch("val/loss by epoch", "val/loss"),
        by_key_size("test accuracy against key size", "test/acc"),
        by_key_size("best val/acc against key size", "val/acc"),
    ])
    identifiability = ws.Section(name="Identifiability", is_open=True, panels=[
        by_epoch("identifiable fraction of (example, head)", "val/ident/identifiable_frac"),
        by_epoch("null dims (Brunner) and stochastic null dims", "val/ident/null_dim", "val/ident/stochastic_null_dim"),
        by_epoch("witness TV: how far another valid map can be", "val/ident/alt_tv"),
        by_key_size("identifiable fraction against key size", "val/ident/identifiable_frac"),
    ])
    filters = [ws.Tags("tags").isin([tag])] if tag else []
    return ws.Workspace(
        entity=entity, project=project, name=name,
        sections=[accuracy, identifiability],
        settings=ws.WorkspaceSettings(x_axis="epoch", max_runs=100),
        runset_settings=ws.RunsetSettings(groupby=[ws.Config("design")], filters=filters),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save the key-size study's W&B workspace.")
    parser.add_argument("--entity", required=True, help="your W&B user or team")
    parser.add_argument("--project", default=PROJECT)
    parser.add_argument("--name", default="Key-size study")
    parser.add_argument("--tag", default="key_size", help="show only runs with this tag ('' for all runs)")
    parser.add_argument("--dry-run", action="store_true", help="build and describe it, save nothing")
    args = parser.parse_args(argv)
    workspace = key_size_workspace(args.entity, args.project, args.name, args.tag or None)
    for section in workspace.sections:
        print(f"{section.name}: " + "; ".join(p.title for p in section.panels))
    if args.dry_run:
        return 0
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    if not host_reachable(host):  # fail fast instead of W&B's minutes of retries
        print(f"{host} is unreachable: the workspace needs a route to W&B (--dry-run builds it offline)",
              file=sys.stderr)
        return 1
    try:
        workspace.save()
    except Exception as err:  # no login, no network, no such project
        print(f"could not save the workspace to {args.entity}/{args.project}: {err}\n"
              "Log in with `wandb login` and make sure the project exists (sync a run first).", file=sys.stderr)
        return 1
    print(workspace.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why a context-mixing rollout finds (or misses) the rationale: per-layer maps, their diagonals, and the rollout
with and without an added identity, on the probe of a finished run.

    python bench/vz_rollout.py logs/train/runs/<date>              # a run of a task with rationales
    python bench/vz_rollout.py <run> --checkpoint <run>/checkpoints/last.ckpt

For each of ``value_zeroing`` and ``alti`` (docs/faithfulness.md, Context mixing) it prints, averaged over the
probe examples the run's ``identifiability/explanations.json`` holds (their tokens and rationales):

- ``diag``: each layer's mean self-share (the map's diagonal over the real tokens);
- the rationale AUPRC of each layer's map alone (``<name>_layer<k>``), of the rollout M_L ... M_1 (what the
  explainer scores), and of the rollout of 0.5 I + 0.5 M_l (the identity ``rollout`` adds to raw attention).

Value zeroing never zeroes token i's residual path, so its maps' diagonals miss what token i keeps of itself;
a rollout of maps with weak diagonals mixes every token into every other within a few layers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from identifiable_transformers.diagnostics.faithfulness import average_precision  # noqa: E402
from identifiable_transformers.diagnostics.faithfulness._common import _pinned, _pooled_rows, _scorable  # noqa: E402
from identifiable_transformers.diagnostics.faithfulness.context_mixing import (  # noqa: E402
    alti,
    rollout_maps,
    value_zeroing,
)
from identifiable_transformers.loading import load_module  # noqa: E402

MAPS = {"value_zeroing": value_zeroing, "alti": alti}


def auprc(model, M: torch.Tensor, ids: torch.Tensor, rationale: list[int]) -> float:
    """Rationale AUPRC of the pooled row of one example's map M (T, T)."""
    mask = torch.ones_like(ids, dtype=torch.bool)
    scores = _pooled_rows(model, M[None, None], mask)[:, 0]
    target = torch.zeros_like(mask)
    target[0, rationale] = True
    return float(average_precision(scores, target, _scorable(mask, _pinned(model, ids)))[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run folder (identifiability/explanations.json, tokenizer.json)")
    ap.add_argument("--checkpoint", type=Path, help="default: the run's best (first epoch_*.ckpt) checkpoint")
    args = ap.parse_args()
    explanations = json.loads((args.run / "identifiability" / "explanations.json").read_text())
    tok = Tokenizer.from_file(str(args.run / "tokenizer.json"))
    ckpt = args.checkpoint or sorted((args.run / "checkpoints").glob("epoch_*.ckpt"))[0]
    model = load_module(ckpt).eval().model
    rows: dict[str, list[list[float]]] = {}
    for tokens, rationale in zip(explanations["tokens"], explanations["rationales"]):
        if not rationale:
            continue
        ids = torch.tensor([[tok.token_to_id(t) for t in tokens]])
        eye = torch.eye(ids.shape[1])
        for name, fn in MAPS.items():
            maps = fn(model, ids)[0]  # (L, T, T)
            diag = torch.diagonal(maps, dim1=1, dim2=2).mean(1).tolist()
            auprcs = [auprc(model, m, ids, rationale) for m in maps]
            auprcs += [auprc(model, rollout_maps(maps[None])[0], ids, rationale),
                       auprc(model, rollout_maps((0.5 * eye + 0.5 * maps)[None])[0], ids, rationale)]
            rows.setdefault(f"{name} diag", []).append(diag)
            rows.setdefault(f"{name} auprc", []).append(auprcs)
    layers = len(next(iter(rows.values()))[0])
    print(f"{ckpt}: {len(rows['alti diag'])} probe examples with a rationale, pooling={model.pooling}")
    print("| | " + " | ".join(f"layer {k}" for k in range(layers)) + " | rollout | rollout of 0.5 I + 0.5 M |")
    print("|---" * (layers + 3) + "|")
    for key, values in rows.items():
        mean = torch.tensor(values).mean(0).tolist()
        print(f"| {key} | " + " | ".join(f"{v:.3f}" for v in mean) + (" | | |" if "diag" in key else " |"))


if __name__ == "__main__":
    main()

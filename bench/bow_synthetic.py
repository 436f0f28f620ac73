"""How far a bag of words gets on a dataset: a multinomial logistic regression on token counts.

    python bench/bow_synthetic.py                       # the three synthetic tasks, their default settings
    python bench/bow_synthetic.py synthetic_order rt_offline --seeds 0 1

Each dataset is read through ``TextDataModule.from_name`` (the same splits, tokenizer and cache as
``python train.py data=NAME``). The features are the token counts of each example (``<cls>`` left out), or
with ``--binary`` whether each token occurs. The model (a linear layer, L2 weight ``--l2``) is fitted on the
training split with L-BFGS to convergence, and its accuracy is measured on the test split. ``--seeds`` draws
the synthetic data again with other generator seeds. Chance is the test share of the most frequent class.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torchmetrics.functional import accuracy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from identifiable_transformers.data import CLS_ID, TextDataModule  # noqa: E402


def counts(ds, vocab: int, binary: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, vocab) token counts without <cls>, and the (N,) labels."""
    x = torch.zeros(len(ds), vocab)
    for i, ids in enumerate(ds["input_ids"]):
        x[i] += torch.bincount(torch.as_tensor(ids[1:], dtype=torch.long), minlength=vocab)[:vocab]
    x[:, CLS_ID] = 0
    return (x > 0).float() if binary else x, torch.as_tensor(ds["labels"])


def bow_accuracy(dm: TextDataModule, binary: bool = False, l2: float = 1e-4) -> tuple[float, float]:
    """(test accuracy of the count-based logistic regression, chance)."""
    dm.prepare_data()
    dm.setup()
    v, c = dm.vocab_size, dm.num_classes
    xtr, ytr = counts(dm.train_dataset, v, binary)
    xte, yte = counts(dm.test_dataset, v, binary)
    model = torch.nn.Linear(v, c)
    opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=500, tolerance_grad=1e-6, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(xtr), ytr) + l2 * model.weight.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        acc = accuracy(model(xte).argmax(-1), yte, task="multiclass", num_classes=c).item()
    chance = torch.bincount(yte, minlength=c).max().item() / len(yte)
    return acc, chance


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=["synthetic_presence", "synthetic_order", "synthetic_majority"])
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="generator seeds of the synthetic tasks")
    ap.add_argument("--binary", action="store_true", help="presence features instead of counts")
    ap.add_argument("--l2", type=float, default=1e-4)
    ap.add_argument("--cache-dir", default=os.environ.get("IDT_CACHE_DIR", "~/.cache/identifiable_transformers"))
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"| data | generator seed | bag-of-words test acc ({'presence' if args.binary else 'counts'}) | chance |")
    print("|---|---|---|---|")
    for name in args.names:
        base = TextDataModule.from_name(name, cache_dir=args.cache_dir)
        for seed in (args.seeds if base.synthetic is not None and args.seeds else [None]):
            over = {"synthetic": {**base.synthetic.as_dict(), "seed": seed}} if seed is not None else {}
            dm = TextDataModule.from_name(name, cache_dir=args.cache_dir, **over)
            acc, chance = bow_accuracy(dm, args.binary, args.l2)
            shown = dm.synthetic.seed if dm.synthetic is not None else "-"
            print(f"| `{name}` | {shown} | {acc:.3f} | {chance:.3f} |", flush=True)


if __name__ == "__main__":
    main()

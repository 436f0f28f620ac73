"""Cost of the context-mixing explainers (value zeroing, ALTI, the norm with residual and LayerNorm) next to the
other explainers, as a share of one training epoch (docs/faithfulness.md, Cost).

Per encoder, side by side in one process: one training epoch (``--examples`` synthetic examples, lengths a
clipped log-normal with the Rotten Tomatoes median ~22 tokens, at most 60, batch 64 (32 for the pretrained
encoder), forward + backward + AdamW), and each explainer alone (``explain`` with that one name) on a 64-example
probe stratified like the callback's (the same draw as bench_diagnostics.py). Encoders: the project's default
(embed 64, 4 heads, one post-norm layer, ffn 256; concat and add with key size 1) and, unless ``--no-pretrained``,
a random MiniLM-shaped BERT (6 layers, hidden 384, 12 heads, ffn 1536: ``all-MiniLM-L6-v2``'s shape) built from
a ``BertConfig`` (no download). With ``--steps N`` the pretrained epoch is extrapolated from N timed training
steps (the whole epoch is long on a CPU). Usage:

    python bench/bench_context_mixing.py [--examples 6800] [--device cpu|cuda] [--steps 8] [--no-pretrained | --no-own]
                                         [--explainers attention,loo,value_zeroing,alti,norm_resln]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_diagnostics import _batch, _lengths, _sync  # noqa: E402

from identifiable_transformers.diagnostics.callbacks.identifiability import select_probe_indices  # noqa: E402
from identifiable_transformers.diagnostics.callbacks.probes import doubling_strata  # noqa: E402
from identifiable_transformers.diagnostics.faithfulness import explain  # noqa: E402
from identifiable_transformers.models import TransformerClassifier  # noqa: E402

VOCAB = 20_000
DEFAULT_EXPLAINERS = "attention,rollout,grad_input,loo,value_zeroing,alti,norm_resln"


def _epoch_seconds(model, lengths, rng, device, batch_size: int, steps: int | None) -> float:
    """Wall seconds of one epoch: all of it, or ``steps`` timed steps scaled to the epoch's step count."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    order = rng.permutation(len(lengths))
    starts = list(range(0, len(order), batch_size))
    timed = starts if steps is None else starts[:steps]
    model.train()
    _sync(device)
    t = time.perf_counter()
    for i in timed:
        ids, mask = _batch(lengths[order[i:i + batch_size]], rng, device)
        loss = F.cross_entropy(model(ids, mask).logits, torch.randint(0, 2, (ids.shape[0],), device=device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(device)
    return (time.perf_counter() - t) * len(starts) / len(timed)


def _explainer_seconds(model, ids, mask, name: str, device: str) -> float:
    explain(model, ids[:2], mask[:2], [name])  # warm-up
    _sync(device)
    t = time.perf_counter()
    explain(model, ids, mask, [name])
    _sync(device)
    return time.perf_counter() - t


def _minilm_shaped(device: str):
    from transformers import AutoModel, BertConfig

    from identifiable_transformers.hf.adapters import ATTENTION, family_for, register_attention
    from identifiable_transformers.hf.encoder import PretrainedClassifier

    register_attention()
    config = BertConfig(vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512)
    encoder = AutoModel.from_config(config, attn_implementation=ATTENTION)
    return PretrainedClassifier(encoder, family_for(config), num_classes=2).to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=6800)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=None, help="time this many training steps and scale to the epoch")
    p.add_argument("--no-pretrained", action="store_true")
    p.add_argument("--no-own", action="store_true", help="only the MiniLM-shaped encoder")
    p.add_argument("--explainers", default=DEFAULT_EXPLAINERS)
    args = p.parse_args()
    names = args.explainers.split(",")
    rng = np.random.default_rng(0)
    lengths = _lengths(args.examples, rng)
    val_lengths = _lengths(2000, rng)
    probe_lengths = val_lengths[select_probe_indices(val_lengths, 64, seed=0, max_length=60,
                                                     strata=doubling_strata(60))]
    ids, mask = _batch(probe_lengths, rng, args.device)
    ids[:, 0] = 2  # <cls> first, as the data module writes it
    torch.manual_seed(0)
    models = [(f"own {c}", TransformerClassifier(VOCAB, 2, head_combine=c, key_dim=1 if c == "add" else None)
               .to(args.device), 64) for c in ("concat", "add") if not args.no_own]
    if not args.no_pretrained:
        models.append(("MiniLM-shaped BERT (6x384)", _minilm_shaped(args.device), 32))
    print(f"device={args.device} threads={torch.get_num_threads()} train examples={args.examples} probe=64 "
          f"(lengths {int(probe_lengths.min())}-{int(probe_lengths.max())}); wall seconds, % of one epoch")
    for label, model, batch_size in models:
        steps = args.steps if label.startswith("MiniLM") else None
        epoch = _epoch_seconds(model, lengths, np.random.default_rng(2), args.device, batch_size, steps)
        extrapolated = f", from {steps} steps" if steps else ""
        print(f"{label}: epoch {epoch:.1f}s{extrapolated}", flush=True)
        for n in names:
            s = _explainer_seconds(model, ids, mask, n, args.device)
            print(f"  {n:<14}{s:8.2f}s {100 * s / epoch:6.1f}% of the epoch", flush=True)


if __name__ == "__main__":
    main()

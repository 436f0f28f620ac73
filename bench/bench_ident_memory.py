"""Peak memory the identifiability pass adds on a MiniLM-shaped encoder at 512 tokens (issue 39).

A random BERT with all-MiniLM-L6-v2's sizes (6 layers, hidden 384, 12 heads, intermediate 1536, 512 positions;
a small vocabulary: the embeddings do not matter here), wrapped as the pretrained classifier, analysed by
``attention_identifiability`` on a probe padded to 512 tokens whose longest ``chunk`` examples have 512 real
tokens (the worst chunk: every chunk runs at the probe's width, and the maths of the longest dominates). The
peak is the child process's resident high-water mark after the pass minus before it (the model built and run
once). ``--bert-base`` uses BERT-base's sizes (12 layers, 768, 12 heads, 3072). Usage:

    python bench/bench_ident_memory.py [--probe 8] [--chunk 2] [--threads 2] [--bert-base] [--whole]

``--whole`` analyses the whole probe at once (chunk_size=None), as before issue 39: at 512 tokens that needs
gigabytes per probe example, so keep ``--probe`` small with it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, time, torch
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
from transformers import AutoModel, BertConfig
from identifiable_transformers.diagnostics.maths import attention_identifiability
from identifiable_transformers.hf.adapters import ATTENTION, BERT, register_attention
from identifiable_transformers.hf.encoder import PretrainedClassifier

register_attention()
torch.manual_seed(0)
config = BertConfig(vocab_size=1000, hidden_size=a["d"], num_hidden_layers=a["layers"], num_attention_heads=12,
                    intermediate_size=4 * a["d"], max_position_embeddings=512)
model = PretrainedClassifier(AutoModel.from_config(config, attn_implementation=ATTENTION), BERT, 2).eval()
P, W = a["probe"], 512
longest = min(P, a["chunk"] or P)
lengths = [W] * longest + [max(8, W >> (i + 1)) for i in range(P - longest)]  # 512 x chunk, then 256, 128, ...
ids = torch.randint(5, 1000, (P, W))
mask = torch.arange(W)[None] < torch.tensor(lengths)[:, None]
ids[~mask] = 0
with torch.no_grad():
    model(ids[:1], mask[:1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t, c = time.perf_counter(), time.process_time()
rep = attention_identifiability(model, ids, mask, chunk_size=a["chunk"])
s, cpu = time.perf_counter() - t, time.process_time() - c
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"before_mb": before, "peak_mb": after, "added_mb": after - before, "s": s, "cpu": cpu,
                  "lengths": lengths, "null_dim_mean": float(rep["null_dim"].double().mean())}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--probe", type=int, default=8)
    p.add_argument("--chunk", type=int, default=2, help="the callback's chunk_size (its default: 2)")
    p.add_argument("--whole", action="store_true", help="chunk_size=None: the whole probe at once")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bert-base", action="store_true")
    a = p.parse_args()
    layers, d = (12, 768) if a.bert_base else (6, 384)
    arg = {"probe": a.probe, "chunk": None if a.whole else a.chunk, "threads": a.threads, "layers": layers, "d": d}
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(arg)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    name = "BERT-base" if a.bert_base else "MiniLM"
    print(f"{name}-shaped random encoder, probe {a.probe} at width 512 (lengths {r['lengths']}), "
          f"chunk_size={arg['chunk']}, {a.threads} threads: adds {r['added_mb']:.0f} MB "
          f"(resident {r['before_mb']:.0f} -> {r['peak_mb']:.0f} MB), {r['s']:.0f} s (cpu {r['cpu']:.0f} s)")


if __name__ == "__main__":
    main()

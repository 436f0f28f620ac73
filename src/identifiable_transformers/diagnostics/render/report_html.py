"""Self-contained HTML identifiability report for a few inputs (used by ``analyze.py``).

Per example: the text, the prediction, then a layer x head overview (overview.py): one cell per head coloured by a
measure the reader picks (null dim, stochastic null dim, witness TV, effective-attention gap, epsilon-TV), with per-
layer counts of non-identifiable heads. A cell links to ``#ex{b}-l{l}-h{h}``, which shows that head's raw /
effective / witness maps (no witness for an identifiable head), drawn in the browser from data embedded in the page
(head_data.py: block-averaged to at most 64 x 64 cells, uint8, base64), so the page grows with heads x tokens, not
with pictures. Under the head, one token heat-strip per explainer of ``faithfulness.faithfulness_report`` with the
example's comprehensiveness, sufficiency, tau with leave-one-out and decision-flip fraction beside it
(docs/faithfulness.md). When the examples come with rationales (a dataset split that has them), the rationale tokens
are underlined on every strip and each explainer's rationale_auprc and rationale_f1 join the metrics. The per-head
table (null dims, the witness's TV distance and the check that it reproduces the head output, ...) follows, folded.
``example{i}.png`` next to the page is a layers x heads grid of the same maps (plots.plot_attention_grid), at most
4,000 pixels a side.

Progress: a log line as each stage starts and ends (with its time), and over the examples a tqdm bar when
stderr is a terminal, else a log line every tenth of them.
"""

from __future__ import annotations

import html
import json
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ...common.files import atomic_write
from ...common.progress import stage
from ..maths import attention_identifiability, identifiable_length, key_aware_alternative_dims
from ..maths.key_aware import UNRESOLVED_MARGIN
from .assets import CSS, script
from .head_data import example_data, layer_totals
from .overview import data_script, detail_html, overview_html

__all__ = ["build_report", "tokens_for_batch"]

log = logging.getLogger(__name__)


def _stage(what: str):
    """Log ``what`` as it starts and its time when it ends (to this module's logger)."""
    return stage(what, say=log.info)


def _examples(n: int) -> Iterator[int]:
    """range(n) with progress: a tqdm bar on a terminal, else a log line every tenth of the examples."""
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        yield from tqdm(range(n), desc="report: examples", unit="example", file=sys.stderr, leave=False)
        return
    every = max(1, math.ceil(n / 10))
    for b in range(n):
        yield b
        if (b + 1) % every == 0 or b + 1 == n:
            log.info("report: %d/%d examples drawn", b + 1, n)

_STRIP_METRICS = (("comprehensiveness", "compr. ↑"), ("sufficiency", "suff. ↓"), ("tau_loo", "τ with loo ↑"),
                  ("flip_frac", "flip frac. ↓"))
_RATIONALE_METRICS = (("rationale_auprc", "AUPRC rat. ↑"), ("rationale_f1", "F1 rat. ↑"))


def _faithfulness(model, input_ids, attention_mask, rationale_mask, tier) -> dict:
    """The explainers' scores and metrics as ``tier`` (faithfulness/tiers.py) says; progress to this module's log."""
    from ..faithfulness import faithfulness_report

    return faithfulness_report(model, input_ids, attention_mask, rationale_mask=rationale_mask,
                               explainers=tier.explainers, random_draws=tier.random_draws,
                               flip_resolution=tier.flip_resolution, loo=tier.loo, say=log.info)


def _prediction(logits: torch.Tensor, label_names: Sequence[str] | None) -> dict[str, Any]:
    """report.json's prediction of one example: the argmax's label and id, the softmax and the logits."""
    probs = logits.double().softmax(-1)
    pred = int(probs.argmax())
    label = label_names[pred] if label_names is not None and pred < len(label_names) else str(pred)
    return {"label": label, "label_id": pred, "probabilities": probs.tolist(), "logits": logits.double().tolist()}


def heat_strip(tokens: Sequence[str], scores: Sequence[float], marked: Sequence[int] = ()) -> str:
    """Tokens as spans shaded by score / max |score| (red positive, blue negative); the value in data-score.

    Tokens at the ``marked`` indices (the rationale) are underlined and carry data-rationale='1'.
    """
    top = max((abs(float(x)) for x in scores), default=0.0) or 1.0
    marked = set(marked)
    spans = []
    for i, (tok, x) in enumerate(zip(tokens, scores)):
        a = abs(float(x)) / top
        rgb = "214,39,40" if x >= 0 else "31,119,180"
        mark = " rat' data-rationale='1" if i in marked else ""
        spans.append(f"<span class='tok{mark}' data-score='{float(x):.6g}' title='{float(x):.4g}' "
                     f"style='background:rgba({rgb},{a:.3f})'>{html.escape(tok)}</span>")
    return "".join(spans)


def _faithfulness_rows(faith: dict, b: int, tokens: Sequence[str], n: int,
                       rationale: Sequence[int] | None = None) -> tuple[str, dict]:
    """The example's strips table (tokens 1..n-1: position 0, <cls>, is never scored) and its JSON record.

    ``rationale``: the example's rationale positions (into its tokens), underlined on every strip.
    """
    record = {"metrics": {}, "scores": {}}
    columns = _STRIP_METRICS + (_RATIONALE_METRICS if rationale is not None else ())
    marked = [j - 1 for j in rationale or () if 1 <= j < n]  # strip index = position - 1
    rows = []
    for e, s in faith["scores"].items():
        values = [float(x) for x in s[b, 1:n]]
        metrics = {m: float(faith["per_example"][f"{e}/{m}"][b]) for m, _ in columns
                   if f"{e}/{m}" in faith["per_example"]}
        metrics = {m: v if math.isfinite(v) else None for m, v in metrics.items()}  # tau is undefined for n < 3
        record["scores"][e], record["metrics"][e] = [0.0, *values], metrics
        cells = "".join(f"<td>{metrics[m]:.3f}</td>" if metrics.get(m) is not None else "<td>n/a</td>"
                        for m, _ in columns)
        rows.append(f"<tr data-explainer='{html.escape(e)}'><th class='l'>{html.escape(e)}</th>"
                    f"<td class='strip'>{heat_strip(list(tokens)[1:n], values, marked)}</td>{cells}</tr>")
    if rationale is not None:
        record["rationale"] = [int(j) for j in rationale]
    head = "<tr><th class='l'>explainer</th><th class='l'>tokens 1..n−1</th>" + "".join(
        f"<th>{label}</th>" for _, label in columns) + "</tr>"
    return "<table class='faith'>" + head + "".join(rows) + "</table>", record


def tokens_for_batch(tokenizer, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[str]]:
    """Token strings of each example's real tokens (``id_to_token``; unknown ids shown as numbers)."""
    out = []
    for ids, m in zip(input_ids.tolist(), attention_mask.bool().tolist()):
        out.append([(tokenizer.id_to_token(i) if tokenizer is not None else None) or str(i)
                    for i, keep in zip(ids, m) if keep])
    return out


def _verdict(null_dim: int, stoch: int, tv: float) -> str:
    if stoch == 0:
        return ('<span class="ok">identifiable</span>' if null_dim == 0 else
                '<span class="ok">identifiable among distributions</span>')
    return f'<span class="bad">not identifiable</span>: a different map (TV {tv:.3f}) gives the same output'


def _head_table(rep: dict[str, Any], ka: dict[str, Any] | None, b: int, n: int, L: int, H: int
                ) -> tuple[str, list[dict[str, Any]]]:
    """Example ``b``'s per-head table (HTML) and its report.json records."""
    head_cols = ["layer", "head", "null", "stoch. null", "verdict", "witness TV", "rel. err. A'T vs AT",
                 "eff. gap", "σmin/σmax", "entropy"] + (["key-aware alt. dim", "key-agnostic"] if ka else [])
    rows, records = [], []
    for l in range(L):
        for h in range(H):
            r = {"example": b, "layer": l, "head": h, "length": n,
                 **{k: (int(rep[k][b, l, h]) if rep[k].dtype == torch.long else float(rep[k][b, l, h]))
                    for k in ("null_dim", "stochastic_null_dim", "alt_attention_tv", "witness_rel_error",
                              "effective_gap", "sigma_ratio", "attention_entropy", "tol")}}
            if ka:
                r["key_aware_alternative_dim"] = int(ka["alternative_dim"][b, l, h])
                r["key_agnostic_dim"] = int(ka["key_agnostic_dim"][b, l, h])
                r["key_aware_resolved"] = bool(ka["resolved"][b, l, h])
                r["key_aware_margin"] = ka["margin"][b][l][h]  # None: no rank decision near a tolerance
            records.append(r)
            cells = [l, h, r["null_dim"], r["stochastic_null_dim"],
                     _verdict(r["null_dim"], r["stochastic_null_dim"], r["alt_attention_tv"]),
                     f"{r['alt_attention_tv']:.3f}", f"{r['witness_rel_error']:.1e}", f"{r['effective_gap']:.3f}",
                     f"{r['sigma_ratio']:.1e}", f"{r['attention_entropy']:.2f}"]
            if ka:
                alt = r["key_aware_alternative_dim"]
                if not r["key_aware_resolved"]:  # float64 cannot tell this count from a neighbouring one
                    m = r["key_aware_margin"]
                    alt = f"{alt} <span class='bad'>unresolved (margin {'n/a' if m is None else f'{m:.1f}'})</span>"
                cells += [alt, r["key_agnostic_dim"]]
            rows.append("<tr>" + "".join(f"<td{' class=l' if i == 4 else ''}>{c}</td>"
                                         for i, c in enumerate(cells)) + "</tr>")
    return ("<table><tr>" + "".join(f"<th>{c}</th>" for c in head_cols) + "</tr>" + "".join(rows) + "</table>",
            records)


def build_report(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    output_dir: str | Path,
    *,
    tokens: Sequence[Sequence[str]],
    texts: Sequence[str] | None = None,
    label_names: Sequence[str] | None = None,
    title: str = "Attention identifiability report",
    meta: dict[str, Any] | None = None,
    key_aware: bool = False,
    faithfulness: bool = True,
    rationales: Sequence[Sequence[int]] | None = None,
    length_bins: Sequence[int] | None = None,
    explainers: Sequence[str] | str | None = None,
) -> Path:
    """Write ``report.html`` (self-contained: maps as data, drawn by its inline script), ``example{i}.png`` (a layers x
    heads grid of each example's maps) and ``report.json``; return the HTML path.

    ``tokens[i]`` are example i's real-token strings; ``key_aware`` adds the docs/identifiability.md 2.5 count of
    alternatives the head itself could generate (dense Jacobians: slow beyond ~40 tokens); ``faithfulness``
    adds the explainers' heat-strips and per-example metrics (docs/faithfulness.md); ``rationales[i]`` (token
    positions into example i, from a dataset split that has rationales) underlines them on the strips and
    adds the plausibility metrics. ``length_bins`` (token counts): every explainer (integrated gradients too) is
    scored, and the faithfulness and plausibility tables per cumulative length bin head the report
    (``faithfulness_tables``). ``explainers``: what is scored, a tier name (faithfulness/tiers.py: "all", "cheap",
    "fast") or a list of explainers (with the "all" tier's settings); None: "all" with ``length_bins``, else
    "cheap". report.json's ``examples`` hold each example's prediction ({label, label_id, probabilities, logits}); a
    model without a head (``has_head`` False: a bare encoder) gets none (null) and no faithfulness.
    """
    from .plots import figure_to_png, plot_attention_grid

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_was_training = model.training
    model.eval()
    B, T = input_ids.shape
    has_head = getattr(model, "has_head", True)
    faithfulness = faithfulness and has_head
    from ..faithfulness import resolve_tier

    tier = resolve_tier(explainers if explainers is not None else "all" if length_bins is not None else "cheap")
    with _stage(f"report: identifiability of {B} example(s) of up to {T} tokens"):
        logits = probs = None
        if has_head:
            with torch.no_grad():
                logits = model(input_ids, attention_mask).logits.float().cpu()
            probs = logits.softmax(-1)
        model.train(model_was_training)
        rep = attention_identifiability(model, input_ids, attention_mask, return_maps=True, say=log.info)
    ka = None
    if key_aware:
        with _stage(f"report: key-aware count of {B} example(s) x {model.num_layers} layer(s) x {model.num_heads} "
                    f"head(s), up to {T} tokens (dense Jacobians: minutes for long inputs)"):
            ka = key_aware_alternative_dims(model, input_ids, attention_mask)
    bounds = identifiable_length(model.head_combine, model.embed_dim, model.num_heads, model.value_dim)
    B, L, H = rep["null_dim"].shape
    rationale_mask = None
    if rationales is not None:
        from ..faithfulness import rationale_mask as to_mask

        rationale_mask = to_mask(rationales, input_ids.shape[1])
    faith = None
    if faithfulness:
        with _stage(f"report: token explanations and their faithfulness for {B} example(s)"):
            faith = _faithfulness(model, input_ids, attention_mask, rationale_mask, tier)
    faith_records = []
    table_rows = None
    if faith is not None and length_bins is not None:
        from .faithfulness_tables import faithfulness_by_length, tables_html

        table_rows = faithfulness_by_length(faith["per_example"], list(faith["scores"]),
                                            rep["lengths"].tolist(), length_bins)

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    cfg = {"head_combine": model.head_combine, "embed_dim d": model.embed_dim, "num_heads h": model.num_heads,
           "key_dim": model.key_dim, "value_dim d_v": model.value_dim, "num_layers": model.num_layers,
           **(meta or {})}
    parts.append("<table>" + "".join(f"<tr><th class='l'>{html.escape(str(k))}</th><td class='l'>"
                                     f"{html.escape(str(v))}</td></tr>" for k, v in cfg.items()) + "</table>")
    parts.append(
        "<p>A head's map A is <b>identifiable</b> when no other attention map gives the same head output A·T, "
        "T = V W<sub>o</sub><sup>h</sup> on the example's real tokens (docs/identifiability.md §2). "
        f"For this model a head is identifiable up to <b>n = {bounds['head']}</b> tokens "
        f"(<b>{bounds['head_stochastic']}</b> among row-stochastic maps); from the layer's summed output the "
        f"{model.num_heads} heads are jointly identifiable only up to n = {bounds['joint']} "
        f"({bounds['joint_stochastic']} row-stochastic). "
        "<i>null</i> = n − rank(T); <i>stoch. null</i> = n − rank([T, 1]); the <i>witness</i> A' is a constructed "
        "non-negative, row-stochastic map with A'T = AT; its TV distance to A (max over query rows) shows how "
        "different an equally valid explanation can be; <i>rel. err.</i> = ‖A'T − AT‖/‖AT‖ checks it. "
        "<i>eff. gap</i> = ‖A − A<sub>eff</sub>‖/‖A‖, the share of attention the output cannot see (Brunner's "
        "effective attention)."
        + (" <i>key-aware alt. dim</i> = how many of the key-agnostic alternatives the head could produce itself by "
           "changing its queries and keys (docs/identifiability.md §2.5); a count marked <i>unresolved</i> has a "
           f"margin below {UNRESOLVED_MARGIN:g}: float64 cannot tell it from a neighbouring count, so it is not a "
           "property of the head." if ka else "") + "</p>")
    if table_rows:
        parts.append(tables_html(table_rows) + "<p>Each row: the mean over the report's examples of at most that "
                     "many tokens; per-example values below.</p>")
    records, examples = [], []
    for b in _examples(B):
        n = int(rep["lengths"][b])
        parts.append(f"<h2 id='ex{b}'>Example {b} — n = {n} tokens</h2>")
        if texts is not None:
            parts.append(f"<div class='text'>{html.escape(texts[b])}</div>")
        prediction = None
        if logits is not None:
            prediction = _prediction(logits[b], label_names)
            said = (f"Prediction: <b>{html.escape(prediction['label'])}</b> "
                    f"(p = {float(probs[b, prediction['label_id']]):.3f}). ")
        else:
            said = f"No prediction: {getattr(model, 'why_no_prediction', 'the model is an encoder without a head')}. "
        examples.append({"example": b, "length": n, "prediction": prediction})
        shown = " ".join(tokens[b]) if n <= 200 else " ".join(list(tokens[b])[:200]) + f" … ({n - 200} more)"
        parts.append(f"<p>{said}Tokens: <code>{html.escape(shown)}</code></p>")
        data = example_data(rep, b, tokens[b])
        parts.append(overview_html(data, layer_totals(rep["stochastic_null_dim"][b])))
        below = ""
        if faith is not None:
            table, record = _faithfulness_rows(faith, b, tokens[b], n,
                                               None if rationales is None else rationales[b])
            below = ("<h3>Token explanations and their faithfulness</h3><p>Each token shaded by the explainer's "
                     "score relative to its largest |score| (red positive, blue negative; hover for the value). "
                     "compr. = drop in p(prediction) when the top tokens are removed (higher is more faithful); "
                     "suff. = drop when only they are kept (lower); τ = Kendall τ-b with leave-one-out; flip "
                     "frac. = share of tokens removed in the explainer's order before the prediction changes "
                     "(lower). AOPC over 1, 5, 10, 20, 50% of the tokens; see docs/faithfulness.md."
                     + (" <span class='rat'>Underlined</span> tokens are the dataset's rationale; AUPRC and F1 "
                        "rat. score each explainer against it (higher is more plausible)."
                        if rationales is not None else "") + "</p>" + table)
            faith_records.append({"example": b, **record})
        parts.append(detail_html(b, below))
        parts.append(data_script(data))
        table_html, head_records = _head_table(rep, ka, b, n, L, H)
        records += head_records
        parts.append(f"<details><summary>Per-head table ({L * H} heads)</summary>{table_html}</details>")
        parts.append("<p>Layer-level joint null dim (H·n − rank of the stacked T's): "
                     + ", ".join(f"layer {l}: {int(rep['joint_null_dim'][b, l])}" for l in range(L)) + "</p>")
        m = rep["maps"][b]
        fig = plot_attention_grid({"raw A": m["attention"], "effective A_eff": m["effective"],
                                   "witness A' (grey: identifiable, no witness)": m["alternative"]},
                                  null_dim=rep["null_dim"][b], stochastic_null_dim=rep["stochastic_null_dim"][b],
                                  title=f"example {b} (n={n}): each map on its own scale; frame green = identifiable, "
                                        "red = not; number = null dim")
        atomic_write(out / f"example{b}.png", figure_to_png(fig, dpi=fig.dpi))
    equivalence_records: list = []
    if faithfulness and tier.equivalence:
        from .equivalence_html import equivalence_section

        with _stage(f"report: output-equivalent explanations of {B} example(s) (linear programs)"):
            section, equivalence_records = equivalence_section(
                model, input_ids, attention_mask, tokens, rationale_mask, loo=faith.get("loo"),
                flip_resolution=tier.flip_resolution)
        parts += section
    parts.append(f"<script>{script()}</script></body></html>")
    path = out / "report.html"
    atomic_write(path, "\n".join(parts))
    atomic_write(out / "report.json", json.dumps({"bounds": bounds, "config": cfg, "examples": examples,
                                                   "heads": records,
                                                   **({"faithfulness": faith_records} if faith else {}),
                                                   **({"faithfulness_by_length": table_rows} if table_rows else {}),
                                                   **({"equivalence": equivalence_records} if equivalence_records
                                                      else {})}, indent=1))
    return path

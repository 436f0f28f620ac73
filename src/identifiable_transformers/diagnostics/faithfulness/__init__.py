"""Is the attention an explanation? Token-importance explainers and faithfulness metrics (docs/faithfulness.md).

Everything works on one batch of a ``TransformerClassifier``: ``input_ids`` (B, T) with ``<cls>`` at
position 0 and ``attention_mask`` (B, T), True for real tokens. Position 0 is never scored or removed;
its score and every padding position's score is 0.

Removing a token means masking it out of the attention keys exactly like padding (its
``attention_mask`` entry set False): the model sees the shorter sequence, and the remaining tokens
keep their positions. No ``<unk>`` is substituted. Every erasure curve is batched: the masked copies
of all examples (all bins, all prefixes of an order) run as a few large forward passes.

Entry points:
    explain(model, input_ids, attention_mask, explainers, seed)            -> {name: (B, T) scores}
    faithfulness_report(model, input_ids, attention_mask, labels, ...)     -> scores, metrics, per example
    plausibility_metrics(scores, attention_mask, rationale_mask)          -> rationale_auprc / rationale_f1
    integrated_gradients(model, input_ids, attention_mask, n_steps)        -> (scores, convergence delta)
    value_zeroing / alti / norm_resln(model, input_ids, attention_mask)   -> (B, L, T, T) context-mixing maps
    adversarial_attention(model, input_ids, attention_mask, eps, ...)      -> (B, H) largest TV found
    uniform_attention_logits(model, input_ids, attention_mask)             -> logits under 1/n attention
    project_simplex(v, mask), kendall_tau_b(x, y, valid)                   -> the building blocks

The code is split by concept: ``explainers`` (the scores), ``erasure`` (comprehensiveness, sufficiency,
flip fraction), ``agreement`` (Kendall tau), ``uniform`` (the uniform-attention control), ``report``
(faithfulness_report), ``context_mixing`` (value zeroing, ALTI, the norm with residual and LayerNorm),
``plausibility`` (scores against rationales), ``random_control`` (the
per-example seeded random order), ``tiers`` (what an analysis computes), ``adversarial`` (the search and the
simplex projection), ``readout`` (how the masked copies run) and ``_common`` (shared helpers).
"""

from ...data.rationales import rationale_mask  # the batches' mask, one definition for data and diagnostics
from .adversarial import adversarial_attention, project_simplex
from .agreement import kendall_tau_b
from .context_mixing import CONTEXT_MIXING, alti, context_mixing_name, norm_resln, rollout_maps, value_zeroing
from .erasure import AOPC_BINS
from .explainers import CHEAP_EXPLAINERS, EXPLAINERS, explain, integrated_gradients, unknown_explainers
from .plausibility import PLAUSIBILITY_METRICS, average_precision, plausibility_metrics
from .random_control import RANDOM_DRAWS, random_draws, random_scores
from .report import METRICS, faithfulness_report
from .tiers import FAST_EXPLAINERS, TIERS, Tier, resolve_tier
from .uniform import uniform_attention_logits

__all__ = [
    "AOPC_BINS",
    "CHEAP_EXPLAINERS",
    "CONTEXT_MIXING",
    "EXPLAINERS",
    "FAST_EXPLAINERS",
    "METRICS",
    "PLAUSIBILITY_METRICS",
    "RANDOM_DRAWS",
    "TIERS",
    "Tier",
    "adversarial_attention",
    "alti",
    "average_precision",
    "context_mixing_name",
    "explain",
    "faithfulness_report",
    "integrated_gradients",
    "kendall_tau_b",
    "norm_resln",
    "plausibility_metrics",
    "project_simplex",
    "random_draws",
    "random_scores",
    "resolve_tier",
    "rollout_maps",
    "rationale_mask",
    "uniform_attention_logits",
    "unknown_explainers",
    "value_zeroing",
]

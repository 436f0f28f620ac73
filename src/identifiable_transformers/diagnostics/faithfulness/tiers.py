"""What an analysis computes, as named tiers (``analyze.py explainers=all|cheap|fast``; docs/faithfulness.md, "Tiers").

A long text (512 word pieces) costs an analysis far more than the probes of a training run: leave-one-out runs n
copies of up to n tokens, a removal curve that never flips n more for each explainer and random draw, value
zeroing n copies of every layer's rest. A tier says which explainers run and how closely the costly metrics are
computed:

- ``all``: every explainer (integrated gradients too), the 10 draws of the random control, the removal curves on a
  grid of at most 32 points per example, narrowed down to single removals around the first flip (exact up to 32
  scorable tokens; erasure.py says what the grid changes), the output-equivalence linear programs;
- ``cheap``: the same without integrated gradients (text mode's default, as before tiers existed);
- ``fast``: the explainers that cost about one forward and backward pass (no leave-one-out, hence no tau with it,
  no value zeroing, no integrated gradients), 3 random draws, removal curves on at most 8 points, and no
  output-equivalence programs (their guide objective is the leave-one-out agreement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .explainers import CHEAP_EXPLAINERS, EXPLAINERS, unknown_explainers
from .random_control import RANDOM_DRAWS

FAST_EXPLAINERS = ("attention", "effective", "norm", "rollout", "alti", "norm_resln", "grad_input", "random")


@dataclass(frozen=True)
class Tier:
    """How much an analysis computes (see the module docstring)."""

    explainers: tuple[str, ...]
    random_draws: int = RANDOM_DRAWS
    flip_resolution: int | None = 32  # removal-curve grid points per example (None: every removal)
    loo: bool = True  # leave-one-out (tau_loo, and the equivalence programs' loo objective)
    equivalence: bool = True  # the output-equivalence linear programs


TIERS = {
    "all": Tier(EXPLAINERS),
    "cheap": Tier(CHEAP_EXPLAINERS),
    "fast": Tier(FAST_EXPLAINERS, random_draws=3, flip_resolution=8, loo=False, equivalence=False),
}


def resolve_tier(spec: str | Sequence[str]) -> Tier:
    """A tier name (``TIERS``) or a list of explainer names (the ``all`` tier's settings for those) -> a Tier."""
    if isinstance(spec, str):
        if spec not in TIERS:
            raise ValueError(f"explainers={spec!r} is neither a tier ({', '.join(TIERS)}) nor a list of explainers: "
                             "pass e.g. explainers=fast or 'explainers=[attention,loo]'")
        return TIERS[spec]
    names = tuple(dict.fromkeys(str(e) for e in spec))
    unknown = unknown_explainers(names)
    if unknown or not names:
        raise ValueError(f"explainers: unknown {unknown or 'empty list'}; use a tier ({', '.join(TIERS)}) or some of "
                         f"{list(EXPLAINERS)}")
    return replace(TIERS["all"], explainers=names)

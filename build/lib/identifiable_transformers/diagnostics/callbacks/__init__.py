"""The Lightning callbacks of the diagnostics and the selection of their probe examples.

    identifiability.py  IdentifiabilityCallback: val/ident/* every epoch on a fixed probe set
    media.py            its figures, W&B tables and images
    key_aware_probe.py  the key-aware count on a few long probe sentences
    faithfulness.py     FaithfulnessCallback: val/faith/* every epoch and the end-of-fit tier
"""

from .faithfulness import FaithfulnessCallback
from .identifiability import IdentifiabilityCallback, select_probe_indices

__all__ = ["FaithfulnessCallback", "IdentifiabilityCallback", "select_probe_indices"]

"""Integrated gradients runs several interpolation steps per pass on short batches (a 512-token text would otherwise
run 32 passes of one row): the same attributions as one step per pass."""

import torch
from diag_helpers import random_batch, random_model

from identifiable_transformers.diagnostics import faithfulness as F
from identifiable_transformers.diagnostics.faithfulness import explainers


def test_steps_batched_together_give_the_same_attributions():
    model = random_model(head_combine="add", layers=2, positional="learned")
    ids, mask = random_batch(B=2, T=9)
    assert explainers._ig_rows(ids.shape, 16) > ids.shape[0]  # the default does batch several steps here
    batched, delta_b = F.integrated_gradients(model, ids, mask, n_steps=16)
    one_by_one, delta_1 = F.integrated_gradients(model, ids, mask, n_steps=16, internal_batch_size=ids.shape[0])
    torch.testing.assert_close(batched, one_by_one, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(delta_b, delta_1, rtol=1e-5, atol=1e-6)


def test_rows_per_pass_stay_within_the_token_budget():
    assert explainers._ig_rows((1, 512), 32) == explainers._IG_TOKENS // 512
    assert explainers._ig_rows((64, 512), 32) == 64  # never fewer rows than the batch
    assert explainers._ig_rows((1, 8), 32) == 32  # every step of a short text in one pass

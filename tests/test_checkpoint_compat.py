"""A checkpoint of another depth is refused by name, before Lightning's raw state_dict error: the
weights it has that the model lacks (a deeper checkpoint) and those the model needs that it lacks."""

import pytest
import torch

from identifiable_transformers.modules.checkpoint import CheckpointError
from identifiable_transformers.run.training import run


def test_checkpoints_of_another_depth_name_their_unexpected_and_missing_weights(make_cfg):
    deep = run(make_cfg("model.num_layers=2", "callbacks=[model_checkpoint]", "test=false", out="deep"))
    shallow = run(make_cfg("callbacks=[model_checkpoint]", "test=false", out="shallow"))
    second = sorted(k for k in torch.load(deep["best_model_path"], weights_only=True)["state_dict"]
                    if k.startswith("model.layers.1."))
    assert len(second) >= 8  # attention projections, feed-forward, two norms: weights and biases

    # 2-layer checkpoint, 1-layer model: the second layer's weights are unexpected
    with pytest.raises(CheckpointError) as err:
        run(make_cfg("train=false", "model.num_layers=1", f"ckpt_path={deep['best_model_path']}", out="a"))
    message = str(err.value)
    assert "hyper-parameters (checkpoint vs this run): {'num_layers': (2, 1)}" in message
    assert (f"{len(second)} unexpected weight(s), in the checkpoint but not in this model: {', '.join(second[:4])} "
            f"and {len(second) - 4} more") in message
    assert "missing" not in message

    # 1-layer checkpoint, 2-layer model: the same weights are missing
    with pytest.raises(CheckpointError) as err:
        run(make_cfg("train=false", "model.num_layers=2", f"ckpt_path={shallow['best_model_path']}", out="b"))
    message = str(err.value)
    assert "{'num_layers': (1, 2)}" in message
    assert f"{len(second)} missing weight(s), in this model but not in the checkpoint: {', '.join(second[:4])}" in message
    assert "unexpected" not in message

"""A training resume keeps the number of processes, counted as ``trainer.devices`` x ``trainer.num_nodes``: 2 nodes of
1 device are 2 processes, as 1 node of 2 devices are. The same number laid out otherwise is allowed and recorded;
another number is refused with the original ``trainer.devices`` and ``trainer.num_nodes`` to pass. The trainers are
Lightning's own, built (never started) with each layout; the record is the one a run writes into its checkpoints."""

import lightning.pytorch as pl
import pytest

from identifiable_transformers.common.errors import UserError
from identifiable_transformers.run.resume import (
    CHECKPOINT_KEY,
    RunSettingsRecord,
    check_resume_processes,
    recorded_processes,
)


def _trainer(devices: int, nodes: int) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=devices, num_nodes=nodes,
                      strategy="ddp" if devices * nodes > 1 else "auto", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def _written_by(devices: int, nodes: int) -> dict:
    """What a run on ``devices`` x ``nodes`` records in a checkpoint, read back."""
    ckpt: dict = {}
    RunSettingsRecord({"seed": 1}, []).on_save_checkpoint(_trainer(devices, nodes), None, ckpt)
    return recorded_processes(ckpt)


def test_a_run_records_its_processes_devices_and_nodes():
    assert _written_by(1, 2) == {"world_size": 2, "devices": 1, "num_nodes": 2}
    assert _written_by(2, 1) == {"world_size": 2, "devices": 2, "num_nodes": 1}
    assert _written_by(1, 1) == {"world_size": 1, "devices": 1, "num_nodes": 1}


@pytest.mark.parametrize("devices, nodes", [(1, 2), (2, 1)])
def test_two_processes_resume_on_two_processes_whatever_their_layout(devices, nodes):
    for trained in ((1, 2), (2, 1)):
        changes = check_resume_processes(_written_by(*trained), _trainer(devices, nodes), "last.ckpt")
        if trained == (devices, nodes):
            assert changes == {}
        else:  # the same rows in the same steps: allowed, and recorded as a change
            assert changes == {"trainer.devices": (trained[0], devices), "trainer.num_nodes": (trained[1], nodes)}


@pytest.mark.parametrize("devices, nodes", [(1, 2), (2, 1)])
def test_one_process_does_not_resume_on_two(devices, nodes):
    with pytest.raises(UserError) as err:
        check_resume_processes(_written_by(1, 1), _trainer(devices, nodes), "last.ckpt")
    message = str(err.value)
    assert "was trained on 1 process(es)" in message and "this run has 2:" in message, message
    assert f"trainer.devices={devices} x trainer.num_nodes={nodes}" in message
    assert "Resume on the same number of processes (trainer.devices=1 trainer.num_nodes=1)" in message


@pytest.mark.parametrize("devices, nodes", [(1, 2), (2, 1)])
def test_two_processes_do_not_resume_on_one(devices, nodes):
    with pytest.raises(UserError, match=rf"trained on 2 process\(es\) .*this run has 1: .*Resume on the same number "
                                        rf"of processes \(trainer.devices={devices} trainer.num_nodes={nodes}\)"):
        check_resume_processes(_written_by(devices, nodes), _trainer(1, 1), "last.ckpt")


def test_older_records_are_checked_as_far_as_they_go():
    assert check_resume_processes({}, _trainer(1, 2), "last.ckpt") == {}  # written before processes were recorded
    only_world_size = recorded_processes({CHECKPOINT_KEY: {"world_size": 2}})
    assert only_world_size == {"world_size": 2}
    assert check_resume_processes(only_world_size, _trainer(1, 2), "last.ckpt") == {}
    with pytest.raises(UserError, match="set trainer.devices and trainer.num_nodes to give that"):
        check_resume_processes(only_world_size, _trainer(1, 1), "last.ckpt")
    # devices x nodes that do not give the world size (an edited file): only the world size is believed
    assert recorded_processes({CHECKPOINT_KEY: {"world_size": 2, "devices": 1, "num_nodes": 1}}) == {"world_size": 2}

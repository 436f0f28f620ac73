"""Long stages show progress (common/progress.py): a bar named after the stage where the progress bar is on, a line
as each stage starts and one with its time as it ends where it is off; through a training run, the per-epoch
diagnostics and the end-of-fit stage each do."""

import logging
import re

from identifiable_transformers.common.progress import stage, track
from identifiable_transformers.run.training import run

LOGGER = "identifiable_transformers.common.progress"


def test_a_stage_is_two_lines_with_its_time_when_the_bar_is_off(capsys):
    said = []
    with stage("Counting", say=said.append):
        pass
    assert said[0] == "Counting ..." and re.fullmatch(r"Counting: done in \d+\.\d s", said[1]), said
    assert capsys.readouterr().err == ""


def test_many_items_are_a_line_every_tenth_when_the_bar_is_off():
    said = []
    assert list(track(range(11), "Items", say=said.append)) == list(range(11))
    counts = [m.split(": ")[1].split(" ")[0] for m in said[1:-1]]
    assert counts == ["2/11", "4/11", "6/11", "8/11", "10/11", "11/11"]  # every ceil(11 / 10) = 2, and the last


def test_the_bar_carries_the_stages_name(capsys):
    said = []
    assert list(track(range(3), "Items", bar=True, say=said.append)) == [0, 1, 2]
    assert said == [] and "Items" in capsys.readouterr().err


STAGES = ["Identifiability diagnostics (epoch 0)", "Faithfulness diagnostics (epoch 0)", "Faithfulness (end of fit)"]


def test_a_run_without_the_bar_logs_each_diagnostics_stage_with_its_time(make_cfg, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(make_cfg("test=false", out="quiet"))  # conftest FAST: trainer.enable_progress_bar=false
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    for name in STAGES:
        start = lines.index(f"{name} ...")
        assert re.fullmatch(rf"{re.escape(name)}: done in \d+\.\d s", lines[start + 1]), lines


def test_a_run_with_the_bar_names_each_diagnostics_stage_on_it(make_cfg, caplog, capsys):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(make_cfg("test=false", "trainer.enable_progress_bar=true", out="bar"))
    err = capsys.readouterr().err
    assert all(name in err for name in STAGES[:2]) and "Faithfulness (end of fit)" in err, err[-2000:]
    assert not [r for r in caplog.records if r.name == LOGGER]  # the bar instead of the lines

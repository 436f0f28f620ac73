"""analyze.py's output folder: a file in its way is one ``Error:`` line and exit status 1, before any work."""

import os
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from identifiable_transformers.common.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("where, says", [("file", "is a file, not a folder"), ("under_a_file", "cannot be created")])
def test_output_dir_naming_a_file_is_refused_before_the_checkpoint_is_read(tmp_path, where, says, run_analyze):
    taken = tmp_path / "report.html"
    taken.write_text("keep me")
    out = taken if where == "file" else taken / "sub"
    ckpt = tmp_path / "not_read.ckpt"
    ckpt.write_bytes(b"never loaded: the output folder is checked first")
    with pytest.raises(UserError, match=f"^output_dir={out} {says}"):
        run_analyze([f"ckpt_path={ckpt}", "text=a fine film", f"output_dir={out}"])
    assert taken.read_text() == "keep me"


def test_output_dir_naming_a_file_through_the_command_line(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    (tmp_path / "x.ckpt").write_bytes(b"x")
    proc = run_cli(
        [sys.executable, str(ROOT / "analyze.py"), f"ckpt_path={tmp_path / 'x.ckpt'}", "text=a fine film",
         f"output_dir={taken}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"Error: output_dir={taken} is a file, not a folder: pass a folder (it is "
                                        "created if missing)"], proc.stderr


def test_a_texts_file_that_is_not_utf8_is_one_error_line(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_bytes("a fine film\nun film très réussi\n".encode("latin-1"))  # è (0xE8 in latin-1, byte 12 + 10) is not UTF-8
    (tmp_path / "x.ckpt").write_bytes(b"x")  # the texts are read before the checkpoint
    proc = run_cli(
        [sys.executable, str(ROOT / "analyze.py"), f"ckpt_path={tmp_path / 'x.ckpt'}", f"texts_file={texts}",
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [f"Error: texts_file='{texts}' is not UTF-8 text (byte 22, line 2: invalid "
                                        "continuation byte): save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > "
                                        "OUT)"], proc.stderr


def test_a_run_lock_that_is_a_folder_is_one_error_line(tmp_path, cache_dir):
    folder = tmp_path / "run"
    (folder / ".run.lock").mkdir(parents=True)
    proc = run_cli(
        [sys.executable, str(ROOT / "train.py"), "trainer=cpu", "logger=none", f"hydra.run.dir={folder}",
         f"paths.cache_dir={cache_dir}", f"paths.log_dir={tmp_path / 'logs'}"],
        cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": ""})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"Error: the run folder {folder} holds a folder named .run.lock where the "
                                        f"run's lock file belongs: remove it (rmdir {folder / '.run.lock'}), or pass "
                                        "another hydra.run.dir=DIR."], proc.stderr

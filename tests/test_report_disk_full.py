"""The report on a full disk: one Error line (exit status 1), no temporary file left, and the way on (free space
and rerun with --overwrite, since the files written before the disk filled are there, or --out elsewhere); that
rerun writes the whole report. Simulated: every write after the first report file fails with ENOSPC."""

import errno
import json
import os
from pathlib import Path

from identifiable_transformers.report import main

MODEL = {"embed_dim": 64, "num_heads": 4, "key_dim": 2, "value_dim": None, "head_combine": "add"}


def test_a_full_disk_during_the_report_says_how_to_finish_it(tmp_path, monkeypatch, capsys):
    for seed in (1, 2):
        job = tmp_path / str(seed)
        job.mkdir()
        (job / "metrics.json").write_text(json.dumps({"config": {"data": "rt_offline", "seed": seed, "model": MODEL},
                                                      "metrics": {"test/acc": 0.5 + seed / 10}}))
    real, written = Path.write_bytes, []

    def write_bytes(self, data):
        if written:
            real(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        written.append(self)
        return real(self, data)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_bytes", write_bytes)
        assert main([str(tmp_path), "--no-key-aware"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.out + captured.err, captured.err
    assert lines[0].startswith("Error: the disk is full: writing the ") and "free on that disk" in lines[0]
    assert lines[0].endswith("Then run the report again with --overwrite (it replaces the files this one wrote), "
                             "or pass --out DIR on a disk with room.")
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["results.csv"]

    assert main([str(tmp_path), "--no-key-aware", "--overwrite"]) == 0  # space freed: the advice works
    assert "0.65" in (tmp_path / "results.md").read_text()  # the mean test/acc of the two seeds

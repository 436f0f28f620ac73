"""Helpers of the hub tests: the environment a child process needs to use the local endpoint,
and ``python train.py`` run with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Variables of the user's set-up that would make a child process reach (or skip) a real hub or cache.
HF_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_TOKEN",
           "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_XET_CACHE", "HF_ASSETS_CACHE", "HF_MODULES_CACHE")
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
              "no_proxy")

# A one-epoch run that stays small on a CPU.
TRAIN_ARGS = ["trainer=cpu", "logger=none", "callbacks=none", "trainer.max_epochs=1",
              "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
              "model.embed_dim=16", "model.ffn_dim=32", "data.batch_size=32"]


def hub_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    """os.environ for a child process: the hub at ``endpoint``, HF caches under ``tmp_path/hf``, HOME in
    tmp_path (nothing read from the user's home), no proxy, no token, and not offline (tests/conftest.py
    sets HF_HUB_OFFLINE=1 for every other test)."""
    env = {k: v for k, v in os.environ.items() if k not in HF_VARS + PROXY_VARS}
    hf = tmp_path / "hf"
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(hf), HF_DATASETS_CACHE=str(hf / "datasets"),
               HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost", WANDB_MODE="disabled",
               PROJECT_ROOT=str(ROOT), HOME=str(tmp_path / "home"), **extra)
    return env


def train(name: str, tmp_path: Path, env: dict[str, str], run: str, *args: str, timeout: int = 300):
    """``python train.py data=NAME`` with a fresh ``paths.cache_dir`` (tmp_path/run/cache); returns
    (completed process, meta.json of the tokenized cache or None)."""
    out = tmp_path / run
    cmd = [sys.executable, str(ROOT / "train.py"), f"data={name}", *TRAIN_ARGS, f"paths.cache_dir={out / 'cache'}",
           f"paths.output_dir={out}", f"paths.log_dir={out / 'logs'}", f"hydra.run.dir={out}", *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    metas = sorted((out / "cache").glob("*/*/meta.json"))
    return proc, (json.loads(metas[0].read_text()) if metas else None)

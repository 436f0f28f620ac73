"""The tokenized cache: what goes into its key, its checksums, and checking an entry."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import xxhash

from ..common.files import nearest_existing, writable

CACHE_VERSION = 2  # the cache's layout (2: content-hashed key, checksums in meta.json)
# The modules whose code decides what lands in the cache: a change to any of them is a new cache entry.
_PREPARATION_CODE = ("build.py", "cache.py", "datamodule.py", "prepare.py", "rationales.py", "registry.py",
                     "sources.py", "synthetic.py", "tokenizer.py")


def _hash_file(path: Path) -> str:
    """xxh3-128 of the file's bytes, streamed (several GB/s)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@functools.cache
def preparation_version() -> str:
    """A hash of the preparation code and the ``tokenizers`` version it runs with."""
    import tokenizers

    h = xxhash.xxh3_128(tokenizers.__version__.encode())
    for name in _PREPARATION_CODE:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()


def _file_fingerprint(p: str | None) -> Any:
    """What a data file contributes to the cache key: its content, not its path or mtime."""
    if not p:
        return None
    q = Path(os.path.expanduser(str(p)))
    if not q.is_file():
        return [str(q), None]  # reading it fails later with a clear message
    return [q.stat().st_size, _hash_file(q)]


def _cache_problem(root: Path) -> str | None:
    """Why the cache entry ``root`` cannot be used (None: complete and intact)."""
    if not root.is_dir():
        return "missing"
    try:
        checksums = json.loads((root / "meta.json").read_text())["checksums"]
    except FileNotFoundError:
        return "meta.json is missing"
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "meta.json is unreadable or has no checksums"
    for rel, digest in checksums.items():
        f = root / rel
        if not f.is_file():
            return f"{rel} is missing"
        if _hash_file(f) != digest:
            return f"{rel} does not match its checksum"
    return None


def check_buildable(entry: Path, cache_dir: Path, name: str, problem: str) -> None:
    """A ValueError naming the folder when the cache ``entry`` (to be built because of ``problem``) cannot be
    written: building into a read-only folder would fail halfway with a raw OSError."""
    base = nearest_existing(entry.parent)
    if not base.is_dir():
        raise ValueError(f"cache_dir={str(cache_dir)!r}: {base} is a file, not a folder. Pass a folder for the "
                         "tokenized datasets, e.g. paths.cache_dir=~/.cache/identifiable_transformers.")
    if not writable(base):
        why = "it is not built yet" if problem == "missing" else f"the cached copy is damaged: {problem}"
        raise ValueError(f"the tokenized data of {name!r} must be built ({why}), but the cache folder {base} is not "
                         "writable: pass a writable paths.cache_dir=DIR (or build the cache once where it is "
                         "writable).")

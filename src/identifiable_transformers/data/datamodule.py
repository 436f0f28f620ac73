"""LightningDataModule: load → normalise → split → train tokenizer → tokenize → cache → batch."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import lightning.pytorch as pl
import numpy as np
import torch
import xxhash
from torch.utils.data import DataLoader, Sampler

from . import prepare as P
from . import sources as S
from .registry import KNOWN_DATASETS, get_spec
from .tokenizer import (
    CLS_ID,
    PAD_ID,
    encode_ids,
    load_tokenizer,
    pad_batch,
    save_tokenizer,
    tokenizer_from_str,
    train_tokenizer,
)

log = logging.getLogger("identifiable_transformers.data")

CACHE_VERSION = 2  # the cache's layout (2: content-hashed key, checksums in meta.json)
# The modules whose code decides what lands in the cache: a change to any of them is a new cache entry.
_PREPARATION_CODE = ("datamodule.py", "prepare.py", "registry.py", "sources.py", "tokenizer.py")
SOURCES = ("hub", "local", "package")
_SPLITS = ("train", "validation", "test")


def _plain(x: Any) -> Any:
    """OmegaConf containers → plain Python (Hydra passes ListConfig/DictConfig)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(x, (DictConfig, ListConfig)):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return x


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


class EpochShuffleSampler(Sampler[int]):
    """This rank's share of an order drawn from ``(seed, epoch)`` alone.

    The order depends on nothing else, so a resumed run replays the batches an uninterrupted run
    would have seen: :meth:`resume_at` starts the next iteration part-way into an epoch. Under
    distributed training each of ``world_size`` ranks takes every ``world_size``-th index of the
    common order; with ``shuffle`` the order wraps around so that every rank gets the same number
    of batches (as ``DistributedSampler`` does). Without ``shuffle`` (evaluation) the shards are
    disjoint and cover the data exactly once. Lightning calls ``set_epoch`` before every epoch.
    """

    def __init__(self, num_samples: int, seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1):
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
        self.num_samples, self.seed, self.shuffle = int(num_samples), int(seed), bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
        self.epoch = 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def resume_at(self, epoch: int, consumed: int) -> None:
        """Make the next iteration epoch ``epoch``, skipping the ``consumed`` indices this rank had
        already yielded in it. ``len()`` stays the full epoch's, as Lightning's loop expects."""
        if not 0 <= int(consumed) <= len(self):
            raise ValueError(f"cannot resume {consumed} samples into an epoch of {len(self)}")
        self.epoch = int(epoch)
        self._resume = (int(epoch), int(consumed))

    def __len__(self) -> int:
        if self.shuffle:
            return -(-self.num_samples // self.world_size)
        return len(range(self.rank, self.num_samples, self.world_size))

    def _order(self, rng: np.random.Generator) -> np.ndarray:
        return rng.permutation(self.num_samples)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = self._order(np.random.default_rng(self.seed + self.epoch))
            if self.world_size > 1:
                order = np.resize(order, len(self) * self.world_size)[self.rank :: self.world_size]
        else:
            order = np.arange(self.rank, self.num_samples, self.world_size)
        skip = 0
        if self._resume is not None:
            epoch, consumed = self._resume
            self._resume = None
            skip = consumed if epoch == self.epoch else 0
        self.epoch += 1  # without set_epoch, consecutive iterations still differ
        return iter(order[skip:].tolist())


class LengthBucketSampler(EpochShuffleSampler):
    """An :class:`EpochShuffleSampler` whose order puts similar lengths in consecutive
    ``batch_size`` chunks: shuffle, cut into pools of ``batch_size * pool_batches``, sort each pool
    by length, cut into batches, shuffle the batch order."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int = 0, pool_batches: int = 50,
                 rank: int = 0, world_size: int = 1):
        super().__init__(len(lengths), seed, shuffle=True, rank=rank, world_size=world_size)
        self.lengths = np.asarray(lengths)
        self.batch_size = int(batch_size)
        self.pool = self.batch_size * int(pool_batches)

    def _order(self, rng: np.random.Generator) -> np.ndarray:
        perm = rng.permutation(len(self.lengths))
        batches = []
        for s in range(0, len(perm), self.pool):
            pool = perm[s : s + self.pool]
            pool = pool[np.argsort(self.lengths[pool], kind="stable")]
            batches.extend(pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size))
        if not batches:
            return perm
        return np.concatenate([batches[j] for j in rng.permutation(len(batches))])


class TextDataModule(pl.LightningDataModule):
    """Text classification data: see ``docs/_readme_data.md`` for the full description."""

    def __init__(
        self,
        name: str = "rt_offline",
        source: str = "package",
        hub_id: str | None = None,
        hub_config: str | None = None,
        package_subset: str | None = None,
        data_dir: str | None = None,
        classic_columns: Sequence[str] | None = None,
        train_file: str | None = None,
        validation_file: str | None = None,
        test_file: str | None = None,
        text_fields: Sequence[str] = ("text",),
        text_separator: str = " . ",
        label_field: str = "label",
        label_names: Sequence[str] | None = None,
        num_classes: int | None = None,
        splits: Mapping[str, str | None] | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 42,
        max_length: int = 256,
        vocab_size: int = 20000,
        min_frequency: int = 2,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        length_bucketing: bool = False,
        cache_dir: str = "~/.cache/identifiable_transformers",
        limit_train_examples: int | None = None,
        # additions
        hub_revision: str | None = None,
        hf_cache_dir: str | None = None,
        tokenizer_file: str | None = None,
        num_proc: int | None = None,
        pin_memory: bool = False,
        shuffle_seed: int = 0,
        hub_probe_timeout: float = 2.0,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"source={source!r} is not one of {SOURCES}. Set data.source accordingly.")
        text_fields = _plain(text_fields)
        if isinstance(text_fields, str):
            text_fields = [text_fields]
        if not text_fields:
            raise ValueError("text_fields is empty: name at least one text column, e.g. data.text_fields=[text].")
        splits = _plain(splits) if splits is not None else {"train": "train", "validation": None, "test": "test"}
        unknown = set(splits) - set(_SPLITS)
        if unknown:
            raise ValueError(f"splits has unknown keys {sorted(unknown)}; allowed keys: {list(_SPLITS)}.")
        if source == "hub" and hub_id is None and data_dir is None:
            if name in KNOWN_DATASETS and KNOWN_DATASETS[name].get("hub_id"):
                hub_id = KNOWN_DATASETS[name]["hub_id"]
            else:
                get_spec(name)  # raises listing the known names
                raise ValueError(f"source='hub' needs hub_id (dataset {name!r} has none). Set data.hub_id.")
        if source == "package" and data_dir is None and package_subset is None:
            package_subset = KNOWN_DATASETS.get(name, {}).get("package_subset")
            if package_subset is None:
                raise ValueError(
                    "source='package' needs package_subset ('rotten_tomatoes' or 'imdb'); "
                    "use data=rt_offline or data=imdb_offline."
                )
        if source == "local" and data_dir is None and train_file is None:
            raise ValueError(
                "source='local' needs data.train_file=PATH (CSV/TSV/JSON/JSONL/parquet), optionally "
                "data.validation_file / data.test_file; or data.data_dir=DIR for the classic train.csv/test.csv layout."
            )
        for k, v in (("max_length", max_length), ("batch_size", batch_size)):
            if int(v) < (2 if k == "max_length" else 1):
                raise ValueError(f"{k}={v} is too small (set data.{k} to a positive value, max_length >= 2).")
        if num_classes is not None and int(num_classes) < 2:
            raise ValueError(f"num_classes={num_classes} must be >= 2 (or null to infer it from the data).")
        self.name = name
        self.source = source
        self.hub_id, self.hub_config, self.hub_revision = hub_id, hub_config, hub_revision
        self.hf_cache_dir = hf_cache_dir
        self.package_subset = package_subset
        self.data_dir, self.train_file, self.validation_file, self.test_file = data_dir, train_file, validation_file, test_file
        self.classic_columns = [str(c) for c in _plain(classic_columns)] if classic_columns else None
        self.text_fields = [str(f) for f in text_fields]
        self.text_separator = str(text_separator)
        self.label_field = str(label_field)
        self._given_label_names = list(_plain(label_names)) if label_names is not None else None
        self._given_num_classes = int(num_classes) if num_classes is not None else None
        self.splits = {k: splits.get(k) for k in _SPLITS}
        self.val_fraction = float(val_fraction) if val_fraction else 0.0  # 0/None: no carved validation split
        self.test_fraction = float(test_fraction) if test_fraction else 0.0  # 0/None: no carved test split
        self.split_seed = int(split_seed)
        self.max_length, self.vocab_size_cap, self.min_frequency = int(max_length), int(vocab_size), int(min_frequency)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size) if eval_batch_size else self.batch_size
        self.num_workers, self.length_bucketing, self.pin_memory = int(num_workers), bool(length_bucketing), bool(pin_memory)
        self.cache_dir = Path(os.path.expanduser(str(cache_dir)))
        self.limit_train_examples = int(limit_train_examples) if limit_train_examples else None
        self.tokenizer_file = tokenizer_file
        # None = auto: one worker process per available core for splits of >= 20k rows
        self.num_proc = None if num_proc is None else max(1, int(num_proc))
        self.shuffle_seed = int(shuffle_seed)
        self.hub_probe_timeout = float(hub_probe_timeout)

        self.pad_id = PAD_ID
        self.cls_id = CLS_ID
        self.tokenizer = None
        self.train_dataset = self.val_dataset = self.test_dataset = None
        self.meta: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._loaded_dir: Path | None = None
        self._fingerprints: dict[str | None, Any] = {}
        self._verified: Path | None = None  # the cache entry prepare_data() has checked
        self._resume: dict[str, int] | None = None

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "TextDataModule":
        """Build from the registry entry ``name`` (same defaults as conf/data/<name>.yaml)."""
        spec = get_spec(name)
        spec.update(overrides)
        return cls(name=name, **spec)

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        self._require_setup("vocab_size")
        return int(self.tokenizer.get_vocab_size())

    @property
    def num_classes(self) -> int:
        self._require_setup("num_classes")
        return len(self.meta["label_names"])

    @property
    def label_names(self) -> list[str]:
        self._require_setup("label_names")
        return list(self.meta["label_names"])

    def _require_setup(self, what: str) -> None:
        if self.tokenizer is None or not self.meta:
            raise RuntimeError(f"TextDataModule.{what} is available after prepare_data() and setup().")

    # ------------------------------------------------------------------ cache key
    def _uses_classic(self) -> bool:
        return self.data_dir is not None

    def _fingerprint(self, path: str | None) -> Any:
        if path not in self._fingerprints:  # each input file is hashed once per module
            self._fingerprints[path] = _file_fingerprint(path)
        return self._fingerprints[path]

    def cache_settings(self) -> dict[str, Any]:
        if self._uses_classic():
            src: Any = {"classic_dir": str(Path(os.path.expanduser(self.data_dir)).resolve()),
                        "files": [self._fingerprint(str(Path(os.path.expanduser(self.data_dir)) / f))
                                  for f in ("train.csv", "test.csv")]}
        elif self.source == "hub":
            src = {"hub_id": self.hub_id, "hub_config": self.hub_config, "revision": self.hub_revision}
        elif self.source == "local":
            src = {k: self._fingerprint(getattr(self, k))
                   for k in ("train_file", "validation_file", "test_file")}
        else:
            src = {"package_subset": self.package_subset, "file": self._fingerprint(str(S.package_csv_path()))}
        tok = None
        if self.tokenizer_file:
            p = Path(os.path.expanduser(self.tokenizer_file))
            tok = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else str(p)
        return {
            "version": CACHE_VERSION, "code": preparation_version(), "name": self.name, "source": self.source, "src": src,
            "text_fields": self.text_fields, "text_separator": self.text_separator,
            "label_field": self.label_field, "label_names": self._given_label_names,
            "num_classes": self._given_num_classes, "splits": self.splits,
            "val_fraction": self.val_fraction, "test_fraction": self.test_fraction, "split_seed": self.split_seed,
            "limit_train_examples": self.limit_train_examples, "max_length": self.max_length,
            "vocab_size": self.vocab_size_cap, "min_frequency": self.min_frequency, "tokenizer_file": tok,
        }

    def cache_path(self) -> Path:
        key = hashlib.sha256(json.dumps(self.cache_settings(), sort_keys=True, default=str).encode()).hexdigest()[:16]
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
        return self.cache_dir / safe / key

    # ------------------------------------------------------------------ Lightning hooks
    def prepare_data(self) -> None:
        """Download/read, tokenize and cache once (rank 0 per node under DDP). Cheap if cached.

        The cache is verified against the checksums in its meta.json; a damaged or incomplete one
        is rebuilt, with a warning."""
        final = self.cache_path()
        problem = _cache_problem(final)
        if problem is None:
            log.info("[%s] using cached tokenized data at %s", self.name, final)
            self._verified = final
            return
        if problem != "missing":
            log.warning("[%s] the cached tokenized data at %s is damaged (%s): rebuilding it", self.name, final, problem)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        try:
            self._build(tmp)
            if _cache_problem(final) is None:  # someone else finished first
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                if final.exists():
                    shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self._verified = final
        log.info("[%s] cached tokenized data at %s", self.name, final)

    def setup(self, stage: str | None = None) -> None:
        """Load the cached splits (memory-mapped). Idempotent."""
        final = self.cache_path()
        if self._loaded_dir == final:
            return
        if self._verified != final:
            self.prepare_data()  # checks the cache, (re)builds it when needed
        import datasets

        self.meta = json.loads((final / "meta.json").read_text())
        self.tokenizer = load_tokenizer(final / "tokenizer.json")
        dd = datasets.load_from_disk(str(final / "dataset"))
        self.train_dataset = dd["train"]
        self.val_dataset = dd["validation"] if "validation" in dd else None
        self.test_dataset = dd["test"] if "test" in dd else None
        self._loaded_dir = final

    # ------------------------------------------------------------------ pipeline
    def _load_raw(self) -> dict[str, S.RawSplit]:
        if self._uses_classic():
            files = S.find_classic_files(self.data_dir)
            raw = {s: S.read_classic_csv(p, f"data_dir={self.data_dir!r} {p.name}", self.classic_columns)
                   for s, p in files.items()}
            log.info("[%s] source=classic CSV layout from data_dir=%s: %s", self.name, self.data_dir,
                     {s: len(r) for s, r in raw.items()})
            return raw
        if self.source == "package":
            return {"train": S.read_package(self.package_subset)}
        if self.source == "local":
            raw = {"train": S.read_table(self.train_file, "train_file")}
            if self.validation_file:
                raw["validation"] = S.read_table(self.validation_file, "validation_file")
            if self.test_file:
                raw["test"] = S.read_table(self.test_file, "test_file")
            log.info("[%s] source=local files: %s", self.name, {s: r.origin for s, r in raw.items()})
            return raw
        dd = S.load_hub(self.hub_id, self.hub_config, self.hub_revision, self.hf_cache_dir, self.hub_probe_timeout,
                        name=self.name if self.name in KNOWN_DATASETS else "agnews")
        raw = {}
        for ours in _SPLITS:
            theirs = self.splits.get(ours)
            if theirs is None:
                continue
            if theirs not in dd:
                raise ValueError(
                    f"splits.{ours}={theirs!r} is not a split of hub_id={self.hub_id!r}; available: "
                    f"{sorted(dd)}. Set data.splits.{ours} to one of them (or null to carve it from train)."
                )
            ds = dd[theirs]
            feat = ds.features.get(self.label_field)
            names = list(feat.names) if type(feat).__name__ == "ClassLabel" else None
            raw[ours] = S.RawSplit(origin=f"hub {self.hub_id}[{theirs}]", dataset=ds, label_names_from_features=names)
        if "train" not in raw:
            raise ValueError(f"splits.train must name a split of hub_id={self.hub_id!r}; available: {sorted(dd)}.")
        log.info("[%s] source=hub %s: %s", self.name, self.hub_id, {s: len(r) for s, r in raw.items()})
        return raw

    def _procs(self, n_rows: int) -> int | None:
        if self.num_proc is None:
            try:
                cores = len(os.sched_getaffinity(0))
            except AttributeError:  # pragma: no cover
                cores = os.cpu_count() or 1
            n = min(cores, 8) if n_rows >= 20_000 else 1
        else:
            n = self.num_proc
        return n if n > 1 and n_rows >= 2 * n else None

    def _map(self, ds, fn, **kw):
        """datasets.map(batched=True); with worker processes when that helps. Tokenizers' own
        thread pool is switched off in the forked workers (no fork warning, no oversubscription)."""
        procs = self._procs(len(ds))
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        if procs:
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            return ds.map(fn, batched=True, batch_size=1000, num_proc=procs, **kw)
        finally:
            if procs:
                if saved is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = saved

    def _texts(self, split: str, raw: S.RawSplit, fields: list[str]):
        """A datasets.Dataset with one "text" column (joined fields)."""
        import datasets

        if raw.frame is not None:
            texts = P.join_text_columns([raw.frame[f].tolist() for f in fields], self.text_separator)
            return datasets.Dataset.from_dict({"text": texts})
        sep = self.text_separator

        def join(batch):
            return {"text": P.join_text_columns([batch[f] for f in fields], sep)}

        return self._map(raw.dataset, join, remove_columns=raw.dataset.column_names, desc=f"join text {split}")

    def _build(self, out: Path) -> None:
        from datasets.utils import logging as dlog

        bars = dlog.is_progress_bar_enabled()
        dlog.disable_progress_bar()
        try:
            self._build_inner(out)
        finally:
            if bars:
                dlog.enable_progress_bar()

    def _build_inner(self, out: Path) -> None:
        import datasets
        import pyarrow.compute as pc

        t0 = time.perf_counter()
        raw = self._load_raw()
        if self._uses_classic():
            label_field, fields, offset = "label", [c for c in raw["train"].columns if c != "label"], 1
        else:
            label_field, fields, offset = self.label_field, self.text_fields, 0
        for r in raw.values():
            P.check_columns(r, fields, label_field)
        t1 = time.perf_counter()
        self.timings["read"] = t1 - t0

        ids, names, how = P.build_label_ids(raw, label_field, self._given_label_names, self._given_num_classes, offset)
        parts: dict[str, Any] = {}
        part_labels: dict[str, np.ndarray] = {}  # label ids aligned with parts[s] rows
        dropped: dict[str, int] = {}
        for s, r in raw.items():
            ds = self._texts(s, r, fields).add_column("label", ids[s].tolist())
            keep = pc.greater(pc.utf8_length(ds.data.column("text")), 0).to_numpy(zero_copy_only=False)
            n_drop = int((~keep).sum())
            if n_drop:
                log.warning("[%s] dropped %d row(s) with empty/NaN text from the %s split (%s)", self.name, n_drop, s, r.origin)
                ds = ds.select(np.flatnonzero(keep))
            part_labels[s] = np.asarray(ids[s])[keep]
            if len(ds) == 0:
                raise ValueError(f"every row of the {s} split ({r.origin}) has empty text in text_fields={fields}.")
            dropped[s] = n_drop
            parts[s] = ds
        t2 = time.perf_counter()
        self.timings["normalise"] = t2 - t1

        # carve missing splits from train, stratified and seeded
        carve: dict[str, float] = {}
        if "validation" not in parts and self.val_fraction:
            carve["validation"] = P.check_fraction("val_fraction", self.val_fraction)
        if "test" not in parts and self.test_fraction:
            carve["test"] = P.check_fraction("test_fraction", self.test_fraction)
        split_how = {s: f"given ({raw[s].origin})" for s in parts}
        if carve:
            if sum(carve.values()) >= 1:
                raise ValueError(f"val_fraction + test_fraction = {sum(carve.values())} must be < 1.")
            train = parts["train"]
            lab = part_labels["train"]
            idx = P.stratified_split(lab, carve, self.split_seed)
            n_train = len(train)
            for s, f in carve.items():
                if len(idx[s]) == 0:
                    raise ValueError(
                        f"carving {s} with fraction {f} from {n_train} training rows gives an empty split; "
                        f"provide a {s} file/split or more data."
                    )
                parts[s] = train.select(idx[s])
                split_how[s] = f"carved from train: stratified, seed={self.split_seed}, fraction={f}, {len(idx[s])} of {n_train} rows"
            parts["train"] = train.select(idx["rest"])
            split_how["train"] = f"remaining {len(idx['rest'])} of {n_train} rows"
        if self.limit_train_examples and len(parts["train"]) > self.limit_train_examples:
            rng = np.random.default_rng(self.split_seed)
            sub = np.sort(rng.permutation(len(parts["train"]))[: self.limit_train_examples])
            parts["train"] = parts["train"].select(sub)
            split_how["train"] += f"; limited to {self.limit_train_examples} rows (seeded random subset)"
        # Evaluation splits are stored in a seeded shuffled order: carved splits and many files are sorted by
        # label, so a few evaluation batches (limit_val_batches, debug=limit, a short study) would see one class.
        # The order depends on split_seed alone, so the probe set and an exact resume stay the same across runs.
        for s in ("validation", "test"):
            if s in parts:
                parts[s] = parts[s].select(P.evaluation_order(len(parts[s]), self.split_seed, s))
                split_how[s] += f"; stored in a seeded shuffled order (split_seed={self.split_seed})"
        for s in _SPLITS:
            if s in parts:
                log.info("[%s] %s: %d rows — %s", self.name, s, len(parts[s]), split_how[s])
        t3 = time.perf_counter()
        self.timings["split"] = t3 - t2

        # tokenizer: trained on the training split only
        train_text = parts["train"].data.column("text")
        if self.tokenizer_file:
            tok = load_tokenizer(self.tokenizer_file)
        else:
            def batches():
                for chunk in train_text.chunks:
                    for i in range(0, len(chunk), 1000):  # small batches keep the trainer's threads busy
                        yield chunk.slice(i, 1000).to_pylist()

            tok = train_tokenizer(batches(), self.vocab_size_cap, self.min_frequency, length=len(train_text))
        t4 = time.perf_counter()
        self.timings["train_tokenizer"] = t4 - t3

        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                      "labels": datasets.Value("int64")})
        max_len = self.max_length

        def encode(batch):
            return {"input_ids": encode_ids(tok, batch["text"], max_len), "labels": batch["label"]}

        tokenized = {}
        for s, ds in parts.items():
            tokenized[s] = self._map(ds, encode, remove_columns=ds.column_names, features=features,
                                     desc=f"tokenize {s}")
        t5 = time.perf_counter()
        self.timings["tokenize"] = t5 - t4

        out.mkdir(parents=True, exist_ok=True)
        datasets.DatasetDict(tokenized).save_to_disk(str(out / "dataset"))
        save_tokenizer(tok, out / "tokenizer.json")
        lengths = {s: pc.list_value_length(d.data.column("input_ids")).to_numpy() for s, d in tokenized.items()}
        meta = {
            "name": self.name, "settings": self.cache_settings(), "label_names": names,
            "label_mapping": how, "num_classes": len(names), "vocab_size": tok.get_vocab_size(),
            "rows": {s: len(d) for s, d in tokenized.items()}, "dropped_empty_text": dropped,
            "split_how": split_how,
            "class_counts": {s: np.bincount(d.data.column("labels").to_numpy(), minlength=len(names)).tolist()
                             for s, d in tokenized.items()},
            "mean_length": {s: float(v.mean()) for s, v in lengths.items()},
            "truncated": {s: int((v >= max_len).sum()) for s, v in lengths.items()},
        }
        meta["checksums"] = {f.relative_to(out).as_posix(): _hash_file(f)
                             for f in sorted(out.rglob("*")) if f.is_file()}
        (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        self.timings["save"] = time.perf_counter() - t5
        self.timings["total"] = time.perf_counter() - t0
        log.info("[%s] vocab %d, classes %s, timings %s", self.name, meta["vocab_size"], names,
                 {k: round(v, 2) for k, v in self.timings.items()})

    # ------------------------------------------------------------------ batching
    def collate(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        """Pad to the longest example of the batch; mask True on real tokens."""
        ids, mask = pad_batch([r["input_ids"] for r in rows], self.pad_id)
        return {"input_ids": ids, "attention_mask": mask,
                "labels": torch.tensor([int(r["labels"]) for r in rows], dtype=torch.long)}

    def _shard(self) -> tuple[int, int]:
        """(rank, world_size) of this process; the datamodule shards every split itself."""
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            if trainer._accelerator_connector.use_distributed_sampler:
                raise ValueError("TextDataModule shards the data across ranks itself (exactly resumable, length "
                                 "bucketing kept); build the Trainer with use_distributed_sampler=False, as "
                                 "conf/trainer/default.yaml does.")
            return trainer.global_rank, trainer.world_size
        return 0, 1

    def _loader(self, ds, batch_size: int, train: bool) -> DataLoader:
        rank, world = self._shard()
        if train and self.length_bucketing:
            lengths = __import__("pyarrow.compute", fromlist=["x"]).list_value_length(ds.data.column("input_ids")).to_numpy()
            sampler = LengthBucketSampler(lengths, batch_size, seed=self.shuffle_seed, rank=rank, world_size=world)
        else:
            sampler = EpochShuffleSampler(len(ds), seed=self.shuffle_seed, shuffle=train, rank=rank, world_size=world)
        if train and self._resume is not None:
            self._resume_sampler(sampler, world)
        # Its own generator: creating an iterator would otherwise draw from the global torch RNG and shift
        # the dropout masks of a run resumed mid-epoch.
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=self.collate,
                          num_workers=self.num_workers, pin_memory=self.pin_memory,
                          persistent_workers=self.num_workers > 0,
                          generator=torch.Generator().manual_seed(self.shuffle_seed))

    def _resume_sampler(self, sampler: EpochShuffleSampler, world: int) -> None:
        position, self._resume = self._resume, None
        if position["world_size"] != world:
            warnings.warn(f"the checkpoint was written by {position['world_size']} rank(s), this run has {world}: "
                          f"epoch {position['epoch']} restarts from its first batch instead of resuming exactly.",
                          stacklevel=3)
            sampler.set_epoch(position["epoch"])
            return
        sampler.resume_at(position["epoch"], position["samples"])

    def _train_position(self) -> dict[str, int] | None:
        """Where training stands in the data: the epoch and how many samples of it this rank has used."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit" or trainer.num_training_batches in (0, float("inf")):
            return None
        epoch = trainer.current_epoch
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed  # training steps run this epoch
        if done >= trainer.num_training_batches:
            epoch, done = epoch + 1, 0
        return {"epoch": epoch, "samples": done * self.batch_size, "world_size": trainer.world_size}

    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        return self._loader(self.train_dataset, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        self.setup("validate")
        if self.val_dataset is None:
            raise ValueError(f"[{self.name}] has no validation split; set data.val_fraction or data.validation_file.")
        return self._loader(self.val_dataset, self.eval_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        self.setup("test")
        if self.test_dataset is None:
            raise ValueError(f"[{self.name}] has no test split; set data.test_file, data.splits.test or data.test_fraction.")
        return self._loader(self.test_dataset, self.eval_batch_size, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()

    # ------------------------------------------------------------------ persistence
    def save_tokenizer(self, path: str | os.PathLike) -> Path:
        """Write tokenizer.json (``path`` is a file, or a directory to put it in)."""
        self._require_setup("save_tokenizer")
        return save_tokenizer(self.tokenizer, path)

    def state_dict(self) -> dict[str, Any]:
        """Stored by Lightning inside checkpoints: the label names and, while fitting, the position in
        the training data, so that a run resumes mid-epoch exactly. The tokenizer is not repeated here:
        the checkpoint keeps it once, in the model's hyper-parameters (``tokenizer_json``)."""
        if not self.meta:
            return {}
        state = {"label_names": self.label_names, "max_length": self.max_length, "name": self.name}
        if (position := self._train_position()) is not None:
            state["train_position"] = position
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("label_names") and not self.meta:
            self.meta = {"label_names": list(state["label_names"])}
        # Applied to the next training sampler; restoring for validate/test/predict must not leave it pending.
        fitting = self.trainer is None or self.trainer.state.fn == "fit"
        self._resume = state.get("train_position") if fitting else None

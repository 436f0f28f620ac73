"""LightningDataModule: load → normalise → split → train tokenizer → tokenize → cache → batch."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from . import sources as S
from .batching import bucket_lengths
from .build import SPLITS as _SPLITS
from .build import CacheBuilder
from .cache import (  # noqa: F401  (re-exported: tests and callers import them from here)
    _PREPARATION_CODE,
    CACHE_VERSION,
    _cache_problem,
    _file_fingerprint,
    _hash_file,
    check_buildable,
    preparation_version,
)
from .loaders import Batching
from .rationales import RationaleAccess
from .registry import KNOWN_DATASETS, get_spec
from .samplers import EpochShuffleSampler, LengthBucketSampler  # noqa: F401  (re-exported by data/__init__)
from .synthetic import SyntheticSpec
from .tokenizer import CLS_ID, PAD_ID, load_tokenizer, save_tokenizer

log = logging.getLogger("identifiable_transformers.data")

SOURCES = ("hub", "local", "package", "synthetic")


def _plain(x: Any) -> Any:
    """OmegaConf containers → plain Python (Hydra passes ListConfig/DictConfig)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(x, (DictConfig, ListConfig)):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return x



class TextDataModule(CacheBuilder, RationaleAccess, Batching, pl.LightningDataModule):
    """Text classification data: see ``docs/data.md`` for the full description."""

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
        rationale_field: str | None = None,
        synthetic: Mapping[str, Any] | None = None,
        # fixed shapes for CUDA graphs, and batches made on the device (docs/performance.md)
        static_shapes: bool = False,
        length_buckets: Sequence[int] | None = None,
        on_device: bool = False,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ValueError(f"source={source!r} is not one of {SOURCES}. Set data.source accordingly.")
        if source != "local" and name not in KNOWN_DATASETS:
            # The hub and package sources read what conf/data/<name>.yaml says: an unknown name would train
            # another dataset under it. Local files are the user's own, so any name labels them.
            get_spec(name)  # raises listing the known names
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
        if source == "synthetic" and synthetic is None:
            raise ValueError("source='synthetic' needs the generator's settings under data.synthetic "
                             "(e.g. data=synthetic_order).")
        # checked here, before any data is read; the spec is also part of the cache key
        self.synthetic = SyntheticSpec.from_config(_plain(synthetic)) if source == "synthetic" else None
        if self.synthetic is not None:
            self.synthetic.check_vocabulary(int(vocab_size))
            self.synthetic.check_fits(int(max_length))
        self.rationale_field = str(rationale_field) if rationale_field else None
        if int(max_length) < 2:
            raise ValueError(f"max_length={max_length} is too small: set data.max_length >= 2 (<cls> and a token).")
        for k, v in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if v is not None and int(v) < 1:
                raise ValueError(f"{k}={v} must be >= 1: set data.{k} to a positive number of examples per device"
                                 + (" (or null: batch_size)." if k == "eval_batch_size" else ", e.g. 64."))
        if int(num_workers) < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0: set data.num_workers=0 (load in the main "
                             "process) or a number of worker processes.")
        if on_device and int(num_workers) > 0:
            raise ValueError(f"data.on_device=true batches on the device and starts no worker process: set "
                             f"data.num_workers=0 (got {num_workers}).")
        self.static_shapes, self.on_device = bool(static_shapes), bool(on_device)
        self.length_buckets = bucket_lengths(int(max_length), _plain(length_buckets))  # checks them
        if num_classes is not None and int(num_classes) < 2:
            raise ValueError(f"num_classes={num_classes} must be >= 2 (or null to infer it from the data).")
        self.name = name
        self.source = source
        self.hub_id, self.hub_config, self.hub_revision = hub_id, hub_config, hub_revision
        self.hf_cache_dir = hf_cache_dir
        self.package_subset = package_subset
        self.data_dir, self.train_file = data_dir, train_file
        self.validation_file, self.test_file = validation_file, test_file
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
        self.eval_batch_size = int(eval_batch_size) if eval_batch_size is not None else self.batch_size
        self.num_workers, self.length_bucketing = int(num_workers), bool(length_bucketing)
        self.pin_memory = bool(pin_memory)
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
        self._on_device: dict[tuple, dict[str, torch.Tensor]] = {}  # data.on_device: split tensors per device

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> TextDataModule:
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
        elif self.source == "synthetic":
            src = self.synthetic.as_dict()
        else:
            src = {"package_subset": self.package_subset, "file": self._fingerprint(str(S.package_csv_path()))}
        tok = None
        if self.tokenizer_file:
            p = Path(os.path.expanduser(self.tokenizer_file))
            tok = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else str(p)
        return {
            "version": CACHE_VERSION, "code": preparation_version(), "name": self.name, "source": self.source,
            "src": src,
            "text_fields": self.text_fields, "text_separator": self.text_separator,
            "label_field": self.label_field, "label_names": self._given_label_names,
            "num_classes": self._given_num_classes, "splits": self.splits,
            "val_fraction": self.val_fraction, "test_fraction": self.test_fraction, "split_seed": self.split_seed,
            "limit_train_examples": self.limit_train_examples, "max_length": self.max_length,
            "vocab_size": self.vocab_size_cap, "min_frequency": self.min_frequency, "tokenizer_file": tok,
            "rationale_field": self.rationale_field,
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
        check_buildable(final, self.cache_dir, self.name, problem)  # a read-only cache is only ever read (above)
        if problem != "missing":
            log.warning("[%s] the cached tokenized data at %s is damaged (%s): rebuilding it",
                        self.name, final, problem)
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
        self.tokenizer = self._read_tokenizer(final / "tokenizer.json")
        dd = datasets.load_from_disk(str(final / "dataset"))
        self.train_dataset = dd["train"]
        self.val_dataset = dd["validation"] if "validation" in dd else None
        self.test_dataset = dd["test"] if "test" in dd else None
        self._loaded_dir = final

    def _read_tokenizer(self, path: Path):
        """The cached tokenizer.json (checked: the special tokens have this code's ids)."""
        return load_tokenizer(path)

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
            raise ValueError(f"[{self.name}] has no test split; set data.test_file, data.splits.test or "
                             "data.test_fraction.")
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

"""Building a cache entry: load → normalise → split → train tokenizer → tokenize → save."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..common.errors import Interrupted
from ..common.files import DiskFullError, free_space, is_disk_full
from ..common.interrupts import Terminated, received_sigterm, workers_leave_ctrl_c_to_the_parent
from . import prepare as P
from . import sources as S
from .cache import _hash_file
from .rationales import encode_with_rationales, parse_rationales
from .registry import KNOWN_DATASETS
from .synthetic import generate
from .tokenizer import encode_ids, load_tokenizer, save_tokenizer, train_tokenizer

log = logging.getLogger("identifiable_transformers.data")

SPLITS = ("train", "validation", "test")


class CacheBuilder:
    """The build pipeline of :class:`~.datamodule.TextDataModule` (a mixin: it reads the module's settings)."""

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
        if self.source == "synthetic":
            spec = self.synthetic
            frame = generate(spec)
            log.info("[%s] source=synthetic task=%s: %d rows (seed=%d)", self.name, spec.task, len(frame), spec.seed)
            origin = f"the synthetic {spec.task!r} generator (seed={spec.seed})"
            return {"train": S.RawSplit(origin=origin, frame=frame)}
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
        for ours in SPLITS:
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
            if not procs:
                return ds.map(fn, batched=True, batch_size=1000, num_proc=procs, **kw)
            with workers_leave_ctrl_c_to_the_parent() as ctrl_c:  # the parent's KeyboardInterrupt, no worker's
                try:
                    return ds.map(fn, batched=True, batch_size=1000, num_proc=procs, **kw)
                finally:
                    # A signal the handlers noted stops the build, whatever the map did with its exception: datasets
                    # waits for the pool in a `finally` and raises a TimeoutError instead, and the pool's machinery
                    # can swallow it (raised in a `finally`, a `__del__` or a proxy call it retries) and return.
                    if ctrl_c.pressed:
                        raise KeyboardInterrupt from None
                    if received_sigterm():  # the same for SIGTERM (a scheduler's stop), noted by its handler
                        raise Terminated(signal.SIGTERM) from None
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

    def _make_tokenizer(self, train_text):
        """The tokenizer the splits are encoded with: trained on the training split only (``train_text``, a
        pyarrow column), or read from ``tokenizer_file``."""
        if self.tokenizer_file:
            return load_tokenizer(self.tokenizer_file)

        def batches():
            for chunk in train_text.chunks:
                for i in range(0, len(chunk), 1000):  # small batches keep the trainer's threads busy
                    yield chunk.slice(i, 1000).to_pylist()

        return train_tokenizer(batches(), self.vocab_size_cap, self.min_frequency, length=len(train_text))

    def _check_fits_tokenized(self, parts: dict[str, Any]) -> None:
        """Refuse synthetic sentences that the tokenizer would cut at ``max_length``. The project's tokenizer reads
        each synthetic word as one token, which ``SyntheticSpec.check_fits`` checked before any data was read; a
        pretrained tokenizer, which splits words into pieces, checks it here (``PretrainedTextDataModule``)."""

    def _build(self, out: Path) -> None:
        """Build into ``out`` (a temporary folder that the caller renames, or removes on any failure). Ctrl-C and a
        full disk end with one line: :class:`~..cli.Interrupted` (exit status 130) or
        :class:`~..files.DiskFullError`."""
        from datasets.utils import logging as dlog

        bars = dlog.is_progress_bar_enabled()
        dlog.disable_progress_bar()
        try:
            self._build_inner(out)
        except KeyboardInterrupt:
            raise Interrupted(signal.SIGINT, f"Ctrl-C while building the tokenized data of {self.name!r}: nothing was "
                              f"kept in the cache ({self.cache_dir}); run the command again to build it.") from None
        except Terminated:
            raise Interrupted(signal.SIGTERM, f"SIGTERM while building the tokenized data of {self.name!r}: nothing "
                              f"was kept in the cache ({self.cache_dir}); run the command again to build it.") from None
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise DiskFullError(f"the disk is full: building the tokenized data of {self.name!r} in {out.parent} "
                                f"failed ({free_space(out.parent)} free on that disk; the partial copy is removed). "
                                "Free space there, or pass a paths.cache_dir=DIR on a disk with room.") from None
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
            if self.rationale_field and self.rationale_field not in r.columns:
                raise ValueError(f"rationale_field={self.rationale_field!r} not found in {r.origin}; columns found: "
                                 f"{r.columns}. Set data.rationale_field to the column holding the rationales "
                                 "(or null).")
        t1 = time.perf_counter()
        self.timings["read"] = t1 - t0

        ids, names, how = P.build_label_ids(raw, label_field, self._given_label_names, self._given_num_classes, offset)
        parts: dict[str, Any] = {}
        part_labels: dict[str, np.ndarray] = {}  # label ids aligned with parts[s] rows
        dropped: dict[str, int] = {}
        for s, r in raw.items():
            ds = self._texts(s, r, fields).add_column("label", ids[s].tolist())
            if self.rationale_field:  # word indices into the first text field, checked against its words
                first = r.frame[fields[0]].tolist() if r.frame is not None else r.dataset[fields[0]]
                words = parse_rationales(r, self.rationale_field, P.join_text_columns([first], ""), s)
                ds = ds.add_column("rationale_words", words)
            keep = pc.greater(pc.utf8_length(ds.data.column("text")), 0).to_numpy(zero_copy_only=False)
            n_drop = int((~keep).sum())
            if n_drop:
                log.warning("[%s] dropped %d row(s) with empty/NaN text from the %s split (%s)", self.name, n_drop, s,
                            r.origin)
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
                split_how[s] = (f"carved from train: stratified, seed={self.split_seed}, fraction={f}, "
                                f"{len(idx[s])} of {n_train} rows")
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
        for s in SPLITS:
            if s in parts:
                log.info("[%s] %s: %d rows — %s", self.name, s, len(parts[s]), split_how[s])
        t3 = time.perf_counter()
        self.timings["split"] = t3 - t2

        # the rows of the training split only: a carved or limited split is a view (an indices mapping) over the
        # whole table, whose .data would also hold the validation and test rows
        tok = self._make_tokenizer(parts["train"].with_format("arrow")["text"])
        self._check_fits_tokenized(parts)
        t4 = time.perf_counter()
        self.timings["train_tokenizer"] = t4 - t3

        features = {"input_ids": datasets.Sequence(datasets.Value("int32")), "labels": datasets.Value("int64")}
        max_len = self.max_length
        if self.rationale_field:
            features["rationale"] = datasets.Sequence(datasets.Value("int32"))  # token positions

            def encode(batch):
                ids, positions = encode_with_rationales(tok, batch["text"], batch["rationale_words"], max_len)
                return {"input_ids": ids, "labels": batch["label"], "rationale": positions}
        else:
            def encode(batch):
                return {"input_ids": encode_ids(tok, batch["text"], max_len), "labels": batch["label"]}
        features = datasets.Features(features)

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
        if self.rationale_field:
            def with_rationale(d) -> int:
                return int(pc.sum(pc.greater(pc.list_value_length(d.data.column("rationale")), 0)).as_py() or 0)

            meta["rows_with_rationale"] = {s: with_rationale(d) for s, d in tokenized.items()}
        meta["checksums"] = {f.relative_to(out).as_posix(): _hash_file(f)
                             for f in sorted(out.rglob("*")) if f.is_file()}
        (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        self.timings["save"] = time.perf_counter() - t5
        self.timings["total"] = time.perf_counter() - t0
        log.info("[%s] vocab %d, classes %s, timings %s", self.name, meta["vocab_size"], names,
                 {k: round(v, 2) for k, v in self.timings.items()})

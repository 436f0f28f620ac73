"""Identifiability report for a trained checkpoint: can its attention maps be trusted?

    python analyze.py ckpt_path=PATH text="some sentence"
    python analyze.py ckpt_path=PATH texts_file=texts.txt
    python analyze.py ckpt_path=PATH split=validation num_examples=8
    python analyze.py hf_model=HUB_ID_OR_FOLDER text="some sentence"        # a Hugging Face classifier as it is
    python analyze.py hf_model=HUB_ID_OR_FOLDER 'text=[["a premise", "a hypothesis"]]'   # a sentence pair
    python analyze.py hf_model=HUB_ID_OR_FOLDER data=rt_offline split=validation num_examples=32

In split mode the report adds the faithfulness (and, on data with rationales, plausibility) tables of every
explainer per cumulative length bin. Writes ``report.html`` (self-contained, images embedded), one PNG per example and
``report.json`` to ``output_dir`` (default: the Hydra run directory; a folder holding a report already is refused
unless ``overwrite=true``). Texts longer than ``max_length`` are cut, with one warning line. See conf/analyze.yaml.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, ListConfig

from identifiable_transformers.common.errors import UserError, ensure_output_dir, exit_on_user_error

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))
log = logging.getLogger("analyze")

_SPLITS = {"train": "train_dataset", "validation": "val_dataset", "test": "test_dataset"}


def _entries_from_cfg(cfg: DictConfig) -> list | None:
    """``text=`` / ``texts_file=`` as entries (texts, or sentence pairs: data/text_inputs.py); None in split mode."""
    from identifiable_transformers.data.text_inputs import entries_from_values, read_texts_file

    sources = [k for k in ("text", "texts_file", "split") if cfg.get(k) is not None]
    if len(sources) != 1:
        raise ValueError(f"give exactly one of text=..., texts_file=... or split=...; got {sources or 'none'}")
    if cfg.get("text") is not None:
        return entries_from_values(cfg.text, "text")
    if cfg.get("texts_file") is not None:
        return read_texts_file(str(cfg.texts_file), "texts_file")
    return None


def _check_num_examples(cfg: DictConfig) -> None:
    """Split mode draws ``num_examples`` examples: a positive int, checked before the checkpoint is read."""
    if cfg.get("split") is None:
        return
    n = cfg.get("num_examples")
    if not isinstance(n, int) or isinstance(n, bool):
        raise ValueError(f"num_examples={n!r} is not an int: pass e.g. num_examples=8")
    if n < 1:
        raise ValueError(f"num_examples={n} must be >= 1: pass e.g. num_examples=8")


def _positions(model) -> int | None:
    """The longest input the model has positions for (None: the project's encoder without positions)."""
    return None if getattr(model, "positional", None) == "none" else int(model.max_len)


def _max_length(cfg: DictConfig, default: int, model, what: str) -> int:
    """``max_length=`` (else ``default``), refused when the model has no positions for it."""
    value = cfg.get("max_length")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"max_length={value!r} is not a positive int: pass e.g. max_length=128, or max_length=null "
                         "for the longest the model reads")
    max_length = int(value or default)
    positions = _positions(model)
    if positions is not None and max_length > positions:
        raise ValueError(f"max_length={max_length} is longer than the {positions} tokens {what} has positions for: "
                         f"pass max_length={positions} or less")
    return max_length


def _encode_entries(model, tokenizer, entries: list, max_length: int) -> tuple[dict, list[str]]:
    """Text mode's batch, as the model's tokenizer encodes the entries (pairs as its pair), and the part of each
    entry the model sees; a cut is announced in one warning line."""
    import torch

    from identifiable_transformers.data.text_inputs import encode_entries, truncation_warning

    enc = encode_entries(tokenizer, entries, max_length, int(getattr(model, "pad_id", 0)))
    if hasattr(model, "read_pairs"):  # a Hugging Face encoder: token types as the tokenizer gives them
        pairs = any(not isinstance(e, str) for e in entries)
        model.read_pairs(pairs)
        types = model.token_types(enc.input_ids, enc.attention_mask)
        if pairs and types is not None:
            off = [b for b in range(len(entries)) if not torch.equal(types[b], enc.type_ids[b])]
            if off:
                sep = tokenizer.id_to_token(model.sep_id)
                raise ValueError(
                    f"text entries {off} hold {sep} inside a text while other entries are sentence pairs: the model "
                    f"reads a pair's second segment from the first {sep}, so their token types would not be the "
                    f"tokenizer's. Analyse texts holding {sep} and sentence pairs in separate runs, or take {sep} out "
                    "of the text")
    warning = truncation_warning(enc, max_length, _positions(model))
    if warning:
        log.warning("text: %s", warning)
    return enc.batch, enc.seen


def _warn_cut_rows(lengths: list[int], indices: list[int], max_length: int, fix: str) -> None:
    """Split mode: the data module cut each text at ``max_length`` tokens; rows that fill it were (likely) cut."""
    full = [i for i, n in zip(indices, lengths) if n >= max_length]
    if full:
        log.warning("split: %d of %d examples (indices %s) reach max_length=%d tokens, where the data module cut "
                    "them (it does not store how many tokens it dropped)%s", len(full), len(indices), full,
                    max_length, fix)


def _check_split(cfg: DictConfig) -> None:
    if cfg.get("split") is not None and cfg.split not in _SPLITS:
        raise ValueError(f"split={cfg.split!r} is unknown; use one of {list(_SPLITS)}")


def _split_batch(cfg: DictConfig, module):
    """Rebuild the datamodule from the checkpoint's data settings and draw stratified examples.

    Returns (batch, indices, rationales): rationales (token positions per example) when the split has
    them, examples with one preferred, else None.
    """
    from identifiable_transformers.modules.checkpoint import data_module_from_checkpoint

    _check_split(cfg)
    data_cfg = module.hparams.get("data_cfg")
    if not data_cfg:
        raise ValueError("this checkpoint has no data_cfg in its hparams: use text=... or texts_file=... instead")
    # the checkpoint's data settings as plain values (its _target_ never runs), with this machine's cache
    dm = data_module_from_checkpoint(data_cfg, str(cfg.paths.cache_dir),
                                     what=f"ckpt_path={cfg.ckpt_path}", fix=" Use text=... or texts_file=... instead.")
    dm.prepare_data()
    dm.setup("fit" if cfg.split != "test" else "test")
    if module.tokenizer is not None and dm.tokenizer.to_str() != module.tokenizer.to_str():
        raise ValueError("the rebuilt data's tokenizer differs from the checkpoint's: token ids would not match; "
                         "use text=... or texts_file=... instead")
    return _draw(cfg, dm, module.model.max_len)


def _draw(cfg: DictConfig, dm, max_len: int):
    """``num_examples`` examples of ``dm``'s split (prepared and set up), stratified by length: see _split_batch."""
    from identifiable_transformers.diagnostics.callbacks.identifiability import select_probe_indices

    ds = getattr(dm, _SPLITS[cfg.split])
    if ds is None or len(ds) == 0:
        raise ValueError(f"split={cfg.split!r} is empty for this data config")
    lengths = [len(x) for x in ds["input_ids"]]
    rationales = ds["rationale"] if getattr(dm, "has_rationales", False) else None
    preferred = None if rationales is None else [len(r) > 0 for r in rationales]
    idx = select_probe_indices(lengths, int(cfg.num_examples), int(cfg.seed), max_len, preferred=preferred)
    batch = dm.collate([ds[i] for i in idx])
    return batch, idx, None if rationales is None else [[int(j) for j in rationales[i]] for i in idx]


def _length_bins(model, max_length: int) -> list[int]:
    """The per-epoch callbacks' default length bins for this model and data (docs/diagnostics.md)."""
    from identifiable_transformers.diagnostics.callbacks.probes import DEFAULT_LENGTH_BINS, resolve_length_bins
    from identifiable_transformers.diagnostics.maths import identifiable_length

    bounds = identifiable_length(model.head_combine, model.embed_dim, model.num_heads, model.value_dim)
    return resolve_length_bins(DEFAULT_LENGTH_BINS, embed_dim=model.embed_dim,
                               head_stochastic=bounds["head_stochastic"], max_length=int(max_length))


def _hf_data_module(cfg: DictConfig, model):
    """The data config ``data=...`` read with the checkpoint's own tokenizer (as ``model=pretrained`` does)."""
    from omegaconf import OmegaConf

    from identifiable_transformers.modules.checkpoint import data_module_from_checkpoint

    if cfg.get("data") is None:
        raise ValueError(f"split={cfg.split} with hf_model needs a data config to read it from: add data=NAME "
                         "(a file of conf/data, e.g. data=rt_offline), or use text=... or texts_file=...")
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    default = min(int(data_cfg.get("max_length") or model.max_len), model.max_len)
    data_cfg.update({"_target_": "identifiable_transformers.hf.data.PretrainedTextDataModule",
                     "pretrained_tokenizer": str(cfg.hf_model), "tokenizer_file": None,
                     "max_length": _max_length(cfg, default, model, f"hf_model={cfg.hf_model}")})
    return data_module_from_checkpoint(data_cfg, str(cfg.paths.cache_dir), what="data")


def _main_hf(cfg: DictConfig, entries: list | None, out: Path) -> str:
    """``hf_model=...``: a Hugging Face classifier (or bare encoder) analysed as it is, with its own tokenizer."""
    from identifiable_transformers.hf.data import backend_tokenizer
    from identifiable_transformers.loading import load_hf_classifier

    model, hf_tokenizer = load_hf_classifier(str(cfg.hf_model), what="hf_model",
                                             score_special_tokens=bool(cfg.special_tokens))
    if entries is None and not model.has_head:  # split mode reports the explainers' faithfulness
        raise ValueError(model.no_head)
    meta = {"hf_model": str(cfg.hf_model),
            "model": type(model.task).__name__ if model.has_head else f"encoder only ({model.why_no_prediction})"}
    if entries is not None:
        max_length = _max_length(cfg, model.max_len, model, f"hf_model={cfg.hf_model}")
        tokenizer = backend_tokenizer(hf_tokenizer, max_length, "hf_model")
        batch, texts = _encode_entries(model, tokenizer, entries, max_length)
        meta["max_length"], rationales, bins = max_length, None, None
    else:
        dm = _hf_data_module(cfg, model)
        dm.prepare_data()
        dm.setup("fit" if cfg.split != "test" else "test")
        if dm.num_classes != model.num_classes:
            log.warning("data=%s has %d classes, hf_model's head %d: the report explains the head's predictions",
                        dm.name, dm.num_classes, model.num_classes)
        model.read_pairs(bool(getattr(dm, "pairs", False)))
        batch, idx, rationales = _draw(cfg, dm, model.max_len)
        _warn_cut_rows(batch["attention_mask"].sum(1).tolist(), idx, dm.max_length,
                       f"; the model has positions for {model.max_len} tokens only" if dm.max_length >= model.max_len
                       else f"; pass max_length=N (up to {model.max_len}) to keep more")
        tokenizer, texts = dm.tokenizer, None
        meta.update({"data": dm.name, "split": cfg.split, "example indices": idx})
        bins = _length_bins(model, dm.max_length)
    return _write_report(cfg, out, model, tokenizer, batch, texts, model.label_names,
                         f"Attention identifiability: {cfg.hf_model}", meta, rationales, bins)


def _main_ckpt(cfg: DictConfig, ckpt: Path, entries: list | None, out: Path) -> str:
    """``ckpt_path=...``: a checkpoint of train.py (the project's encoder, or ``model=pretrained``)."""
    from identifiable_transformers.loading import load_module

    module = load_module(ckpt)  # the project's encoder or a pretrained one (model=pretrained)
    model = module.model.eval()
    tokenizer = module.tokenizer
    data_cfg = module.hparams.get("data_cfg") or {}
    if entries is not None:
        if tokenizer is None:
            raise ValueError("this checkpoint stores no tokenizer (tokenizer_json): cannot encode text")
        if not hasattr(model, "read_pairs") and any(not isinstance(e, str) for e in entries):
            sep = str(data_cfg.get("text_separator", " . "))
            log.info("text: the project's encoder reads one text: each pair is joined with data.text_separator=%r, "
                     "as its data module joins several text fields", sep)
            entries = [e if isinstance(e, str) else sep.join(e) for e in entries]
        default = min(int(data_cfg.get("max_length") or model.max_len), model.max_len)
        max_length = _max_length(cfg, default, model, f"ckpt_path={ckpt}")
        batch, texts = _encode_entries(model, tokenizer, entries, max_length)
        meta = {"checkpoint": str(ckpt), "max_length": max_length}
        rationales, bins = None, None
    else:
        batch, idx, rationales = _split_batch(cfg, module)
        meta = {"checkpoint": str(ckpt), "split": cfg.split, "example indices": idx}
        data_max = min(int(data_cfg.get("max_length") or model.max_len), model.max_len)
        _warn_cut_rows(batch["attention_mask"].sum(1).tolist(), idx, data_max,
                       "; that is the checkpoint's data.max_length, which it was trained with")
        texts, bins = None, _length_bins(model, data_max)
    return _write_report(cfg, out, model, tokenizer, batch, texts, module.label_names,
                         f"Attention identifiability: {ckpt.name}", meta, rationales, bins)


_REPORT_FILES = ("report.html", "report.json", "example[0-9]*.png")  # what build_report writes


def _output_dir(cfg: DictConfig) -> tuple[Path, list[Path]]:
    """The report's folder (``output_dir``, else the Hydra run folder), checked before any work: a folder that
    holds a report already is refused unless ``overwrite=true``. Also the folders this run creates for it, deepest
    first (removed again if the run fails)."""
    from hydra.core.hydra_config import HydraConfig

    overwrite = cfg.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise ValueError(f"overwrite={overwrite!r} is not true or false: pass overwrite=true to replace a report")
    created: list[Path] = []
    if cfg.get("output_dir"):
        missing = Path(str(cfg.output_dir)).expanduser().absolute()
        while not missing.exists() and missing != missing.parent:
            created.append(missing)
            missing = missing.parent
        out = ensure_output_dir(cfg.output_dir, "output_dir")
    else:
        out = Path(HydraConfig.get().runtime.output_dir)
    earlier = sorted({f.name for pattern in _REPORT_FILES for f in out.glob(pattern)})
    if earlier and not overwrite:
        shown = ", ".join(earlier[:4]) + (", ..." if len(earlier) > 4 else "")
        raise UserError(f"output_dir={out} already holds a report ({shown}): pass another output_dir=..., or "
                        "overwrite=true to replace it")
    return out, created


def _explainers(cfg: DictConfig):
    """``explainers=``: None, a tier name or a list of explainer names (checked: faithfulness/tiers.py)."""
    from identifiable_transformers.diagnostics.faithfulness import resolve_tier

    spec = cfg.get("explainers")
    if spec is None:
        return None
    spec = [str(e) for e in spec] if isinstance(spec, (list, ListConfig)) else str(spec)
    resolve_tier(spec)  # an unknown tier or explainer fails here, before any work
    return spec


def _write_report(cfg, out, model, tokenizer, batch, texts, label_names, title, meta, rationales, bins) -> str:
    """The HTML report and report.json of ``batch`` in ``out``: both modes'. ``texts`` (text mode): the part of
    each entry the model saw; split mode shows its tokens."""
    from identifiable_transformers.diagnostics.render.report_html import build_report, tokens_for_batch

    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    tokens = tokens_for_batch(tokenizer, ids, mask)
    if texts is None:
        texts = [" ".join(t) for t in tokens]
    path = build_report(model, ids, mask, out, tokens=tokens, texts=texts, label_names=label_names, title=title,
                        meta=meta, key_aware=bool(cfg.key_aware), rationales=rationales, length_bins=bins,
                        explainers=_explainers(cfg))
    for f in out.glob("example[0-9]*.png"):  # an earlier report's pictures of examples this one has not
        if f.stem[len("example"):].isdigit() and int(f.stem[len("example"):]) >= len(ids):
            f.unlink()
    log.info("wrote %s", path)
    print(path)
    return str(path)


def _remove_if_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): kept
            return


@hydra.main(version_base="1.3", config_path="conf", config_name="analyze")
@exit_on_user_error
def main(cfg: DictConfig) -> str:
    _check_split(cfg)
    _explainers(cfg)
    if (cfg.get("ckpt_path") is None) == (cfg.get("hf_model") is None):
        raise ValueError("give exactly one of ckpt_path=... (a checkpoint written by train.py) or hf_model=... (a "
                         "Hugging Face hub id or save_pretrained() folder, analysed as it is)")
    ckpt = None
    if cfg.get("ckpt_path") is not None:
        ckpt = Path(str(cfg.ckpt_path)).expanduser()
        if not ckpt.is_file():
            raise FileNotFoundError(f"ckpt_path={str(cfg.ckpt_path)!r} is not a file: pass a checkpoint written by "
                                    "train.py (e.g. logs/train/runs/<time>/checkpoints/last.ckpt)")
    entries = _entries_from_cfg(cfg)
    _check_num_examples(cfg)
    out, created = _output_dir(cfg)  # before any work: a file in the way would fail only once the report is drawn
    try:
        return _main_ckpt(cfg, ckpt, entries, out) if ckpt is not None else _main_hf(cfg, entries, out)
    except BaseException:
        _remove_if_empty(created)  # a failed run leaves no empty folder behind
        raise


if __name__ == "__main__":
    main()

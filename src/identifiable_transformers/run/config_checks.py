"""Typed config checks at the start of a run, before any data is prepared.

Every config node with a ``_target_`` (data, model, trainer, each callback and logger) is checked
against the signature of its target: unknown keys and values of the wrong type fail at once, naming
the key, the value and the expected type. The types come from the targets' annotations, so a new
constructor argument needs no schema edit here. The model is also built once on the ``meta`` device
(no memory, no data) so that its own checks (impossible shapes, dropout range, ...) run before the data.
"""

from __future__ import annotations

import collections.abc as cabc
import difflib
import inspect
import logging
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..common.errors import ConfigError, _raised_in

log = logging.getLogger(__name__)

_HYDRA_KEYS = {"_target_", "_partial_", "_convert_", "_recursive_", "_args_"}
_EXAMPLES = {bool: "true", int: "10", float: "0.1", str: "text", type(None): "null"}
_DESCRIPTIONS = {bool: "true or false", int: "an int", float: "a number", str: "a string", type(None): "null"}


# Top-level keys of conf/train.yaml that no _target_ signature types: (type, example)
_TOP_LEVEL = {"seed": (int | None, "42"), "train": (bool, "true"), "test": (bool, "true")}
# Sequence parameters whose target takes one string as a list of it (``data.text_fields=text``); any other
# sequence given a string is refused: ``list("attention")`` would be its letters.
_ONE_STRING_AS_LIST = {"text_fields"}


def check_config(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for the first config mistake found (see the module docstring)."""
    for key, (tp, example) in _TOP_LEVEL.items():
        if key in cfg and not matches(value := cfg[key], tp):
            raise ConfigError(f"{key}={value!r} is not {describe(tp)}: pass e.g. {key}={example}")
    check_paths(cfg)
    for key, node in _target_nodes(cfg):
        check_node(key, node)
    if cfg.get("data") is not None:
        check_data(cfg)
    if cfg.get("model") is not None and cfg.get("data") is not None:
        check_model(cfg)
    check_faithfulness(cfg)
    ckpt = cfg.get("ckpt_path")
    if ckpt and not Path(str(ckpt)).expanduser().is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt} does not exist: pass the path of a .ckpt file")


def check_paths(cfg: DictConfig) -> None:
    """The cache folder must be a folder (or creatable as one): a file there ends in a raw OSError later."""
    from ..common.files import nearest_existing

    for key in ("paths.cache_dir", "data.cache_dir"):
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
        except OmegaConfBaseException as e:
            raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from e
        if value is None:
            continue
        base = nearest_existing(Path(str(value)))
        if not base.is_dir():
            raise ConfigError(f"{key}={value} is not a folder ({base} is a file): pass a folder for the tokenized "
                              f"datasets, e.g. {key}=~/.cache/identifiable_transformers")


def _target_nodes(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, DictConfig]]:
    for key, child in node.items_ex(resolve=False):  # unresolved: a leaf's interpolation is resolved per node
        if not isinstance(child, DictConfig) or (not prefix and key == "hydra"):
            continue
        if "_target_" in child:
            yield f"{prefix}{key}", child
        else:
            yield from _target_nodes(child, f"{prefix}{key}.")


def _resolved(key: str, node: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from e


def _locate(key: str, target: str) -> Any:
    from hydra.utils import get_object

    try:
        return get_object(target)
    except Exception as e:
        raise ConfigError(f"{key}._target_={target!r} cannot be imported ({type(e).__name__}): check its spelling") \
            from e


def check_node(key: str, node: DictConfig) -> None:
    """Check the keys and value types of one ``_target_`` node against the target's signature."""
    values = _resolved(key, node)
    target = _locate(key, str(values["_target_"]))
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check against
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:  # an annotation that cannot be evaluated here: check the names only
        hints = {}
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    names = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for name, value in values.items():
        if name in _HYDRA_KEYS:
            continue
        if name not in params:
            if open_kwargs:
                continue
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {key}.{close[0]}?" if close else f"its options: {', '.join(names)}"
            raise ConfigError(f"{key}.{name} is not an option of {values['_target_']}: {hint}")
        tp = hints.get(name)
        if isinstance(value, str) and name not in _ONE_STRING_AS_LIST and _is_sequence(tp) and matches([value], tp):
            raise ConfigError(f"{key}.{name}={value!r} is a string, but a list is expected: pass e.g. "
                              f"{key}.{name}=[{value}]")
        if tp is not None and not matches(value, tp):
            default = params[name].default
            example = _example(tp, default)
            raise ConfigError(f"{key}.{name}={value!r} is not {describe(tp)}: pass e.g. {key}.{name}={example}")


def _is_sequence(tp: Any) -> bool:
    """Whether ``tp`` asks for a sequence and takes no plain string (``Sequence[str] | None`` does not)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        return any(_is_sequence(a) for a in args) and not any(
            a is str or typing.get_origin(a) is typing.Literal for a in args)
    return (typing.get_origin(tp) or tp) in (list, tuple, cabc.Sequence, cabc.MutableSequence)


def matches(value: Any, tp: Any) -> bool:
    """Whether a plain config value (after resolution) fits the annotation ``tp``.

    Lenient where Hydra or the target is: an int is a number, a number may stand for a string (Hydra
    reads ``data.hub_config=2020`` as an int), a list for a tuple or sequence, a node with ``_target_``
    for any object, and an annotation that is not a plain type (a class, a callable) accepts anything.
    """
    if isinstance(value, dict) and "_target_" in value:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any or isinstance(tp, typing.TypeVar):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
    base = origin or tp
    if base in (list, tuple, cabc.Sequence, cabc.MutableSequence):
        if isinstance(value, str):
            return base is cabc.Sequence and (not args or matches(value, args[0]))
        if not isinstance(value, list):
            return False
        if base is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args))
        return not args or all(matches(v, args[0]) for v in value)
    if base in (dict, cabc.Mapping, cabc.MutableMapping):
        if not isinstance(value, dict):
            return False
        return len(args) != 2 or all(matches(v, args[1]) for v in value.values())
    return True


def describe(tp: Any) -> str:
    """'an int', 'an int or null', "one of 'a', 'b'", 'a list of a number' ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        literals = [v for a in args if typing.get_origin(a) is typing.Literal for v in typing.get_args(a)]
        others = [describe(a) for a in args if typing.get_origin(a) is not typing.Literal]
        if literals:
            others.insert(0, describe(typing.Literal[tuple(literals)]))
        return " or ".join(dict.fromkeys(others))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if tp in _DESCRIPTIONS:
        return _DESCRIPTIONS[tp]
    base = origin or tp
    if base in (list, tuple, cabc.Sequence, cabc.MutableSequence):
        if base is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} ({', '.join(describe(a) for a in args)})"
        return f"a list of {describe(args[0])}" if args else "a list"
    if base in (dict, cabc.Mapping, cabc.MutableMapping):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _example(tp: Any, default: Any) -> str:
    default = list(default) if isinstance(default, tuple) else default
    if default is not inspect.Parameter.empty and default is not None and matches(default, tp):
        return _format(default)
    for a in typing.get_args(tp) or (tp,):
        if typing.get_origin(a) is typing.Literal:
            return repr(typing.get_args(a)[0])
        if a in _EXAMPLES and a is not type(None):
            return _EXAMPLES[a]
        base, inner = typing.get_origin(a) or a, typing.get_args(a)
        if base in (list, cabc.Sequence, cabc.MutableSequence) and inner and inner[0] in _EXAMPLES:
            return f"[{_EXAMPLES[inner[0]]}]"  # a list of plain values, written as Hydra reads it
    return "..."


def _format(value: Any) -> str:
    """A value as it is written on the command line."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def check_model(cfg: DictConfig) -> None:
    """Build the model on the meta device with stand-in vocabulary and classes: its own checks run now."""
    values = _resolved("model", cfg.model)
    target = _locate("model", str(values.pop("_target_")))
    if not {"vocab_size", "num_classes"} <= set(inspect.signature(target).parameters):
        return
    max_len, max_length = values.get("max_len"), cfg.data.get("max_length")
    if values.get("positional") != "none" and isinstance(max_len, int) and isinstance(max_length, int) \
            and max_len < max_length:
        raise ConfigError(f"model.max_len={max_len} is below data.max_length={max_length}: inputs would not fit; "
                          f"set model.max_len>={max_length} (its default follows data.max_length)")
    import torch

    try:
        with torch.device("meta"):
            target(vocab_size=2, num_classes=2, **values)
    except ValueError as e:
        if _raised_in(e, set()):
            name = re.match(r"\w+", str(e))  # the model's messages start with the argument's name
            key = f"model.{name.group()}" if name and name.group() in values else "model"
            if key == "model.max_len" and OmegaConf.is_interpolation(cfg.model, "max_len"):
                key = "data.max_length (model.max_len follows it)"  # name the key the user set
            raise ConfigError(f"{key}: {e}") from e
        log.debug("dry model build skipped: %r", e)  # not ours to explain; the real build will tell
    except Exception as e:  # the check must never fail a run that the real build would accept
        log.debug("dry model build skipped: %r", e)


def check_data(cfg: DictConfig) -> None:
    """Build the project's data module once: its constructor checks values and reads no data."""
    from ..data import TextDataModule

    values = _resolved("data", cfg.data)
    target = _locate("data", str(values.pop("_target_")))
    if not (inspect.isclass(target) and issubclass(target, TextDataModule)):
        return  # someone else's data module: its constructor may read data, so leave it to the real build
    try:
        target(**values)
    except ValueError as e:
        if not _raised_in(e, set()):
            raise
        raise ConfigError(f"data: {e}") from e


def check_faithfulness(cfg: DictConfig) -> None:
    """The end-of-fit faithfulness stage runs after training: its settings are checked before training starts."""
    from ..diagnostics.callbacks.faithfulness import FaithfulnessCallback

    for key, node in _target_nodes(cfg):
        values = _resolved(key, node)
        target = _locate(key, str(values["_target_"]))
        if not (inspect.isclass(target) and issubclass(target, FaithfulnessCallback)):
            continue
        steps = values.get("ig_steps", inspect.signature(target).parameters["ig_steps"].default)
        if values.get("final", True) and isinstance(steps, int) and steps < 1:
            raise ConfigError(f"{key}.ig_steps={steps} must be >= 1 (integrated-gradients steps of the end-of-fit "
                              f"stage, which runs after training): pass e.g. {key}.ig_steps=32, or turn the stage "
                              f"off with {key}.final=false")

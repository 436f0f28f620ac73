"""Registry of the named datasets, read from the Hydra configs ``conf/data/<name>.yaml``.

The YAML files are the one source of truth: each entry here is the dataset's file merged
over the shared base its ``defaults`` list names (as Hydra composes it), less the keys that
are not facts about the dataset (``_target_``, ``name``, ``cache_dir``). Python code and error
messages thus know the same names as ``data=NAME``, and ``TextDataModule.from_name("agnews")``
builds what ``python train.py data=agnews`` builds. ``tests/data/test_registry.py`` checks
that the two compositions agree.

Hub ids, fields, splits and label orders follow the Hugging Face dataset cards (see the
card-fields table in docs/data.md). An entry with ``classic_columns`` is one of the Zhang et
al. (2015) sets, which can also be read from the original ``train.csv``/``test.csv`` layout
via ``data_dir`` (no header; 1-based label, then the text columns).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

#: the package's conf/data: in a clone, src/identifiable_transformers/conf links to the checkout's conf/; an
#: installed wheel carries a copy (pyproject.toml's package-data)
CONF_DIR = Path(__file__).parents[1] / "conf" / "data"
#: keys of a composed data config that say nothing about the dataset itself
NOT_SPEC = ("_target_", "name", "cache_dir")


def _compose(path: Path, conf_dir: Path, seen: tuple[Path, ...] = ()) -> Any:
    """The file merged over its defaults, in the order of its ``defaults`` list (``_self_`` last if absent)."""
    if path in seen:
        raise ValueError(f"{path}: circular defaults list ({' -> '.join(p.name for p in seen)})")
    own = OmegaConf.load(path)
    defaults = list(own.pop("defaults", []) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")
    parts = []
    for d in defaults:
        if d == "_self_":
            parts.append(own)
            continue
        if not isinstance(d, str) or not d.endswith("@_here_"):
            raise ValueError(f"{path}: defaults entry {d!r} is not supported by the registry; use "
                             "'<file>@_here_' (e.g. base/text_classification@_here_) or '_self_'.")
        parts.append(_compose(conf_dir / f"{d[: -len('@_here_')]}.yaml", conf_dir, (*seen, path)))
    return OmegaConf.merge(*parts)


def load_specs(conf_dir: Path = CONF_DIR) -> dict[str, dict[str, Any]]:
    """``{name: spec}`` for every ``conf_dir/*.yaml`` (the base folder excluded)."""
    if not conf_dir.is_dir():
        raise FileNotFoundError(
            f"the dataset configs are missing: {conf_dir} is not a directory. The registry reads "
            "conf/data/*.yaml, which the package carries (a link to the checkout's conf/ in a clone): reinstall "
            "it (pip install . or pip install -e .) from a full clone."
        )
    specs = {}
    for path in sorted(conf_dir.glob("*.yaml")):
        cfg = OmegaConf.to_container(_compose(path, conf_dir), resolve=False)
        if cfg.get("name") != path.stem:
            raise ValueError(f"{path}: name={cfg.get('name')!r} must equal the file name {path.stem!r}.")
        specs[path.stem] = {k: v for k, v in cfg.items() if k not in NOT_SPEC}
    return specs


# Keys are constructor arguments of TextDataModule.
KNOWN_DATASETS: dict[str, dict[str, Any]] = load_specs()

#: the Zhang et al. (2015) sets readable from the classic CSV layout via data_dir
CLASSIC_DATASETS = tuple(k for k, v in KNOWN_DATASETS.items() if v.get("classic_columns"))


def known_names() -> list[str]:
    return sorted(KNOWN_DATASETS)


def get_spec(name: str) -> dict[str, Any]:
    """Return a copy of the registry entry, or raise a ValueError listing the known names."""
    if name not in KNOWN_DATASETS:
        raise ValueError(
            f"Unknown dataset name={name!r}. Known datasets: {', '.join(known_names())}. "
            "Pick one of these (e.g. `data=agnews`), or use `data=local data.train_file=...` "
            "for your own files (a new named dataset is a new conf/data/<name>.yaml)."
        )
    return copy.deepcopy(KNOWN_DATASETS[name])

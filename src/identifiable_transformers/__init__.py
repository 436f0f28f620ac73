"""Identifiable transformers: a reimplementation of Bhardwaj et al. (ACL 2021).

The sub-packages, each importing only those listed before it (``tests/test_imports.py`` checks it):

- ``common``: user errors, atomic file writing, signals, log filters, the configs' resolvers;
- ``models`` (the project's encoders) and ``data`` (data modules, sources, tokenizer, synthetic tasks);
- ``tracking``: the loggers and W&B;
- ``diagnostics``: ``maths`` -> ``faithfulness`` -> ``render`` -> ``callbacks``;
- ``modules``: the LightningModules, their metrics and checkpoints;
- ``hf``: everything Hugging Face (loading, family adapters, the pretrained classifier and its data);
- ``run`` (what ``train.py`` does around the model) and ``report`` (a sweep -> tables and plots);
- ``loading``: a checkpoint -> its model.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from .common import resolvers  # noqa: F401  (the configs' OmegaConf resolvers, also in sweep worker processes)

# Where modules lived before the sub-packages (main 047c47f): imports and configs (``_target_``) that name the old
# path keep working, with a DeprecationWarning that names the new one.
MOVED = {
    "cli": "common.errors", "files": "common.files", "interrupts": "common.interrupts", "quiet": "common.quiet",
    "resolvers": "common.resolvers",
    "run_loggers": "tracking.loggers", "wandb_logging": "tracking.wandb_logging",
    "wandb_workspace": "tracking.workspace",
    "lit_module": "modules.classifier", "metrics": "modules.metrics", "sync_check": "modules.sync_check",
    "checkpoint": "modules.checkpoint",
    "hf_loading": "hf.loading", "models.hf_adapters": "hf.adapters", "models.pretrained": "hf.encoder",
    "data.pretrained": "hf.data", "pretrained_module": "hf.module",
    "training": "run.training", "run_checks": "run.checks", "run_lock": "run.lock", "history": "run.history",
    "config_checks": "run.config_checks",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as its new module (the same object, so patches and isinstance agree)."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix(__name__ + ".")
        return importlib.util.spec_from_loader(fullname, self) if old != fullname and old in MOVED else None

    def exec_module(self, module):
        new = f"{__name__}.{MOVED[module.__name__.removeprefix(__name__ + '.')]}"
        warnings.warn(f"{module.__name__} has moved to {new}", DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(new)  # what the import statement returns


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())

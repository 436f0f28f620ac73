"""Train and test a text classifier: python train.py [group=option ...] [key=value ...]

See README.md for the config groups; `python train.py --help` lists them too.
"""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from identifiable_transformers.common.errors import exit_on_user_error

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@exit_on_user_error  # a user mistake: `Error: <message>` and exit status 1, no traceback (docs/training.md)
def main(cfg: DictConfig) -> float | None:
    from identifiable_transformers.run.training import run

    metrics = run(cfg)["metrics"]
    return metrics.get(cfg.get("optimized_metric"))


if __name__ == "__main__":
    main()

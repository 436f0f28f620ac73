"""``python -m identifiable_transformers.report SWEEP_DIR``: see :mod:`identifiable_transformers.report`."""

import sys

from .cli import main

sys.exit(main())

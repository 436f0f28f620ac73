"""tests/diagnostics is put on sys.path for its helper module (diag_helpers: the tiny data and model that the
callback tests fit)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

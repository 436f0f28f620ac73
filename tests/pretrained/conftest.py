import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers.py

pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A random 2-layer BERT (hidden 32, 4 heads) with a WordPiece tokenizer, saved offline."""
    from helpers import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))

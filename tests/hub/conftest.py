"""The local hub endpoint as a fixture. tests/hub is put on sys.path for its helper modules
(serve, fake_proxy, hub_helpers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import LocalHub  # noqa: E402


@pytest.fixture
def local_hub():
    """The fixture repos served on 127.0.0.1 (a free port); stopped at the end of the test."""
    hub = LocalHub().start()
    try:
        yield hub
    finally:
        hub.stop()

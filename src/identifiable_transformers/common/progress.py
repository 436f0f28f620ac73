"""Progress on long work, so that a busy machine never looks hung: where the progress bar is on, a tqdm bar named
after the stage; where it is off, a line as the stage starts and one with its time as it ends (and, over many
items, a line every tenth of them).

Where the bar is on: :func:`bar_on` for a Lightning trainer (``trainer.enable_progress_bar``), a terminal on stderr
for the command-line tools. The lines go to ``say`` (this module's logger by default; a tool without logging
passes ``print``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
_RECORDERS: list[dict[str, list[float]]] = []  # open recorded_stages() collectors


@contextlib.contextmanager
def recorded_stages() -> Iterator[dict[str, list[float]]]:
    """Collect every :func:`stage` run inside the block: {name: [wall seconds, process CPU seconds]} (a stage that
    runs twice adds up). What a benchmark reads to say where the time goes, without changing what it runs."""
    seconds: dict[str, list[float]] = {}
    _RECORDERS.append(seconds)
    try:
        yield seconds
    finally:
        _RECORDERS.remove(seconds)


@contextlib.contextmanager
def _recorded(name: str) -> Iterator[None]:
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        for r in _RECORDERS:
            wall, cpu = r.setdefault(name, [0.0, 0.0])
            r[name] = [wall + time.perf_counter() - t0, cpu + time.process_time() - c0]


def bar_on(trainer: Any) -> bool:
    """Whether ``trainer`` shows a progress bar (Lightning drops the bar's callback when it is off)."""
    return getattr(trainer, "progress_bar_callback", None) is not None


def _bar(name: str, total: int | None):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, file=sys.stderr, leave=False, dynamic_ncols=True)


@contextlib.contextmanager
def stage(name: str, bar: bool = False, total: int | None = None,
          say: Callable[[str], Any] | None = None, detail: str = "") -> Iterator[Callable[[int], Any]]:
    """Run a stage called ``name``; yields ``advance(n=1)`` for a stage of ``total`` steps (a bar's units).
    ``detail`` (e.g. its size) is told with the name, but not part of the name :func:`recorded_stages` keeps."""
    if bar:
        with _recorded(name), _bar(name, total) as b:
            yield b.update
        return
    say = say or log.info
    say(f"{name}{f' ({detail})' if detail else ''} ...")
    t0 = time.perf_counter()
    with _recorded(name):
        yield lambda n=1: None
    say(f"{name}: done in {time.perf_counter() - t0:.1f} s")


def track(items: Iterable[T], name: str, total: int | None = None, bar: bool = False,
          say: Callable[[str], Any] | None = None) -> Iterator[T]:
    """``items`` with progress: a bar; or the stage's lines, and one line every tenth of the ``total`` items."""
    total = total if total is not None else (len(items) if hasattr(items, "__len__") else None)
    with stage(name, bar=bar, total=total, say=say) as advance:
        every = max(1, math.ceil(total / 10)) if total else 0
        t0 = time.perf_counter()
        for i, item in enumerate(items, 1):
            yield item
            advance(1)
            if not bar and every and (i % every == 0 or i == total):
                (say or log.info)(f"{name}: {i}/{total} ({time.perf_counter() - t0:.1f} s)")

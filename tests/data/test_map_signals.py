"""A signal noted by the handlers stops the tokenized-cache build even when the exception it raised was lost inside
datasets' worker pool (raised in a `finally`, a `__del__`, a proxy call): `CacheBuilder._map` checks after the map.

In-process: a stand-in dataset whose `map` sends the signal to this process, swallows what the handler raises, and
returns normally, as the pool's machinery can."""

import signal

import pytest

from identifiable_transformers.common.interrupts import Terminated, sigterm_stops_the_run
from identifiable_transformers.data.build import CacheBuilder


class _Swallowing:
    def __init__(self, signum):
        self.signum = signum

    def __len__(self):
        return 100

    def map(self, fn, **kw):
        try:
            if self.signum:
                signal.raise_signal(self.signum)  # its Python handler runs here, before the next line
        except BaseException:  # noqa: BLE001 (what the pool's machinery may do)
            pass
        return "mapped"


class _Builder(CacheBuilder):
    num_proc = 2


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_swallowed_signal_still_stops_the_build(signum, raised):
    with sigterm_stops_the_run(), pytest.raises(raised):
        _Builder()._map(_Swallowing(signum), lambda b: b)


def test_without_a_signal_the_map_returns_its_dataset():
    with sigterm_stops_the_run():
        assert _Builder()._map(_Swallowing(0), lambda b: b) == "mapped"

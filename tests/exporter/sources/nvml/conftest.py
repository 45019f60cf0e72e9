"""Fixtures of the work-signal tests: NvmlSource through the real pynvml over FakeNvml, with
a wall clock and a monotonic clock that move only when told to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from gpuscope.exporter.model import DeviceSample, Snapshot
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.exporter.sources.fake_nvml import FakeNvml, restored_pynvml

T0 = 1_700_000_000.0  # wall clock at the start of every test, seconds
T0_US = int(T0 * 1_000_000)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


SourceFactory = Callable[..., NvmlSource]


@pytest.fixture(autouse=True)
def pynvml_state() -> Iterator[None]:
    with restored_pynvml():
        yield


@pytest.fixture
def fake() -> FakeNvml:
    fake = FakeNvml(2)
    fake.now_us = lambda: T0_US
    return fake


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def mono() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def make_source(fake: FakeNvml, wall: FakeClock, mono: FakeClock) -> Iterator[SourceFactory]:
    """NvmlSource over ``fake``; GPM every round unless a test asks otherwise."""
    sources: list[NvmlSource] = []
    refcount = pynvml._nvmlLib_refcount

    def make(**kwargs: Any) -> NvmlSource:
        kwargs.setdefault("library_loader", lambda: fake)
        kwargs.setdefault("clock", wall)
        kwargs.setdefault("monotonic", mono)
        kwargs.setdefault("xid_events", False)
        kwargs.setdefault("gpm_interval_seconds", 0.0)
        source = NvmlSource(**kwargs)
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()
    assert fake.init_count == 0
    assert pynvml._nvmlLib_refcount == refcount


def by_uuid(snap: Snapshot, uuid: str) -> DeviceSample:
    return next(d for d in snap.devices if d.uuid == uuid)

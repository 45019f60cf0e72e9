from __future__ import annotations

import logging
import threading
import time

import pytest

from gpuscope.exporter.model import PartResult, Snapshot
from gpuscope.exporter.sampler import Sampler


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class CountingSource:
    name = "counting"

    def __init__(self, clock: FakeClock, up: bool = True) -> None:
        self.clock = clock
        self.up = up
        self.calls = 0

    def sample(self) -> Snapshot:
        self.calls += 1
        return Snapshot(timestamp=self.clock(), source_up=self.up)

    def close(self) -> None:
        pass


class BrokenSource:
    name = "broken"

    def sample(self) -> Snapshot:
        raise RuntimeError("bug in a source")

    def close(self) -> None:
        pass


def test_ready_needs_a_fresh_sample_from_a_working_source() -> None:
    clock = FakeClock()
    source = CountingSource(clock)
    sampler = Sampler(source, interval=1.0, clock=clock, monotonic=clock)
    assert not sampler.ready()
    sampler.run_once()
    assert sampler.ready()
    clock.t += 2.9
    assert sampler.ready()
    clock.t += 0.2  # now 3.1 s old: older than three intervals
    assert not sampler.ready()
    source.up = False
    sampler.run_once()
    assert not sampler.ready()


def test_ready_reads_the_age_on_the_monotonic_clock() -> None:
    # NTP steps the wall clock back an hour while the next round hangs: the last sample is
    # still three intervals old by the monotonic clock, so not ready.
    wall, mono = FakeClock(), FakeClock(50.0)
    sampler = Sampler(CountingSource(wall), interval=1.0, clock=wall, monotonic=mono)
    sampler.run_once()
    assert sampler.ready()
    wall.t -= 3600.0
    mono.t += 3.1
    assert not sampler.ready()


def test_listeners_get_every_snapshot_and_a_failing_listener_is_contained() -> None:
    clock = FakeClock()
    seen: list[Snapshot] = []

    def bad(_: Snapshot) -> None:
        raise ValueError("listener bug")

    sampler = Sampler(CountingSource(clock), 1.0, clock=clock, listeners=(bad, seen.append))
    first = sampler.run_once()
    second = sampler.run_once()
    assert seen == [first, second]
    assert sampler.latest() is second


def test_a_raising_source_does_not_kill_the_loop() -> None:
    sampler = Sampler(BrokenSource(), interval=1.0)
    snap = sampler.run_once()
    assert snap.source_up is False
    assert sampler.errors == 1


def test_failed_rounds_of_each_part_are_counted_in_errors_total() -> None:
    # gpu_exporter_collector_errors_total{collector="nvml_devices"} must grow while a GPU is
    # down (success 0 every round), not stay at 0: the source reports success per round and
    # the sampler keeps the count since start.
    outcomes = iter([(True, True), (False, True), (False, False), (True, True)])

    class Flaky:
        name = "flaky"

        def sample(self) -> Snapshot:
            devices_ok, processes_ok = next(outcomes)
            return Snapshot(timestamp=0.0, source_up=True, parts=(
                PartResult("nvml_devices", devices_ok, 0.01),
                PartResult("nvml_processes", processes_ok, 0.01),
            ))

        def close(self) -> None:
            pass

    sampler = Sampler(Flaky(), interval=1.0)
    totals = []
    for _ in range(4):
        snap = sampler.run_once()
        totals.append({p.name: (p.success, p.errors_total) for p in snap.parts})
    assert totals == [
        {"nvml_devices": (True, 0), "nvml_processes": (True, 0)},
        {"nvml_devices": (False, 1), "nvml_processes": (True, 0)},
        {"nvml_devices": (False, 2), "nvml_processes": (False, 1)},
        {"nvml_devices": (True, 2), "nvml_processes": (True, 1)},
    ]


def test_a_parts_own_error_count_never_makes_the_total_go_back() -> None:
    # A part that keeps a count of its own (a worker's failed calls) reports the larger of
    # the two: a counter must not go back from the sampler's tally to the part's.
    rounds = iter([(False, 0), (False, 0), (False, 1), (True, 5)])

    class Counting:
        name = "counting"

        def sample(self) -> Snapshot:
            ok, own = next(rounds)
            return Snapshot(timestamp=0.0, source_up=True,
                            parts=(PartResult("kubelet", ok, 0.01, own),))

        def close(self) -> None:
            pass

    sampler = Sampler(Counting(), interval=1.0)
    totals = [sampler.run_once().parts[0].errors_total for _ in range(4)]
    assert totals == [1, 2, 3, 5]


def test_background_loop_samples_on_interval_and_reports_alive() -> None:
    source = CountingSource(FakeClock())
    sampler = Sampler(source, interval=0.05)
    assert not sampler.alive()
    sampler.start()
    try:
        deadline = time.monotonic() + 5
        while source.calls < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert source.calls >= 5
        assert sampler.alive()
    finally:
        sampler.stop()
    assert not sampler.alive()


def test_a_hung_round_makes_liveness_fail_and_counts_missed_rounds() -> None:
    release = threading.Event()
    mono = FakeClock(0.0)

    class Hanging:
        name = "hanging"
        calls = 0

        def sample(self) -> Snapshot:
            Hanging.calls += 1
            if Hanging.calls == 2:
                mono.t += 100.0  # the driver call takes 100 s of monotonic time
                release.wait(5)
            return Snapshot(timestamp=0.0, source_up=True)

        def close(self) -> None:
            pass

    sampler = Sampler(Hanging(), interval=1.0, monotonic=mono)
    sampler.start()
    try:
        deadline = time.monotonic() + 5
        while Hanging.calls < 2 and time.monotonic() < deadline:
            mono.t += 1.0
            time.sleep(0.01)
        assert not sampler.alive()  # 100 s > 3 intervals + 30 s since the last heartbeat
        release.set()
        deadline = time.monotonic() + 5
        while sampler.missed_rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sampler.missed_rounds >= 99
    finally:
        release.set()
        sampler.stop()


def test_a_source_and_a_listener_failing_every_round_log_one_traceback_each(
        caplog: pytest.LogCaptureFixture) -> None:
    """A bug that fails every round (86,400 rounds a day at --interval 1) is one traceback,
    not one a round (exporter/repeats.py); every round still counts in ``errors``."""
    def bad(_: Snapshot) -> None:
        raise ValueError("listener bug")

    clock = FakeClock()
    sampler = Sampler(BrokenSource(), 1.0, clock=clock, monotonic=clock, listeners=(bad,))
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            clock.t += 1.0
            sampler.run_once()
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info is not None]
    assert tracebacks == [
        "sampling source broken failed (the same error again is logged every 10 min)",
        f"snapshot listener {bad!r} failed (the same error again is logged every 10 min)"]
    assert sampler.errors == 100

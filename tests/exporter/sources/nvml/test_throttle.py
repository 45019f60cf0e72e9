"""``gpu_throttle_seconds_total{reason}`` through the real pynvml (``c_nvmlFieldValue_t``
arrays, ``c_nvmlViolationTime_t``) over FakeNvml: perf-policy field values, the
clocks-event-reason durations, and the deprecated ViolationStatus on older drivers; and over
the C double of libnvidia-ml (``bench/fake_libnvml/fake_nvml.c``), a GPU reset followed by an
exporter restart, as Prometheus' counter handling reads the exported counter."""

from __future__ import annotations

import ctypes
import itertools
import time
from pathlib import Path

import pynvml
import pytest

from bench.nvml_c_exporter import load_library
from gpuscope.exporter.model import THROTTLE_REASONS, DeviceSample
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.exporter.sources.fake_nvml import FakeNvml
from tests.exporter.sources.nvml.conftest import FakeClock, SourceFactory, by_uuid

S = 1_000_000_000  # ns
POLICY = {
    "power": pynvml.NVML_PERF_POLICY_POWER,
    "thermal": pynvml.NVML_PERF_POLICY_THERMAL,
    "sync_boost": pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    "board_limit": pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    "reliability": pynvml.NVML_PERF_POLICY_RELIABILITY,
    "app_clocks": pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    "base_clocks": pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
}
EVENT_FIELD = {
    "sw_thermal": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "hw_power_brake": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}


def throttle(dev: DeviceSample) -> dict[str, float]:
    return {t.reason: t.seconds for t in dev.throttle_seconds}


def test_every_reason_from_field_values(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = fake.gpus[0]
    # Throttled before the exporter started (since the driver loaded): not counted.
    gpu.violation_ns = dict.fromkeys(POLICY.values(), 9 * S)
    gpu.clocks_event_ns = dict.fromkeys(EVENT_FIELD.values(), 9 * S)
    source = make_source()
    first = throttle(by_uuid(source.sample(), gpu.uuid))
    assert list(first) == list(THROTTLE_REASONS)  # in the contract's order
    assert first == dict.fromkeys(THROTTLE_REASONS, 0.0)  # counted from the first read

    # Each reason's own field: a different increase for each.
    for i, policy in enumerate(POLICY.values()):
        gpu.violation_ns[policy] += i * S // 4
    gpu.clocks_event_ns[EVENT_FIELD["sw_thermal"]] += 2 * S
    gpu.clocks_event_ns[EVENT_FIELD["hw_power_brake"]] += S // 2
    mono.advance(2.0)
    second = throttle(by_uuid(source.sample(), gpu.uuid))
    assert second == pytest.approx({
        **{reason: i / 4 for i, reason in enumerate(POLICY)},
        "sw_thermal": 2.0, "hw_thermal": 0.0, "hw_power_brake": 0.5,
    })
    # One call per GPU per round; the deprecated call is never needed.
    assert fake.calls["nvmlDeviceGetFieldValues"] == 4
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 0


def test_violation_status_on_a_driver_without_field_values(
    make_source: SourceFactory, mono: FakeClock
) -> None:
    fake = FakeNvml(1, missing_functions={"nvmlDeviceGetFieldValues"})
    gpu = fake.gpus[0]
    gpu.violation_ns[POLICY["power"]] = 7 * S
    gpu.clocks_event_ns = {EVENT_FIELD["sw_thermal"]: S}  # unreachable without field values
    source = make_source(library_loader=lambda: fake)
    got = throttle(source.sample().devices[0])
    assert list(got) == list(POLICY)
    assert got["power"] == 0.0
    gpu.violation_ns[POLICY["power"]] += S
    mono.advance(1.0)
    assert throttle(source.sample().devices[0])["power"] == pytest.approx(1.0)
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 16
    source.close()


def test_fields_the_driver_lacks_fall_back_one_by_one(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[0]
    gpu.perf_policy_fields = False  # the call works, the perf-policy fields do not
    gpu.clocks_event_ns = {EVENT_FIELD["hw_power_brake"]: 3 * S}
    gpu.violation_ns[POLICY["board_limit"]] = S
    source = make_source()
    assert list(throttle(by_uuid(source.sample(), gpu.uuid))) == [*POLICY, "hw_power_brake"]
    gpu.clocks_event_ns[EVENT_FIELD["hw_power_brake"]] += 3 * S
    gpu.violation_ns[POLICY["board_limit"]] += S
    got = throttle(by_uuid(source.sample(), gpu.uuid))
    assert got["board_limit"] == pytest.approx(1.0)
    assert got["hw_power_brake"] == pytest.approx(3.0)


def test_a_gpu_without_throttle_counters_has_no_series(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    for gpu in fake.gpus:
        gpu.perf_policy_fields = False
        gpu.violation_ns = {}
    source = make_source()
    for _ in range(3):
        snap = source.sample()
    assert all(dev.throttle_seconds == () for dev in snap.devices)
    # Each policy asked once a session, not every round.
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 2 * len(POLICY)


def test_throttle_counters_never_go_back(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = fake.gpus[0]
    gpu.violation_ns[POLICY["power"]] = 5 * S
    source = make_source()
    seen = [throttle(by_uuid(source.sample(), gpu.uuid))["power"]]
    gpu.violation_ns[POLICY["power"]] = 6 * S
    seen.append(throttle(by_uuid(source.sample(), gpu.uuid))["power"])
    # The GPU is lost and reset: its counter starts again from 0 and reaches 1 s.
    gpu.lost = True
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).throttle_seconds == ()
    gpu.lost = False
    gpu.violation_ns[POLICY["power"]] = S
    seen.append(throttle(by_uuid(source.sample(), gpu.uuid))["power"])
    # The driver reloads: a new session, and the counter starts again too.
    fake.driver_loaded = False
    assert not source.sample().source_up
    fake.driver_loaded = True
    gpu.violation_ns[POLICY["power"]] = S // 2
    mono.advance(1.0)
    seen.append(throttle(by_uuid(source.sample(), gpu.uuid))["power"])
    # Counted from the first read (5 s), then every increase, each restart's whole value.
    assert seen == pytest.approx([0.0, 1.0, 2.0, 2.5])


def test_throttling_is_board_level(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    mig = fake.add_mig_slice(0, "3g.40gb", gpu_instance_id=2)
    source = make_source()
    source.sample()
    fake.gpus[0].violation_ns[POLICY["thermal"]] = 4 * S
    snap = source.sample()
    assert throttle(by_uuid(snap, fake.gpus[0].uuid))["thermal"] == pytest.approx(4.0)
    assert by_uuid(snap, mig.uuid).throttle_seconds == ()


def test_a_failing_throttle_read_leaves_the_gpu_up(
    fake: FakeNvml, make_source: SourceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = fake.gpus[0]
    gpu.errors["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_UNKNOWN
    source = make_source()
    for _ in range(3):
        dev = by_uuid(source.sample(), gpu.uuid)
        # An optional signal failing is not the device failing: the rest is reported.
        assert dev.up and dev.power_watts is not None
        assert dev.throttle_seconds == ()
    assert sum("throttle time of" in r.getMessage() for r in caplog.records) == 1
    del gpu.errors["nvmlDeviceGetFieldValues"]
    assert throttle(by_uuid(source.sample(), gpu.uuid))["power"] == 0.0


@pytest.fixture(scope="module")
def c_library(fake_libnvml_path: Path) -> ctypes.CDLL:
    return load_library(fake_libnvml_path)


def prometheus_increase(before: float, after: float) -> float:
    """What Prometheus' ``increase()`` counts between two samples of a counter: a drop is a
    reset, after which the whole new value is the increase."""
    return after - before if after >= before else after


def test_a_gpu_reset_then_an_exporter_restart_never_reads_over_the_wall_time(
    c_library: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's power counter stands at 5 s when the exporter starts; the GPU is reset
    0.3 s later and then power-capped all the time; the exporter restarts a second after it
    started. Prometheus reads the exported counter across both processes (one series: the
    same pod's container restarted). The exporter once started each process at the
    driver's value: the first process ended at 5 s + the time since the reset (5.7 s), the
    second began at the time since the reset alone (0.7 s), a drop that Prometheus reads as
    a reset and so as 0.7 s of throttling within the millisecond between the two reads."""
    monkeypatch.setenv("FAKE_NVML_GPUS", "1")
    monkeypatch.setenv("FAKE_NVML_PROCESSES_PER_GPU", "0")
    monkeypatch.setenv("FAKE_NVML_GPM", "0")
    monkeypatch.setenv("FAKE_NVML_THROTTLE_RESETS", "0@0.3")
    # The driver: initialised before the exporter and kept after it, as the kernel module
    # keeps its counters through an exporter restart (the C double keeps its node while any
    # client holds NVML).
    assert c_library.nvmlInit_v2() == pynvml.NVML_SUCCESS
    try:
        reads: list[tuple[float, float]] = []  # (monotonic seconds, exported power seconds)
        for pause in (1.0, 0.2):  # two exporter processes, one after the other, 2 reads each
            source = NvmlSource(library_loader=lambda: c_library, xid_events=False)
            try:
                for i in range(2):
                    if i:
                        time.sleep(pause)
                    power = throttle(source.sample().devices[0])["power"]
                    reads.append((time.monotonic(), power))
            finally:
                source.close()
    finally:
        assert c_library.nvmlShutdown() == pynvml.NVML_SUCCESS
    assert c_library.fakeNvmlInitCount() == 0
    # Through the reset within the first process, the counter went on rising.
    assert reads[1][1] >= reads[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(reads):
        # Never more throttling than wall time between two reads (10 ms for the clocks).
        assert prometheus_increase(v0, v1) <= t1 - t0 + 0.01, reads
    # The second process counts from its own first read.
    assert reads[2][1] == 0.0
    assert reads[3][1] == pytest.approx(reads[3][0] - reads[2][0], abs=0.05)

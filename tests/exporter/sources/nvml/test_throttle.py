"""``gpu_throttle_seconds_total{reason}`` through the real pynvml (``c_nvmlFieldValue_t``
arrays, ``c_nvmlViolationTime_t``) over FakeNvml: perf-policy field values, the
clocks-event-reason durations, and the deprecated ViolationStatus on older drivers."""

from __future__ import annotations

import pynvml
import pytest

from gpuscope.exporter.model import THROTTLE_REASONS, DeviceSample
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
    gpu.violation_ns = {policy: i * S // 4 for i, policy in enumerate(POLICY.values())}
    gpu.clocks_event_ns = {EVENT_FIELD["sw_thermal"]: 2 * S, EVENT_FIELD["hw_thermal"]: 0,
                           EVENT_FIELD["hw_power_brake"]: S // 2}
    source = make_source()
    first = throttle(by_uuid(source.sample(), gpu.uuid))
    # Counted from the driver's value: the time since it loaded.
    assert list(first) == list(THROTTLE_REASONS)  # in the contract's order
    assert first == pytest.approx({
        **{reason: i / 4 for i, reason in enumerate(POLICY)},
        "sw_thermal": 2.0, "hw_thermal": 0.0, "hw_power_brake": 0.5,
    })

    gpu.violation_ns[POLICY["thermal"]] += 3 * S // 2
    gpu.violation_ns[POLICY["app_clocks"]] += 3 * S // 2
    gpu.clocks_event_ns[EVENT_FIELD["hw_thermal"]] += S
    mono.advance(2.0)
    second = throttle(by_uuid(source.sample(), gpu.uuid))
    assert second["thermal"] == pytest.approx(0.25 + 1.5)
    assert second["app_clocks"] == pytest.approx(1.5 + 1.5)
    assert second["hw_thermal"] == pytest.approx(1.0)
    assert second["power"] == 0.0
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
    assert got["power"] == pytest.approx(7.0)
    gpu.violation_ns[POLICY["power"]] += S
    mono.advance(1.0)
    assert throttle(source.sample().devices[0])["power"] == pytest.approx(8.0)
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 16
    source.close()


def test_fields_the_driver_lacks_fall_back_one_by_one(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[0]
    gpu.perf_policy_fields = False  # the call works, the perf-policy fields do not
    gpu.clocks_event_ns = {EVENT_FIELD["hw_power_brake"]: 3 * S}
    gpu.violation_ns[POLICY["board_limit"]] = S
    got = throttle(by_uuid(make_source().sample(), gpu.uuid))
    assert list(got) == [*POLICY, "hw_power_brake"]
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
    assert seen == pytest.approx([5.0, 6.0, 7.0, 7.5])


def test_throttling_is_board_level(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    mig = fake.add_mig_slice(0, "3g.40gb", gpu_instance_id=2)
    fake.gpus[0].violation_ns[POLICY["thermal"]] = 4 * S
    snap = make_source().sample()
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

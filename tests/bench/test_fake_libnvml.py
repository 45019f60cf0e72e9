"""The C fake of libnvidia-ml (``bench/fake_libnvml/fake_nvml.c``) against the Python one.

``bench/exporter_bench.py --source nvml-c`` runs the exporter over the C library, and
``--source nvml-fake`` over ``tests/exporter/sources/fake_nvml.py`` with the node of
``bench.nvml_fake_exporter.build_node``; the two runs are compared, so the C double must play
the same node. Here NvmlSource (with the real pynvml) samples both, and every reading must be
equal but what varies with time in both (per-process utilization, busy time, GPM intervals).
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from bench.nvml_c_exporter import HISTORY_SECONDS, BuildError, build_library, load_library
from bench.nvml_fake_exporter import BUFFER_TICKS, build_node, tick
from gpuscope.exporter.model import DeviceSample, RowRemapping, Snapshot
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.exporter.sources.fake_nvml import FakeRemappedRows, restored_pynvml

GPUS = 2
PROCESSES_PER_GPU = 3
SAMPLE = pynvml.c_nvmlProcessUtilizationSample_t


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    try:
        path = build_library(tmp_path_factory.mktemp("fake_libnvml"))
    except BuildError as exc:
        # Not a skip: scripts/setup --test installs gcc and the libc headers.
        pytest.fail(str(exc))
    return load_library(path)


@pytest.fixture
def lib(library: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """The library for a 2 x 3 node, uninitialised before and after the test, and pynvml's
    globals put back afterwards."""
    monkeypatch.setenv("FAKE_NVML_GPUS", str(GPUS))
    monkeypatch.setenv("FAKE_NVML_PROCESSES_PER_GPU", str(PROCESSES_PER_GPU))
    monkeypatch.setenv("FAKE_NVML_HISTORY_SECONDS", str(HISTORY_SECONDS))
    assert library.fakeNvmlInitCount() == 0
    with restored_pynvml():
        yield library
    assert library.fakeNvmlInitCount() == 0


def sample_once(loader_result: object) -> Snapshot:
    return sample_rounds(loader_result, 1)[0]


def sample_rounds(loader_result: object, rounds: int) -> list[Snapshot]:
    """``rounds`` snapshots 0.2 s apart, GPM every round."""
    refcount = pynvml._nvmlLib_refcount
    source = NvmlSource(library_loader=lambda: loader_result, xid_wait_timeout_ms=50,
                        gpm_interval_seconds=0.0)
    snapshots = []
    try:
        for i in range(rounds):
            if i:
                time.sleep(0.2)
            snapshots.append(source.sample())
    finally:
        source.close()
    assert pynvml._nvmlLib_refcount == refcount
    return snapshots


def without_time_varying(dev: DeviceSample) -> DeviceSample:
    procs = tuple(dataclasses.replace(p, sm_utilization_ratio=None) for p in dev.processes)
    return dataclasses.replace(dev, processes=procs, busy_seconds=None)


def test_history_matches_the_python_double() -> None:
    assert HISTORY_SECONDS == BUFFER_TICKS


def test_snapshot_matches_python_double(lib: ctypes.CDLL) -> None:
    c_snapshot = sample_once(lib)
    assert lib.fakeNvmlInitCount() == 0

    fake = build_node(GPUS, PROCESSES_PER_GPU)
    tick(fake, int(time.time() * 1_000_000), 0)  # one driver tick, as the bench's thread does
    with restored_pynvml():
        py_snapshot = sample_once(fake)
    assert fake.init_count == 0

    assert c_snapshot.source_up and py_snapshot.source_up
    assert c_snapshot.driver_version == py_snapshot.driver_version == "550.54.15"
    assert [(p.name, p.success) for p in c_snapshot.parts] == [
        (p.name, p.success) for p in py_snapshot.parts
    ]
    assert all(p.success for p in c_snapshot.parts)
    assert len(c_snapshot.devices) == len(py_snapshot.devices) == GPUS
    for c_dev, py_dev in zip(c_snapshot.devices, py_snapshot.devices, strict=True):
        # Names, UUIDs, PCI, memory, power, temperature, clocks, fan, ECC, PIDs, memory per
        # process: everything but the per-process utilization is equal.
        assert without_time_varying(c_dev) == without_time_varying(py_dev)
        assert c_dev.up
        assert c_dev.utilization_ratio == 0.5
        assert c_dev.power_watts == 250.0
        assert c_dev.temperature_celsius == 45.0
        assert c_dev.row_remapping == RowRemapping(0, 0, pending=False, failed=False)
        # Work signals: throttle counters from the field values, equal in both; busy time
        # from the first samples; GPM needs a second round.
        assert {t.reason: t.seconds for t in c_dev.throttle_seconds} == {
            "power": 5.0, "thermal": 2.0, "sync_boost": 0.0, "board_limit": 0.0,
            "low_utilization": 0.0, "reliability": 0.0, "app_clocks": 0.0, "base_clocks": 0.0,
            "sw_thermal": 2.0, "hw_thermal": 0.0, "hw_power_brake": 0.0,
        }
        assert c_dev.busy_seconds in (0.0, 0.5)
        assert py_dev.busy_seconds == 0.0
        assert c_dev.sm_active_seconds is None and py_dev.sm_active_seconds is None
        assert [p.pid for p in c_dev.processes] == [
            10_000 + int(c_dev.index) * PROCESSES_PER_GPU + i for i in range(PROCESSES_PER_GPU)
        ]
        for c_proc, py_proc in zip(c_dev.processes, py_dev.processes, strict=True):
            # Both doubles sample 1..3 % per process; the cursor starts 1 s back, so the
            # first round sees the newest whole-second sample (C) or the tick (Python).
            assert c_proc.sm_utilization_ratio in (0.01, 0.02, 0.03)
            assert py_proc.sm_utilization_ratio in (0.01, 0.02, 0.03)


def test_gpm_matches_the_python_double(lib: ctypes.CDLL) -> None:
    began = time.monotonic()
    c_last = sample_rounds(lib, 3)[-1]
    c_wall = time.monotonic() - began
    assert lib.fakeNvmlGpmSamples() == 0  # two buffers per GPU, freed with the session
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    tick(fake, int(time.time() * 1_000_000), 0)
    with restored_pynvml():
        began = time.monotonic()
        py_last = sample_rounds(fake, 3)[-1]
        py_wall = time.monotonic() - began
    assert fake.gpm_samples_allocated() == 0
    for c_dev, py_dev in zip(c_last.devices, py_last.devices, strict=True):
        for dev, wall in ((c_dev, c_wall), (py_dev, py_wall)):
            # Means x elapsed: the elapsed time differs a little, the proportions do not.
            # 40 % of the time between the first and last GPM samples: at least the two
            # 0.2 s sleeps, at most the whole call (a busy host stretches it).
            sm = dev.sm_active_seconds
            assert sm is not None and 0.4 * 0.4 * 0.95 < sm < 0.4 * wall + 0.01, (sm, wall)
            assert dev.graphics_active_seconds == pytest.approx(sm * 90 / 40)
            assert dev.tensor_active_seconds == pytest.approx(sm * 25 / 40)
            assert dev.dram_active_seconds == pytest.approx(sm * 60 / 40)
            assert dev.pcie_receive_bytes == pytest.approx(sm / 0.4 * 100 * 2**20)
            assert dev.nvlink_transmit_bytes == pytest.approx(sm / 0.4 * 2000 * 2**20)
            assert dev.sm_occupancy_ratio == 0.3


def test_row_remapper_set_through_the_environment_as_on_the_python_double(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU 0: 3 rows remapped for correctable errors, 2 for uncorrectable, a remap pending;
    # GPU 1: no row remapper (NOT_SUPPORTED, as before Ampere).
    monkeypatch.setenv("FAKE_NVML_REMAPPED_ROWS", "0:3,2,1,0;1:unsupported")
    c_snapshot = sample_once(lib)
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    fake.gpus[0].remapped_rows = FakeRemappedRows(3, 2, pending=True)
    fake.gpus[1].remapped_rows = None
    with restored_pynvml():
        py_snapshot = sample_once(fake)
    for c_dev, py_dev in zip(c_snapshot.devices, py_snapshot.devices, strict=True):
        assert c_dev.up and c_dev.row_remapping == py_dev.row_remapping
    assert [d.row_remapping for d in c_snapshot.devices] == [
        RowRemapping(3, 2, pending=True, failed=False), None,
    ]

    # A failed remap; the environment is read when the library is initialised.
    monkeypatch.setenv("FAKE_NVML_REMAPPED_ROWS", "1:0,512,0,1")
    assert [d.row_remapping for d in sample_once(lib).devices] == [
        RowRemapping(0, 0, pending=False, failed=False),
        RowRemapping(0, 512, pending=False, failed=True),
    ]


def test_malformed_remapped_rows_entries_are_reported_and_left_out(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "FAKE_NVML_REMAPPED_ROWS", "0:1,2;;1:0,1,2,0;1:-1,0,0,0;64:unsupported;0:1,1,0,1"
    )
    assert [d.row_remapping for d in sample_once(lib).devices] == [
        RowRemapping(1, 1, pending=False, failed=True),  # the one good entry
        RowRemapping(0, 0, pending=False, failed=False),
    ]
    errors = capfd.readouterr().err.splitlines()
    assert [line.split("'")[1] for line in errors if "FAKE_NVML_REMAPPED_ROWS" in line] == [
        "0:1,2", "1:0,1,2,0", "1:-1,0,0,0", "64:unsupported",
    ]


def test_uninitialised_library_answers_uninitialized(lib: ctypes.CDLL) -> None:
    count = ctypes.c_uint(0)
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == pynvml.NVML_ERROR_UNINITIALIZED
    assert lib.nvmlInitWithFlags(0) == pynvml.NVML_SUCCESS
    try:
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == pynvml.NVML_SUCCESS
        assert count.value == GPUS
        handle = pynvml.c_nvmlDevice_t()
        rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(GPUS), ctypes.byref(handle))
        assert rc == pynvml.NVML_ERROR_INVALID_ARGUMENT
    finally:
        assert lib.nvmlShutdown() == pynvml.NVML_SUCCESS


def _utilization(
    lib: ctypes.CDLL, handle: object, last_seen_us: int, room: int | None
) -> tuple[int, int, list[tuple[int, int, int, int]]]:
    """(return code, count, samples as (timeStamp, pid, smUtil, memUtil)); ``room`` None is
    the size query."""
    count = ctypes.c_uint(room or 0)
    samples = None if room is None else (SAMPLE * room)()
    rc = lib.nvmlDeviceGetProcessUtilization(
        handle, samples, ctypes.byref(count), ctypes.c_ulonglong(last_seen_us)
    )
    got = [] if samples is None or rc != pynvml.NVML_SUCCESS else [
        (s.timeStamp, s.pid, s.smUtil, s.memUtil) for s in samples[: count.value]
    ]
    return rc, count.value, got


def test_process_utilization_behaves_like_the_driver_buffer(lib: ctypes.CDLL) -> None:
    assert lib.nvmlInitWithFlags(0) == pynvml.NVML_SUCCESS
    try:
        handle = pynvml.c_nvmlDevice_t()
        assert lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(1), ctypes.byref(handle)) == 0
        kept = HISTORY_SECONDS * PROCESSES_PER_GPU

        # Size query: INSUFFICIENT_SIZE with the count of samples newer than lastSeen.
        rc, count, _ = _utilization(lib, handle, 0, None)
        assert (rc, count) == (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, kept)

        rc, count, got = _utilization(lib, handle, 0, kept)
        assert (rc, count) == (pynvml.NVML_SUCCESS, kept)
        newest = got[-1][0]
        assert newest % 1_000_000 == 0
        assert abs(newest / 1e6 - time.time()) < 2
        assert [ts for ts, *_ in got] == sorted(ts for ts, *_ in got)  # oldest first
        assert len({ts for ts, *_ in got}) == HISTORY_SECONDS
        first_pid = 10_000 + 1 * PROCESSES_PER_GPU
        for ts, pid, sm, mem in got:
            i = pid - first_pid
            assert 0 <= i < PROCESSES_PER_GPU
            assert sm == 1 + (i + ts // 1_000_000) % 3
            assert mem == i % 2

        # Only samples newer than lastSeenTimeStamp; none: NOT_FOUND.
        rc, count, got = _utilization(lib, handle, newest - 1, kept)
        assert rc == pynvml.NVML_SUCCESS
        assert count >= PROCESSES_PER_GPU and all(ts >= newest for ts, *_ in got)
        future = int((time.time() + 10) * 1_000_000)
        assert _utilization(lib, handle, future, None)[0] == pynvml.NVML_ERROR_NOT_FOUND
        assert _utilization(lib, handle, future, kept)[0] == pynvml.NVML_ERROR_NOT_FOUND

        # A buffer too small gets the oldest samples that fit.
        last_seen = newest - 2_000_000
        rc, count, small = _utilization(lib, handle, last_seen, 2)
        assert (rc, count) == (pynvml.NVML_SUCCESS, 2)
        assert [(ts, pid) for ts, pid, *_ in small] == [
            (newest - 1_000_000, first_pid), (newest - 1_000_000, first_pid + 1)
        ]

        # Through pynvml, as NvmlSource calls it.
        pynvml.nvmlLib = lib
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
        assert len(samples) >= kept
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetProcessUtilization(handle, future)
    finally:
        assert lib.nvmlShutdown() == pynvml.NVML_SUCCESS


def check_work_signal_calls(library: object) -> None:
    """What both doubles answer, through pynvml: GPU-utilization samples with a cursor, field
    values each with its own return code, violation status, GPM checks of its arguments."""
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        kind, samples = pynvml.nvmlDeviceGetSamples(
            handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        assert kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        assert 1 <= len(samples) <= HISTORY_SECONDS
        assert {s.sampleValue.uiVal for s in samples} == {50}
        newest = max(s.timeStamp for s in samples)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, newest)

        ids = [*range(74, 82), 269, 270, 271, 1]
        values = pynvml.nvmlDeviceGetFieldValues(handle, ids)
        got = {v.fieldId: (v.nvmlReturn, v.value.ullVal if v.nvmlReturn == 0 else None)
               for v in values}
        assert got[74] == (0, 5_000_000_000) and got[75] == (0, 2_000_000_000)
        assert got[269] == (0, 2_000_000_000) and got[271] == (0, 0)
        assert got[1] == (pynvml.NVML_ERROR_NOT_SUPPORTED, None)
        power = pynvml.nvmlDeviceGetViolationStatus(handle, pynvml.NVML_PERF_POLICY_POWER)
        assert power.violationTime == 5_000_000_000
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetViolationStatus(handle, 6)

        assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_FP64_UTIL
        request.sample1, request.sample2 = first, second
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # not filled yet
            pynvml.nvmlGpmMetricsGet(request)
        pynvml.nvmlGpmSampleGet(handle, first)
        pynvml.nvmlGpmSampleGet(handle, second)
        pynvml.nvmlGpmMetricsGet(request)
        assert (request.metrics[0].nvmlReturn, request.metrics[0].value) == (0, 40.0)
        assert request.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
        request.sample1, request.sample2 = second, first  # the newer one first
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpmMetricsGet(request)
        request.version = 2
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlGpmMetricsGet(request)
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpmSampleFree(None)
    finally:
        pynvml.nvmlShutdown()


def test_work_signal_calls_behave_alike(lib: ctypes.CDLL) -> None:
    check_work_signal_calls(lib)
    assert lib.fakeNvmlGpmSamples() == 0
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    now_us = int(time.time() * 1_000_000)
    tick(fake, now_us - 1_000_000, 0)
    tick(fake, now_us, 1)
    with restored_pynvml():
        check_work_signal_calls(fake)
    assert fake.gpm_samples_allocated() == 0


def test_event_wait_blocks_for_the_timeout(lib: ctypes.CDLL) -> None:
    assert lib.nvmlInitWithFlags(0) == pynvml.NVML_SUCCESS
    try:
        pynvml.nvmlLib = lib
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        started = time.monotonic()
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(event_set, 100)
        assert time.monotonic() - started >= 0.09
        pynvml.nvmlEventSetFree(event_set)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlEventSetFree(event_set)
        assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_TIMEOUT) == "Timeout"
    finally:
        assert lib.nvmlShutdown() == pynvml.NVML_SUCCESS


def test_build_is_cached_and_fails_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as failed:
        build_library(tmp_path / "none", compiler="no-such-cc-for-gpuscope")
    assert "not found" in str(failed.value)
    assert "\n" not in str(failed.value)
    try:
        path = build_library(tmp_path / "lib")
    except BuildError as exc:
        # Not a skip: scripts/setup --test installs gcc and the libc headers.
        pytest.fail(str(exc))
    built = path.stat().st_mtime_ns
    assert build_library(tmp_path / "lib") == path
    assert path.stat().st_mtime_ns == built
    assert list((tmp_path / "lib").iterdir()) == [path]

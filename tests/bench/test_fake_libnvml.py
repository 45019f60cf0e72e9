"""The C fake of libnvidia-ml (``bench/fake_libnvml/fake_nvml.c``) against the Python one.

``bench/exporter_bench.py --source nvml-c`` runs the exporter over the C library, and
``--source nvml-fake`` over ``tests/exporter/sources/fake_nvml.py`` with the node of
``bench.nvml_fake_exporter.build_node``; the two runs are compared, so the C double must play
the same node. Here NvmlSource (with the real pynvml) samples both, and every reading must be
equal but what varies with time in both (per-process utilization, busy time, GPM intervals).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from bench.nvml_c_exporter import HISTORY_SECONDS, BuildError, build_library, load_library
from bench.nvml_fake_exporter import BUFFER_TICKS, build_node, tick
from gpuscope.exporter.model import (
    THROTTLE_REASONS,
    DeviceSample,
    RowRemapping,
    Snapshot,
    XidCount,
)
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sources.nvml import NvmlSource
from gpuscope.exporter.sources.nvml.calls import handle_key
from tests.exporter.snapshots import sample_until
from tests.exporter.sources.fake_nvml import FakeRemappedRows, restored_pynvml

GPUS = 2
PROCESSES_PER_GPU = 3
SAMPLE = pynvml.c_nvmlProcessUtilizationSample_t
FAULT_VARIABLES = (
    "FAKE_NVML_REMAPPED_ROWS", "FAKE_NVML_LOST", "FAKE_NVML_XIDS",
    "FAKE_NVML_MEMORY_RESERVED_MIB", "FAKE_NVML_NO_MEMORY_V2",
    "FAKE_NVML_MPS", "FAKE_NVML_MPS_CLIENT_UTILIZATION", "FAKE_NVML_THROTTLE_RESETS",
)


@pytest.fixture(scope="module")
def library(fake_libnvml_path: Path) -> ctypes.CDLL:
    return load_library(fake_libnvml_path)


@pytest.fixture
def lib(library: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """The library for a 2 x 3 node, uninitialised before and after the test, and pynvml's
    globals put back afterwards."""
    monkeypatch.setenv("FAKE_NVML_GPUS", str(GPUS))
    monkeypatch.setenv("FAKE_NVML_PROCESSES_PER_GPU", str(PROCESSES_PER_GPU))
    monkeypatch.setenv("FAKE_NVML_HISTORY_SECONDS", str(HISTORY_SECONDS))
    for name in FAULT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert library.fakeNvmlInitCount() == 0
    with restored_pynvml():
        yield library
    assert library.fakeNvmlInitCount() == 0


def sample_once(loader_result: object) -> Snapshot:
    return sample_rounds(loader_result, 1)[0]


def sample_rounds(loader_result: object, rounds: int) -> list[Snapshot]:
    """``rounds`` snapshots 0.2 s apart, GPM every round (no interval, and no CPU budget:
    on a loaded machine a slow GPM read would otherwise push the next GPM round past the
    next snapshot, as the exporter does to keep GPM within its budget)."""
    refcount = pynvml._nvmlLib_refcount
    source = NvmlSource(library_loader=lambda: loader_result, xid_wait_timeout_ms=50,
                        gpm_interval_seconds=0.0, gpm_cpu_budget=0.0)
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
        # Work signals: every throttle reason from the field values, equal in both, counted
        # from this first read (the drivers' 5 s of power and 2 s of thermal throttling
        # before it are not); busy time from the first samples; GPM needs a second round.
        assert {t.reason: t.seconds for t in c_dev.throttle_seconds} == dict.fromkeys(
            THROTTLE_REASONS, 0.0)
        assert c_dev.busy_seconds in (0.0, 0.5)
        assert py_dev.busy_seconds == 0.0
        assert c_dev.sm_active_seconds is None and py_dev.sm_active_seconds is None
        assert [p.pid for p in c_dev.processes] == [
            10_000 + int(c_dev.index) * PROCESSES_PER_GPU + i for i in range(PROCESSES_PER_GPU)
        ]
        for c_proc, py_proc in zip(c_dev.processes, py_dev.processes, strict=True):
            # Both doubles sample 1..3 % per process; the cursor starts 1 s back, so the
            # first round sees the newest whole-second sample (C) or the tick (Python). (C:
            # where the read comes more than a second after the cursor was set, a loaded
            # machine, the exporter's mean of two samples: 0.025 in a full run.)
            assert c_proc.sm_utilization_ratio is not None
            assert 0.01 <= c_proc.sm_utilization_ratio <= 0.03
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


# --- device memory: nvmlDeviceGetMemoryInfo_v2, reserved memory, the fall back to v1

MIB = 1024 * 1024
GIB = 1024 * MIB
RESERVED = 615 * MIB  # the C double's default, and FakeGpu's


def memory_calls(lib: ctypes.CDLL, version: int) -> int:
    """Calls of nvmlDeviceGetMemoryInfo (1) or _v2 (2) since the last nvmlInit of the node."""
    lib.fakeNvmlMemoryInfoCalls.restype = ctypes.c_ulonglong
    return int(lib.fakeNvmlMemoryInfoCalls(ctypes.c_uint(version)))


def test_memory_v2_leaves_out_the_reserved_memory_as_the_driver_does(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert (v2.total, v2.reserved, v2.used, v2.free) == (
            80 * GIB, RESERVED, 1 * GIB, 80 * GIB - RESERVED - 1 * GIB)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)  # used = total - free: reserved included
        assert (v1.total, v1.used, v1.free) == (80 * GIB, 1 * GIB + RESERVED, v2.free)
        # The version is the struct's size | 2 << 24 (0x02000028); any other is refused.
        size = ctypes.sizeof(pynvml.c_nvmlMemory_v2_t)
        assert pynvml.nvmlMemory_v2 == size | 2 << 24 == 0x02000028
        for version in (size | 1 << 24, (size - 8) | 2 << 24, size | 3 << 24):
            with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
                pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        assert (memory_calls(lib, 1), memory_calls(lib, 2)) == (1, 4)
    finally:
        pynvml.nvmlShutdown()

    # The reserved amount is set through the environment, read at nvmlInit.
    monkeypatch.setenv("FAKE_NVML_MEMORY_RESERVED_MIB", "2048")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert (v2.reserved, v2.used) == (2 * GIB, 1 * GIB)
        assert pynvml.nvmlDeviceGetMemoryInfo(handle).used == 3 * GIB
        assert memory_calls(lib, 2) == 1  # counted from this nvmlInit
    finally:
        pynvml.nvmlShutdown()


def test_the_exporter_serves_used_without_reserved_as_on_the_python_double(
    lib: ctypes.CDLL,
) -> None:
    c_snaps = sample_rounds(lib, 3)
    assert (memory_calls(lib, 1), memory_calls(lib, 2)) == (0, 3 * GPUS)  # v2 every round
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    with restored_pynvml():
        py_snap = sample_once(fake)
    for c_dev, py_dev in zip(c_snaps[-1].devices, py_snap.devices, strict=True):
        assert (c_dev.memory_used_bytes, c_dev.memory_total_bytes) == (1 * GIB, 80 * GIB)
        assert (py_dev.memory_used_bytes, py_dev.memory_total_bytes) == (1 * GIB, 80 * GIB)
        assert served(c_snaps[-1], c_dev.index)[
            ("gpu_memory_used_bytes", (("uuid", c_dev.uuid),))] == float(1 * GIB)


def test_a_driver_without_memory_v2_is_read_with_v1_after_one_call(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_NO_MEMORY_V2", "1")
    c_snaps = sample_rounds(lib, 3)
    # v2 answered FUNCTION_NOT_FOUND once, for the library; v1 from then on, every GPU.
    assert (memory_calls(lib, 2), memory_calls(lib, 1)) == (1, 3 * GPUS)
    c_devices = c_snaps[-1].devices
    assert all(d.up for d in c_devices)
    assert [(d.memory_used_bytes, d.memory_total_bytes) for d in c_devices] == [
        (1 * GIB + RESERVED, 80 * GIB)] * GPUS

    # The Python double without the _v2 symbol serves the same.
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    fake.memory_v2 = False
    with restored_pynvml():
        py_snap = sample_rounds(fake, 3)[-1]
    assert fake.missing_lookups["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 3 * GPUS
    for c_dev, py_dev in zip(c_devices, py_snap.devices, strict=True):
        assert (c_dev.memory_used_bytes, c_dev.memory_total_bytes) == (
            py_dev.memory_used_bytes, py_dev.memory_total_bytes)
        assert served(c_snaps[-1], c_dev.index)[
            ("gpu_memory_used_bytes", (("uuid", c_dev.uuid),))] == float(1 * GIB + RESERVED)

    # Raw: FUNCTION_NOT_FOUND, what pynvml raises for a library without the symbol.
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    finally:
        pynvml.nvmlShutdown()


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


# --- GPU health faults: FAKE_NVML_LOST and FAKE_NVML_XIDS

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]
UUID_1 = "GPU-00000000-0000-0000-0000-0000a1000001"
# What the exporter keeps of a GPU that has fallen off the bus after it was identified.
LOST_GPU_1_INFO = (
    ("driver_version", "550.54.15"), ("mig_profile", ""), ("model", "NVIDIA A100-SXM4-80GB"),
    ("parent_uuid", ""), ("pci_bus_id", "00000000:11:00.0"), ("uuid", UUID_1),
)


def served(snap: Snapshot, gpu: str) -> Series:
    """Every sample /metrics would serve for the GPU of index ``gpu``: (name, labels but
    ``gpu``) -> value."""
    got: Series = {}
    for family in GpuCollector(lambda: snap).collect():
        for s in family.samples:
            if s.labels.get("gpu") == gpu:
                rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "gpu"))
                got[(s.name, rest)] = s.value
    return got


@contextlib.contextmanager
def running_source(loader_result: object) -> Iterator[NvmlSource]:
    """NvmlSource over a double with the XID thread on (waiting 200 ms at a time, so that
    closing is prompt), closed afterwards."""
    refcount = pynvml._nvmlLib_refcount
    source = NvmlSource(library_loader=lambda: loader_result, xid_events=True,
                        xid_wait_timeout_ms=200, gpm_interval_seconds=0.0)
    try:
        yield source
    finally:
        source.close()
    assert pynvml._nvmlLib_refcount == refcount




def fallen_off(snap: Snapshot) -> bool:
    return not snap.devices[1].up and bool(snap.devices[1].xid_errors)


def test_a_gpu_lost_after_a_second_keeps_its_identity_as_on_the_python_double(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU 1 falls off the bus 1 s after nvmlInit: XID 79, and GPU_IS_LOST from then on.
    monkeypatch.setenv("FAKE_NVML_LOST", "1@1")
    monkeypatch.setenv("FAKE_NVML_XIDS", "1:79@1")
    started = time.monotonic()  # before nvmlInit (the source's first sample)
    wall_before = time.time()
    with running_source(lib) as source:
        assert all(d.up for d in source.sample().devices)
        c_snap = sample_until(source, fallen_off)
        lost_after = time.monotonic() - started
    wall_after = time.time()
    assert 1.0 <= lost_after < 4.0
    # When the event arrived, by the exporter's clock (the wall clock here): the one series
    # that differs between the two doubles' runs.
    c_served = served(c_snap, "1")
    last_seen = ("gpu_xid_last_seen_timestamp_seconds", (("uuid", UUID_1), ("xid", "79")))
    assert wall_before + 1.0 <= c_served.pop(last_seen) <= wall_after

    dev = c_snap.devices[1]
    assert not dev.up
    assert (dev.uuid, dev.model, dev.pci_bus_id) == (
        UUID_1, "NVIDIA A100-SXM4-80GB", "00000000:11:00.0")
    assert dev.xid_errors == (XidCount(79, 1),)
    assert dev.row_remapping is None and dev.power_watts is None
    assert c_served == {
        ("gpu_info", LOST_GPU_1_INFO): 1.0,
        ("gpu_up", (("uuid", UUID_1),)): 0.0,
        ("gpu_xid_errors_total", (("uuid", UUID_1), ("xid", "79"))): 1.0,
    }
    assert c_snap.devices[0].up and served(c_snap, "0")[
        ("gpu_up", (("uuid", "GPU-00000000-0000-0000-0000-0000a1000000"),))] == 1.0

    # The Python double: the same GPU, the same XID, gpu.lost = True.
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    fake.max_event_wait_s = 0.05
    with restored_pynvml(), running_source(fake) as source:
        assert all(d.up for d in source.sample().devices)
        fake.inject_xid(1, 79)
        fake.gpus[1].lost = True
        py_snap = sample_until(source, fallen_off)
    assert py_snap.devices[1] == dev
    py_served = served(py_snap, "1")
    assert py_served.pop(last_seen) >= wall_after
    assert py_served == c_served


def test_a_gpu_lost_from_the_start_is_down_without_an_identity_as_on_the_python_double(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_LOST", "1@0")
    with running_source(lib) as source:
        c_snap = source.sample()
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    fake.gpus[1].lost = True
    with restored_pynvml(), running_source(fake) as source:
        py_snap = source.sample()
    assert [d.up for d in c_snap.devices] == [True, False]
    assert c_snap.devices[1] == py_snap.devices[1]
    # Never identified (no handle): gpu_info with empty identity labels, gpu_up 0.
    assert served(c_snap, "1") == served(py_snap, "1") == {
        ("gpu_info", (("driver_version", "550.54.15"), ("mig_profile", ""), ("model", ""),
                      ("parent_uuid", ""), ("pci_bus_id", ""), ("uuid", ""))): 1.0,
        ("gpu_up", (("uuid", ""),)): 0.0,
    }


def test_a_lost_gpu_answers_gpu_is_lost_to_every_call_but_the_count(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_LOST", "1@0.3")
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
        h1 = pynvml.nvmlDeviceGetHandleByIndex(1)  # taken before the loss: stays valid
        assert pynvml.nvmlDeviceGetUUID(h1) == UUID_1
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pynvml.nvmlDeviceGetPowerUsage(h1)
            except pynvml.NVMLError_GpuIsLost:
                break
            time.sleep(0.01)
        assert pynvml.nvmlDeviceGetCount() == GPUS
        event_set = pynvml.nvmlEventSetCreate()
        for call in (
            lambda: pynvml.nvmlDeviceGetHandleByIndex(1),
            lambda: pynvml.nvmlDeviceGetUUID(h1),
            lambda: pynvml.nvmlDeviceGetName(h1),
            lambda: pynvml.nvmlDeviceGetPciInfo_v3(h1),
            lambda: pynvml.nvmlDeviceGetMemoryInfo(h1),
            lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h1),
            lambda: pynvml.nvmlDeviceGetRemappedRows(h1),
            lambda: pynvml.nvmlDeviceRegisterEvents(
                h1, pynvml.nvmlEventTypeXidCriticalError, event_set),
        ):
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                call()
        pynvml.nvmlEventSetFree(event_set)
        assert pynvml.nvmlDeviceGetPowerUsage(h0) == 250_000  # the other GPU answers
    finally:
        pynvml.nvmlShutdown()


def test_xid_events_are_handed_out_once_each_when_due(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_XIDS", "1:48@0.4;0:79@0.2")  # out of order: sorted by time
    started = time.monotonic()
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        assert lib.fakeNvmlXidEventsPending() == 2
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS)]
        both, only_gpu_0 = pynvml.nvmlEventSetCreate(), pynvml.nvmlEventSetCreate()
        for handle in handles:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, both)
        pynvml.nvmlDeviceRegisterEvents(
            handles[0], pynvml.nvmlEventTypeXidCriticalError, only_gpu_0)

        # A wait of 5 s wakes when the event is due, not at its timeout.
        for gpu, xid, due in ((0, 79, 0.2), (1, 48, 0.4)):
            data = pynvml.nvmlEventSetWait_v2(both, 5000)
            waited = time.monotonic() - started
            assert due <= waited < due + 0.3, (xid, waited)
            assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, xid)
            assert handle_key(data.device) == handle_key(handles[gpu])
            assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
        assert lib.fakeNvmlXidEventsPending() == 0
        # Each once: GPU 0's went to the first set that waited, and nothing comes again.
        for event_set in (only_gpu_0, both):
            with pytest.raises(pynvml.NVMLError_Timeout):
                pynvml.nvmlEventSetWait_v2(event_set, 50)
        pynvml.nvmlEventSetFree(both)
        pynvml.nvmlEventSetFree(only_gpu_0)
    finally:
        pynvml.nvmlShutdown()


def test_xid_events_are_counted_per_code_by_the_exporter(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_XIDS", "0:79@0.1;1:48@0.2;1:79@0.3")
    with running_source(lib) as source:
        snap = sample_until(source, lambda s: lib.fakeNvmlXidEventsPending() == 0 and sum(
            x.count for d in s.devices for x in d.xid_errors) == 3)
    assert [d.xid_errors for d in snap.devices] == [
        (XidCount(79, 1),), (XidCount(48, 1), XidCount(79, 1)),
    ]
    assert all(d.up for d in snap.devices)  # an XID alone does not take a GPU down
    xids = {k: v for k, v in served(snap, "1").items() if k[0] == "gpu_xid_errors_total"}
    assert xids == {
        ("gpu_xid_errors_total", (("uuid", UUID_1), ("xid", "48"))): 1.0,
        ("gpu_xid_errors_total", (("uuid", UUID_1), ("xid", "79"))): 1.0,
    }


def test_malformed_lost_and_xid_entries_are_reported_and_left_out(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_NVML_LOST", "1@;x@1;0@-1;64@1;0@1e3;;0@0.5s;0@ 1;1@0")
    monkeypatch.setenv(
        "FAKE_NVML_XIDS",
        "0:79;0:79@;0@1;0:-79@1;64:79@1;0:4294967296@1;0:79@1000001;0:48@0;1:79@0",
    )
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == GPUS
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # no good entry loses GPU 0
        assert pynvml.nvmlDeviceGetPowerUsage(handle) == 250_000
        with pytest.raises(pynvml.NVMLError_GpuIsLost):  # "1@0": lost from the start
            pynvml.nvmlDeviceGetHandleByIndex(1)
        assert lib.fakeNvmlXidEventsPending() == 2  # "0:48@0" and "1:79@0"
        event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        assert pynvml.nvmlEventSetWait_v2(event_set, 1000).eventData == 48
        with pytest.raises(pynvml.NVMLError_Timeout):  # GPU 1 was never registered
            pynvml.nvmlEventSetWait_v2(event_set, 50)
        pynvml.nvmlEventSetFree(event_set)
    finally:
        pynvml.nvmlShutdown()
    errors = capfd.readouterr().err.splitlines()

    def reported(name: str) -> list[str]:
        return [line.split("'")[1] for line in errors if f" {name} entry" in line]

    assert reported("FAKE_NVML_LOST") == ["1@", "x@1", "0@-1", "64@1", "0@1e3", "0@0.5s", "0@ 1"]
    assert reported("FAKE_NVML_XIDS") == [
        "0:79", "0:79@", "0@1", "0:-79@1", "64:79@1", "0:4294967296@1", "0:79@1000001",
    ]


# --- CUDA MPS: FAKE_NVML_MPS and FAKE_NVML_MPS_CLIENT_UTILIZATION

# The H200's node (driver 580.159.04): the server and two PyTorch clients on GPU 0, their
# bytes as NVML gave them (whole MiB: 66, 4968, 1704).
SERVER, HEAVY, LIGHT = 787, 752, 754
MPS_BYTES = {SERVER: 69_206_016, HEAVY: 5_209_325_568, LIGHT: 1_786_773_504}
MPS_NODE = "0:server:787:66;0:client:752:4968:70;0:client:754:1704:25"


def mps_proc_root(root: Path) -> Path:
    """/proc with the server's and the clients' names (what tells the server apart)."""
    for pid, comm, argv0 in ((SERVER, "nvidia-cuda-mps", "nvidia-cuda-mps-server"),
                             (HEAVY, "python3", "python3"), (LIGHT, "python3", "python3")):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "cmdline").write_bytes(argv0.encode() + b"\0")
    return root


def python_mps_node(per_client: bool) -> object:
    """The same node on the Python double: build_node's GPUs, GPU 0 running MPS."""
    fake = build_node(GPUS, PROCESSES_PER_GPU)
    gpu = fake.gpus[0]
    gpu.processes = []
    gpu.mps_client_utilization = per_client
    gpu.add_process(SERVER, used_memory=MPS_BYTES[SERVER], mps="server")
    gpu.add_process(HEAVY, used_memory=MPS_BYTES[HEAVY], mps="client", sm_util=70)
    gpu.add_process(LIGHT, used_memory=MPS_BYTES[LIGHT], mps="client", sm_util=25)
    fake.record_process_samples(int(time.time() * 1_000_000))
    return fake


def mps_rounds(loader_result: object, proc_root: Path | None, rounds: int = 1) -> Snapshot:
    source = NvmlSource(library_loader=lambda: loader_result, xid_events=False,
                        proc_root=None if proc_root is None else str(proc_root))
    try:
        snap = source.sample()
        for _ in range(rounds - 1):
            time.sleep(0.3)
            snap = source.sample()
    finally:
        source.close()
    return snap


@pytest.mark.parametrize("per_client", [False, True], ids=["server-samples", "client-samples"])
def test_an_mps_node_as_on_the_python_double(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, per_client: bool
) -> None:
    monkeypatch.setenv("FAKE_NVML_MPS", MPS_NODE)
    monkeypatch.setenv("FAKE_NVML_MPS_CLIENT_UTILIZATION", str(int(per_client)))
    root = mps_proc_root(tmp_path / "proc")
    c_snap = mps_rounds(lib, root)
    with restored_pynvml():
        py_snap = mps_rounds(python_mps_node(per_client), root)
    c_dev, py_dev = c_snap.devices[0], py_snap.devices[0]
    # Every reading equal, the MPS processes' utilization too (constant in both doubles);
    # busy time varies with time in the C double.
    assert dataclasses.replace(c_dev, busy_seconds=None) == dataclasses.replace(
        py_dev, busy_seconds=None)
    # GPU 1: no MPS, its own synthesized processes.
    assert without_time_varying(c_snap.devices[1]) == without_time_varying(py_snap.devices[1])
    assert not c_snap.devices[1].runs_mps
    assert {p.pid: (p.kinds, p.mps, p.memory_used_bytes) for p in c_dev.processes} == {
        pid: (("compute",), "server" if pid == SERVER else "client", MPS_BYTES[pid])
        for pid in (SERVER, HEAVY, LIGHT)
    }
    utilization = {p.pid: p.sm_utilization_ratio for p in c_dev.processes}
    if per_client:
        assert utilization == {SERVER: 0.0, HEAVY: 0.7, LIGHT: 0.25}
        assert c_dev.mps_client_utilization_reported is True
    else:  # as the H200 answered: the server's PID carries the clients' 70 + 25 %
        assert utilization == {SERVER: 0.95, HEAVY: None, LIGHT: None}
        assert c_dev.mps_client_utilization_reported is False
    got = served(c_snap, "0")
    uuid = (("uuid", c_dev.uuid),)
    assert got[("gpu_mps_server_memory_used_bytes", uuid)] == float(MPS_BYTES[SERVER])
    assert got[("gpu_mps_client_utilization_reported", uuid)] == float(per_client)


def test_the_mps_lists_through_pynvml(lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_MPS", MPS_NODE)
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS))
        compute = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h0)}
        mps = {p.pid: p.usedGpuMemory
               for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h0)}
        assert compute == MPS_BYTES  # the server and the clients
        assert mps == {HEAVY: MPS_BYTES[HEAVY], LIGHT: MPS_BYTES[LIGHT]}  # the clients only
        assert pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h1) == []
        assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(h1)) == PROCESSES_PER_GPU
        # Per-process utilization: the server's PID only, one sample per whole second.
        samples = pynvml.nvmlDeviceGetProcessUtilization(h0, 0)
        assert {(s.pid, s.smUtil) for s in samples} == {(SERVER, 95)}
        assert len(samples) == HISTORY_SECONDS
    finally:
        pynvml.nvmlShutdown()


def test_an_mps_client_exiting(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The light client exits 1 s after nvmlInit.
    monkeypatch.setenv("FAKE_NVML_MPS", MPS_NODE.replace(":25", ":25@1"))
    root = mps_proc_root(tmp_path / "proc")
    source = NvmlSource(library_loader=lambda: lib, xid_events=False, proc_root=str(root))
    try:
        before = source.sample().devices[0]
        time.sleep(1.1)
        after = source.sample().devices[0]
    finally:
        source.close()
    assert [p.pid for p in before.processes] == [HEAVY, LIGHT, SERVER]
    assert {p.pid: (p.mps, p.memory_used_bytes) for p in after.processes} == {
        HEAVY: ("client", MPS_BYTES[HEAVY]), SERVER: ("server", MPS_BYTES[SERVER]),
    }
    # The server's samples from then on carry the heavy client's work alone.
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    monkeypatch.setenv("FAKE_NVML_MPS", MPS_NODE.replace(":25", ":25@0"))
    pynvml.nvmlInit()
    try:
        h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert {(s.pid, s.smUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(h0, 0)} == {
            (SERVER, 70)}
        assert [p.pid for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h0)] == [HEAVY]
    finally:
        pynvml.nvmlShutdown()


def test_malformed_mps_entries_are_reported_and_left_out(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "FAKE_NVML_MPS",
        "0:server:787;0:client:752:4968;0:client:752:10:101;0:daemon:5:1;64:server:5:1;"
        "0:server:0:1;0:server:9:81921;0:client:7:1:5@;0:client:7:1:5@x;"
        "1:server:5:66;1:client:6:100:30;1:client:6:100:30",
    )
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    try:
        h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS))
        assert pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h0) == []  # nothing planted
        assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(h0)) == PROCESSES_PER_GPU
        assert {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h1)} == {5, 6}
    finally:
        pynvml.nvmlShutdown()
    errors = capfd.readouterr().err.splitlines()
    assert [line.split("'")[1] for line in errors if "FAKE_NVML_MPS entry" in line] == [
        "0:server:787", "0:client:752:4968", "0:client:752:10:101", "0:daemon:5:1",
        "64:server:5:1", "0:server:0:1", "0:server:9:81921", "0:client:7:1:5@",
        "0:client:7:1:5@x", "1:client:6:100:30",
    ]


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

"""NvmlSource through the real pynvml module, with the NVML C library replaced by FakeNvml.

pynvml's own ctypes marshalling, version fallbacks and error classes run for real; only
``libnvidia-ml.so.1`` is a double. Every test restores pynvml's globals (library, function
pointer cache, init refcount) so other tests see pynvml untouched.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuscope.exporter.model import (
    MEASUREMENTS,
    THROTTLE_REASONS,
    DeviceSample,
    ProcessSample,
    RowRemapping,
    Snapshot,
    ThrottleTime,
    XidCount,
)
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.exporter.snapshots import sample_until
from tests.exporter.sources.fake_nvml import (
    GIB,
    MIB,
    NO_PERMISSION,
    UNKNOWN,
    FakeNvml,
    FakeRemappedRows,
    restored_pynvml,
)

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


@pytest.fixture(autouse=True)
def pynvml_state() -> Iterator[None]:
    with restored_pynvml():
        yield


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(2)


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def mono() -> FakeClock:
    return FakeClock(100.0)


SourceFactory = Callable[..., NvmlSource]


@pytest.fixture
def make_source(fake: FakeNvml, wall: FakeClock, mono: FakeClock) -> Iterator[SourceFactory]:
    sources: list[NvmlSource] = []
    refcount = pynvml._nvmlLib_refcount

    def make(**kwargs: Any) -> NvmlSource:
        kwargs.setdefault("library_loader", lambda: fake)
        kwargs.setdefault("clock", wall)
        kwargs.setdefault("monotonic", mono)
        kwargs.setdefault("xid_wait_timeout_ms", 50)
        source = NvmlSource(**kwargs)
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()
    # Every nvmlInit was matched by an nvmlShutdown.
    assert fake.init_count == 0
    assert pynvml._nvmlLib_refcount == refcount


def by_uuid(snap: Snapshot, uuid: str) -> DeviceSample:
    return next(d for d in snap.devices if d.uuid == uuid)


def parts(snap: Snapshot) -> dict[str, bool]:
    return {p.name: p.success for p in snap.parts}




def assert_no_measurements(dev: DeviceSample) -> None:
    assert {name: getattr(dev, name) for name in MEASUREMENTS} == dict.fromkeys(MEASUREMENTS)
    assert dev.processes == ()


# --- device metrics


def test_every_device_metric_in_base_units(fake: FakeNvml, make_source: SourceFactory) -> None:
    gpu = fake.gpus[0]
    gpu.util_gpu, gpu.util_memory = 87, 35
    gpu.memory_used, gpu.memory_total = 12 * GIB, 80 * GIB
    gpu.temperature_c = 61
    gpu.power_mw, gpu.power_limit_mw = 312_500, 400_000
    gpu.energy_mj = 123_456_789
    gpu.sm_clock_mhz, gpu.mem_clock_mhz = 1410, 1593
    gpu.fan_percent = 42
    gpu.ecc_corrected, gpu.ecc_uncorrected = 7, 1
    gpu.remapped_rows = FakeRemappedRows(correctable=4, uncorrectable=1, pending=True)
    gpu.architecture = pynvml.NVML_DEVICE_ARCH_HOPPER
    gpu.name = "NVIDIA H100 80GB HBM3"
    gpu.violation_ns[pynvml.NVML_PERF_POLICY_THERMAL] = 2_500_000_000

    snap = make_source().sample()

    assert snap.source_up
    assert snap.timestamp == T0
    assert snap.driver_version == "550.54.15"
    assert [d.index for d in snap.devices] == ["0", "1"]
    assert snap.devices[0] == DeviceSample(
        index="0",
        uuid=gpu.uuid,
        model="NVIDIA H100 80GB HBM3",
        up=True,
        pci_bus_id="00000000:10:00.0",
        minor_number=0,
        parent_uuid=None,
        mig_profile=None,
        architecture="Hopper",
        utilization_ratio=0.87,
        memory_utilization_ratio=0.35,
        memory_used_bytes=12 * GIB,
        memory_total_bytes=80 * GIB,
        temperature_celsius=61.0,
        power_watts=312.5,
        power_limit_watts=400.0,
        energy_joules=123_456.789,
        sm_clock_hertz=1_410_000_000.0,
        memory_clock_hertz=1_593_000_000.0,
        fan_speed_ratio=0.42,
        ecc_corrected_errors=7,
        ecc_uncorrected_errors=1,
        row_remapping=RowRemapping(
            correctable_rows=4, uncorrectable_rows=1, pending=True, failed=False
        ),
        # The driver keeps utilization samples (none yet) and perf-policy counters (ns since
        # it loaded: 2.5 s thermal, counted from this first read on); this GPU has no GPM
        # (the fake's default).
        busy_seconds=0.0,
        throttle_seconds=tuple(ThrottleTime(reason, 0.0) for reason in THROTTLE_REASONS[:8]),
        xid_errors=(),
        processes=(),
    )
    second = snap.devices[1]
    assert second.uuid == fake.gpus[1].uuid
    assert second.architecture == "Ampere"
    assert second.pci_bus_id == "00000000:11:00.0"
    assert parts(snap) == {"nvml_devices": True, "nvml_processes": True, "xid": True}


def test_nvml_is_initialised_once_and_static_facts_read_once(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    source = make_source()
    for _ in range(3):
        assert source.sample().source_up
    assert fake.calls["nvmlInitWithFlags"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex_v2"] == 2
    assert fake.calls["nvmlDeviceGetUUID"] == 2
    assert fake.calls["nvmlDeviceGetName"] == 2
    assert fake.calls["nvmlDeviceGetPciInfo_v3"] == 2
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 6  # v2 only: the driver has it
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 0
    assert fake.calls["nvmlShutdown"] == 0
    source.close()
    assert fake.calls["nvmlShutdown"] == 1


def test_not_supported_values_are_none_and_the_device_stays_up(
    make_source: SourceFactory,
) -> None:
    fake = FakeNvml(
        1, missing_functions={"nvmlDeviceGetTotalEnergyConsumption"}  # older driver
    )
    gpu = fake.gpus[0]
    gpu.fan_percent = None  # passively cooled board
    gpu.architecture = None
    gpu.not_supported("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetUtilizationRates")
    gpu.remapped_rows = None  # no row remapper (before Ampere)
    gpu.errors["nvmlDeviceGetEnforcedPowerLimit"] = NO_PERMISSION

    snap = make_source(library_loader=lambda: fake).sample()

    dev = snap.devices[0]
    assert dev.up
    assert dev.fan_speed_ratio is None
    assert dev.architecture is None
    assert dev.energy_joules is None
    assert dev.ecc_corrected_errors is None and dev.ecc_uncorrected_errors is None
    assert dev.row_remapping is None
    assert dev.utilization_ratio is None and dev.memory_utilization_ratio is None
    assert dev.power_limit_watts is None
    # Everything else is still there.
    assert dev.power_watts == 250.0
    assert dev.temperature_celsius == 45.0
    assert dev.memory_total_bytes == 80 * GIB
    assert parts(snap)["nvml_devices"]


def test_unexpected_error_marks_only_that_device_down(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    source = make_source()
    fake.gpus[0].errors["nvmlDeviceGetTemperature"] = UNKNOWN
    snap = source.sample()
    down, other = snap.devices
    assert not down.up and down.uuid == fake.gpus[0].uuid and down.index == "0"
    assert_no_measurements(down)
    assert other.up and other.power_watts == 250.0
    assert parts(snap)["nvml_devices"] is False

    del fake.gpus[0].errors["nvmlDeviceGetTemperature"]
    snap = source.sample()
    assert snap.devices[0].up and snap.devices[0].temperature_celsius == 45.0
    assert parts(snap)["nvml_devices"]


# --- lost GPUs, missing library, driver unloaded


def test_gpu_lost_mid_run_then_recovers(fake: FakeNvml, make_source: SourceFactory) -> None:
    fake.gpus[0].add_process(100)
    fake.gpus[1].add_process(200)
    source = make_source()
    assert all(d.up for d in source.sample().devices)

    fake.gpus[0].lost = True
    snap = source.sample()
    lost, alive = snap.devices
    assert snap.source_up
    assert not lost.up
    assert (lost.index, lost.uuid, lost.model) == ("0", fake.gpus[0].uuid, fake.gpus[0].name)
    assert_no_measurements(lost)
    assert alive.up and alive.utilization_ratio == 0.5 and alive.temperature_celsius == 45.0
    assert [p.pid for p in alive.processes] == [200]

    # Still lost: asked again every round, still down.
    assert not source.sample().devices[0].up

    fake.gpus[0].lost = False
    fake.gpus[0].temperature_c = 50
    back = source.sample().devices[0]
    assert back.up and back.temperature_celsius == 50.0
    assert [p.pid for p in back.processes] == [100]
    assert fake.calls["nvmlInitWithFlags"] == 1  # no re-init for one lost GPU


def test_gpu_lost_at_start_is_reported_down_then_identified(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    fake.gpus[1].lost = True
    source = make_source()
    snap = source.sample()
    assert snap.devices[0].up
    assert not snap.devices[1].up and snap.devices[1].index == "1"

    fake.gpus[1].lost = False
    snap = source.sample()
    assert snap.devices[1].up
    assert snap.devices[1].uuid == fake.gpus[1].uuid
    assert snap.devices[1].power_watts == 250.0


def test_gpu_lost_keeps_its_identity_through_a_reinit(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    # A GPU lost mid-run is served with the UUID it had; after NVML is initialised again
    # (the driver went away and came back) NVML cannot open it (GPU_IS_LOST from
    # nvmlDeviceGetHandleByIndex), and it is still the GPU at its index: the same UUID,
    # model and bus id, never an empty UUID that would make it a new series.
    gpu = fake.gpus[1]
    source = make_source(xid_events=False)
    assert all(d.up for d in source.sample().devices)
    gpu.lost = True
    lost = source.sample().devices[1]
    assert not lost.up and lost.uuid == gpu.uuid

    fake.driver_loaded = False
    assert not source.sample().source_up
    fake.driver_loaded = True
    mono.advance(1.0)
    snap = source.sample()
    assert snap.source_up and fake.calls["nvmlInitWithFlags"] == 2
    after = snap.devices[1]
    assert not after.up
    assert (after.index, after.uuid, after.model, after.pci_bus_id) == (
        "1", gpu.uuid, gpu.name, gpu.pci_bus_id)
    assert_no_measurements(after)

    gpu.lost = False  # reset: it answers again, under its own UUID
    back = source.sample().devices[1]
    assert back.up and back.uuid == gpu.uuid


def test_lost_gpu_identity_not_carried_when_the_device_count_changed(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    # After a driver reload with a different number of GPUs the indices may have moved: a
    # GPU NVML cannot open is not taken for the one that had its index before.
    source = make_source(xid_events=False)
    source.sample()
    fake.gpus[1].lost = True
    source.sample()
    fake.driver_loaded = False
    source.sample()
    fake.add_gpu()
    fake.driver_loaded = True
    mono.advance(1.0)
    snap = source.sample()
    assert [(d.index, d.up) for d in snap.devices] == [("0", True), ("1", False), ("2", True)]
    assert snap.devices[1].uuid == ""


def write_gpu_information(proc: Path, bus: str, uuid: str | None, excluded: bool = False) -> None:
    """/proc/driver/nvidia/gpus/<bus>/information as the driver writes it (595.45: the UUID
    line from the kernel's cached UUID, left out where the cache is not valid)."""
    d = proc / "driver" / "nvidia" / "gpus" / bus
    d.mkdir(parents=True)
    lines = ["Model: \t\t NVIDIA A100-SXM4-80GB", "IRQ:   \t\t 0"]
    if uuid is not None:
        lines.append(f"GPU UUID: \t {uuid}")
    lines += ["Video BIOS: \t 92.00.45.00.03", "Bus Type: \t PCIe",
              f"Bus Location: \t {bus}", "Device Minor: \t 0",
              f"GPU Excluded:\t {'Yes' if excluded else 'No'}"]
    (d / "information").write_text("\n".join(lines) + "\n")


@pytest.fixture
def gpu_proc(tmp_path: Path, fake: FakeNvml) -> Path:
    """The host /proc with the driver's information file of each fake GPU."""
    proc = tmp_path / "proc"
    for gpu in fake.gpus:
        write_gpu_information(proc, gpu.pci_bus_id[4:].lower(), gpu.uuid)
    return proc


def test_gpu_lost_at_start_is_named_by_the_drivers_procfs(
    fake: FakeNvml, make_source: SourceFactory, gpu_proc: Path
) -> None:
    # The exporter (re)started after GPU 1 fell off the bus: NVML cannot open it, the driver
    # still lists it with the UUID it cached at probe. The one UUID no GPU NVML opened holds
    # is that GPU's.
    fake.gpus[1].lost = True
    snap = make_source(proc_root=str(gpu_proc)).sample()
    assert snap.devices[0].up and snap.devices[0].uuid == fake.gpus[0].uuid
    lost = snap.devices[1]
    assert not lost.up and (lost.index, lost.uuid) == ("1", fake.gpus[1].uuid)


@pytest.mark.parametrize("case", [
    "no proc root", "two lost", "placeholder uuid", "no uuid line", "more gpus in proc",
])
def test_gpu_lost_at_start_stays_unnamed_where_procfs_is_ambiguous(
    fake: FakeNvml, make_source: SourceFactory, gpu_proc: Path, case: str
) -> None:
    fake.gpus[1].lost = True
    proc: str | None = str(gpu_proc)
    if case == "no proc root":
        proc = None
    elif case == "two lost":  # which of two unclaimed UUIDs is which GPU: not known
        fake.add_gpu(lost=True)
        write_gpu_information(gpu_proc, fake.gpus[2].pci_bus_id[4:].lower(), fake.gpus[2].uuid)
    elif case == "placeholder uuid":  # what older drivers print when they cannot read it
        info = gpu_proc / "driver/nvidia/gpus" / fake.gpus[1].pci_bus_id[4:].lower()
        (info / "information").unlink()
        info.rmdir()
        write_gpu_information(gpu_proc, fake.gpus[1].pci_bus_id[4:].lower(),
                              "GPU-????????-????-????-????-????????????")
    elif case == "no uuid line":  # the driver's UUID cache was not valid, or an empty file
        info = gpu_proc / "driver/nvidia/gpus" / fake.gpus[1].pci_bus_id[4:].lower()
        (info / "information").write_text("")
    elif case == "more gpus in proc":  # a GPU this container's NVML does not see
        write_gpu_information(gpu_proc, "0000:99:00.0", "GPU-deadbeef-0000-0000-0000-000000000099")
    snap = make_source(proc_root=proc).sample()
    lost = [d for d in snap.devices if not d.up]
    assert lost and all(d.uuid == "" for d in lost)


def test_an_excluded_gpu_in_procfs_is_no_candidate(
    fake: FakeNvml, make_source: SourceFactory, gpu_proc: Path
) -> None:
    # NVreg_ExcludedGpus: the driver lists the GPU (GPU Excluded: Yes), NVML does not.
    write_gpu_information(gpu_proc, "0000:99:00.0", "GPU-deadbeef-0000-0000-0000-000000000099",
                          excluded=True)
    fake.gpus[1].lost = True
    assert make_source(proc_root=str(gpu_proc)).sample().devices[1].uuid == fake.gpus[1].uuid


def test_library_missing_at_start_recovers_after_backoff(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    loads: list[float] = []

    def loader() -> FakeNvml:
        loads.append(mono.now - 100.0)
        if len(loads) <= 3:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")
        return fake

    source = make_source(library_loader=loader)  # must not raise
    snap = source.sample()
    assert snap == Snapshot(
        timestamp=T0, source_up=False, devices=(), parts=snap.parts
    )
    assert not any(parts(snap).values())
    for _ in range(40):  # 10 s of sampling rounds, 0.25 s apart (exact in binary)
        mono.advance(0.25)
        snap = source.sample()
        if snap.source_up:
            break
    # Attempts at start, then after 1, 2 and 4 s of backoff.
    assert loads == pytest.approx([0.0, 1.0, 3.0, 7.0])
    assert snap.source_up
    assert [d.uuid for d in snap.devices] == [g.uuid for g in fake.gpus]
    assert fake.calls["nvmlInitWithFlags"] == 1


def test_backoff_is_capped(fake: FakeNvml, make_source: SourceFactory, mono: FakeClock) -> None:
    attempts: list[float] = []

    def loader() -> FakeNvml:
        attempts.append(mono.now)
        raise OSError("missing")

    source = make_source(library_loader=loader, retry_max_seconds=4.0)
    for _ in range(120):
        mono.advance(0.25)
        source.sample()
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(attempts)]
    assert gaps[:3] == [1.0, 2.0, 4.0]
    assert set(gaps[3:]) == {4.0}


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML library is installed"
)
def test_no_loader_and_no_library_means_source_down(make_source: SourceFactory) -> None:
    # pynvml itself tries to dlopen libnvidia-ml.so.1 and raises NVMLError_LibraryNotFound.
    snap = make_source(library_loader=None).sample()
    assert not snap.source_up and snap.devices == ()


def test_driver_not_loaded_at_start(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    fake.driver_loaded = False
    source = make_source()
    assert not source.sample().source_up
    fake.driver_loaded = True
    assert not source.sample().source_up  # backoff not elapsed yet
    mono.advance(1.0)
    assert source.sample().source_up


def test_init_failure_of_any_kind_never_raises(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    fake.errors["nvmlInitWithFlags"] = UNKNOWN
    source = make_source()
    assert not source.sample().source_up
    del fake.errors["nvmlInitWithFlags"]
    mono.advance(1.0)
    assert source.sample().source_up


def test_driver_unloaded_mid_run_reinitialises(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    source = make_source()
    assert source.sample().source_up
    assert fake.init_count == 1

    fake.driver_loaded = False
    snap = source.sample()
    assert not snap.source_up and snap.devices == ()
    assert fake.init_count == 0  # shut down
    assert fake.calls["nvmlEventSetFree"] == 1  # XID thread stopped, event set freed

    fake.driver_loaded = True
    assert not source.sample().source_up  # waits for the backoff
    assert fake.calls["nvmlInitWithFlags"] == 1
    mono.advance(1.0)
    snap = source.sample()
    assert snap.source_up and all(d.up for d in snap.devices)
    assert fake.calls["nvmlInitWithFlags"] == 2
    assert parts(snap) == {"nvml_devices": True, "nvml_processes": True, "xid": True}

    # The new XID thread counts events again.
    fake.inject_xid(0, 31)
    snap = sample_until(source, lambda s: bool(s.devices[0].xid_errors))
    assert snap.devices[0].xid_errors == (XidCount(31, 1),)


def test_uninitialized_mid_run_also_reinitialises(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    source = make_source()
    assert source.sample().source_up
    fake.errors["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_UNINITIALIZED
    assert not source.sample().source_up
    del fake.errors["nvmlDeviceGetMemoryInfo_v2"]
    mono.advance(1.0)
    assert source.sample().source_up


# --- processes


def test_processes_merged_by_pid_with_memory(fake: FakeNvml, make_source: SourceFactory) -> None:
    gpu = fake.gpus[0]
    gpu.add_process(300, kinds=("graphics",), used_memory=64 * MIB)
    gpu.add_process(100, kinds=("compute", "graphics"), used_memory=3 * GIB)
    gpu.add_process(200, used_memory=None)  # NVML: value not available
    snap = make_source(process_utilization=False).sample()
    assert snap.devices[0].processes == (
        ProcessSample(100, ("compute", "graphics"), 3 * GIB, None),
        ProcessSample(200, ("compute",), None, None),
        ProcessSample(300, ("graphics",), 64 * MIB, None),
    )
    assert snap.devices[1].processes == ()
    assert parts(snap)["nvml_processes"]


def test_v3_process_calls_missing_fall_back_to_v2_once(make_source: SourceFactory) -> None:
    fake = FakeNvml(
        1,
        missing_functions={
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
        },
    )
    fake.gpus[0].add_process(100, kinds=("compute", "graphics"), used_memory=GIB)
    fake.gpus[0].add_process(101, used_memory=2 * GIB)
    source = make_source(library_loader=lambda: fake, process_utilization=False)
    for _ in range(3):
        snap = source.sample()
        assert snap.devices[0].processes == (
            ProcessSample(100, ("compute", "graphics"), GIB, None),
            ProcessSample(101, ("compute",), 2 * GIB, None),
        )
    # The fallback is remembered: _v3 was looked up once per kind, _v2 used every round.
    assert fake.missing_lookups["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert fake.missing_lookups["nvmlDeviceGetGraphicsRunningProcesses_v3"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 3 * 2  # size + fill
    assert fake.calls["nvmlDeviceGetGraphicsRunningProcesses_v2"] == 3 * 2
    # And what triggered it is pynvml's real error for a missing _v3: a plain Exception.
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLLibraryMismatchError) as raised:
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert not isinstance(raised.value, pynvml.NVMLError)
    source.close()


def test_process_listing_failure_fails_the_part_not_the_device(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    fake.gpus[0].add_process(100)
    fake.gpus[1].add_process(200)
    fake.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses_v3"] = UNKNOWN
    snap = make_source().sample()
    assert snap.devices[0].up and snap.devices[0].processes == ()
    assert snap.devices[0].utilization_ratio == 0.5
    assert [p.pid for p in snap.devices[1].processes] == [200]
    assert parts(snap) == {"nvml_devices": True, "nvml_processes": False, "xid": True}


@pytest.mark.parametrize("entry", [
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization"])
def test_a_process_query_failing_for_hours_is_logged_once(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock,
    caplog: pytest.LogCaptureFixture, entry: str,
) -> None:
    # A process query failing round after round (UNKNOWN on a GPU in a bad state) logged a
    # warning every round: 86,400 lines a day per GPU at --interval 1. The failure is
    # logged when it starts and the recovery when it ends; the part's success and error
    # counter say the rest.
    gpu = fake.gpus[0]
    gpu.add_process(100)
    gpu.errors[entry] = UNKNOWN
    source = make_source()

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    with caplog.at_level(logging.INFO, logger="gpuscope.exporter.sources.nvml"):
        for _ in range(50):
            wall.advance(1)
            assert not parts(source.sample())["nvml_processes"]
        assert len(warnings()) == 1 and gpu.uuid in warnings()[0]
        del gpu.errors[entry]
        wall.advance(1)
        assert parts(source.sample())["nvml_processes"]
        assert any("again" in r.getMessage() and r.levelno == logging.INFO
                   for r in caplog.records)
        gpu.errors[entry] = UNKNOWN  # failing again: said again
        for _ in range(5):
            wall.advance(1)
            source.sample()
        assert len(warnings()) == 2


# --- per-process utilization


def test_process_utilization_cursor_counts_every_sample_once(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    gpu.add_process(100)
    gpu.add_process(101)
    # Samples the driver buffered long before the exporter started: never counted.
    gpu.add_util_sample(100, T0_US - 5_000_000, 100)
    gpu.add_util_sample(101, T0_US - 3_000_000, 100)
    source = make_source()

    def util() -> dict[int, float | None]:
        return {p.pid: p.sm_utilization_ratio for p in source.sample().devices[0].processes}

    gpu.add_util_sample(100, T0_US + 100, 40)
    gpu.add_util_sample(101, T0_US + 150, 10)
    gpu.add_util_sample(100, T0_US + 200, 60)
    wall.advance(1)
    assert util() == {100: pytest.approx(0.5), 101: pytest.approx(0.1)}

    # No new samples: NVML answers NOT_FOUND; running processes get 0.0, not None.
    wall.advance(1)
    calls = fake.calls["nvmlDeviceGetProcessUtilization"]
    assert util() == {100: 0.0, 101: 0.0}
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == calls + 1

    # A sample stamped before the wall clock but after the newest one read is not lost:
    # the cursor follows NVML's timestamps, not the exporter's clock.
    wall.advance(10)
    gpu.add_util_sample(100, T0_US + 300, 90)
    gpu.add_util_sample(101, T0_US + 250, 30)
    assert util() == {100: pytest.approx(0.9), 101: pytest.approx(0.3)}
    assert util() == {100: 0.0, 101: 0.0}

    fake.record_process_samples(T0_US + 400)  # both at their sm_util (0)
    gpu.add_util_sample(101, T0_US + 401, 80)
    assert util() == {100: 0.0, 101: pytest.approx(0.4)}


def test_process_utilization_goes_on_after_the_wall_clock_steps_back(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock
) -> None:
    """The driver stamps its samples with the wall clock: after NTP steps a clock that was
    ahead back by a minute, every new sample is older than the cursor, and a busy process
    read 0 % (idle) until the clock caught up. The cursor starts again; a sample stamped
    before the step (far ahead of the clock now) is not counted."""
    gpu = fake.gpus[0]
    gpu.add_process(100)
    source = make_source()

    def util() -> dict[int, float | None]:
        return {p.pid: p.sm_utilization_ratio for p in source.sample().devices[0].processes}

    wall.advance(60)
    gpu.add_util_sample(100, int(wall.now * 1_000_000) - 500_000, 70)
    assert util() == {100: pytest.approx(0.7)}
    wall.advance(-60)  # the clock was a minute ahead
    wall.advance(1)
    gpu.add_util_sample(100, int(wall.now * 1_000_000) - 500_000, 90)
    assert util() == {100: pytest.approx(0.9)}
    wall.advance(1)
    gpu.add_util_sample(100, int(wall.now * 1_000_000) - 500_000, 80)
    assert util() == {100: pytest.approx(0.8)}


def test_process_utilization_failure_keeps_the_cursor(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[0]
    gpu.add_process(100)
    source = make_source()
    gpu.add_util_sample(100, T0_US + 10, 70)
    gpu.errors["nvmlDeviceGetProcessUtilization"] = UNKNOWN
    snap = source.sample()
    assert snap.devices[0].processes == (ProcessSample(100, ("compute",), 512 * MIB, None),)
    assert parts(snap)["nvml_processes"] is False
    del gpu.errors["nvmlDeviceGetProcessUtilization"]
    snap = source.sample()
    assert snap.devices[0].processes[0].sm_utilization_ratio == pytest.approx(0.7)
    assert parts(snap)["nvml_processes"]


def test_process_utilization_not_supported_is_none_and_not_asked_again(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[0]
    gpu.process_utilization_supported = False
    gpu.add_process(100)
    source = make_source()
    for _ in range(3):
        snap = source.sample()
        assert snap.devices[0].processes[0].sm_utilization_ratio is None
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 1
    assert parts(snap)["nvml_processes"]


def test_benchmark_sized_node_samples_quickly(make_source: SourceFactory) -> None:
    fake = FakeNvml(8)
    for gpu in fake.gpus:
        for pid in range(64):
            gpu.add_process(1000 * gpu.index + pid, sm_util=pid % 100)
    source = make_source(library_loader=lambda: fake)
    fake.record_process_samples(T0_US + 1)
    started = time.perf_counter()
    snap = source.sample()
    elapsed = time.perf_counter() - started
    assert sum(len(d.processes) for d in snap.devices) == 8 * 64
    assert snap.devices[3].processes[5].sm_utilization_ratio == pytest.approx(0.05)
    assert elapsed < 1.0


# --- MIG


def test_mig_slices_are_devices_with_memory_and_processes(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    parent = fake.gpus[1]
    small = fake.add_mig_slice(parent, "1g.10gb", gpu_instance_id=9, memory_used=2 * GIB)
    large = fake.add_mig_slice(parent, "3g.40gb", gpu_instance_id=2, memory_used=30 * GIB)
    small.add_process(500, used_memory=2 * GIB)
    large.add_process(600, used_memory=20 * GIB)
    large.add_process(601, used_memory=10 * GIB)
    parent.memory_used = 32 * GIB

    snap = make_source().sample()

    assert [d.index for d in snap.devices] == ["0", "1", "1/9", "1/2"]
    gpu = by_uuid(snap, parent.uuid)
    assert gpu.up and not gpu.is_mig and gpu.mig_mode
    assert gpu.utilization_ratio is None and gpu.memory_utilization_ratio is None
    assert gpu.memory_used_bytes == 32 * GIB and gpu.memory_total_bytes == 80 * GIB
    assert gpu.power_watts == 250.0  # board-level readings stay on the parent
    assert gpu.row_remapping == RowRemapping(0, 0, pending=False, failed=False)
    assert gpu.processes == ()  # reported once, on the slices

    one = by_uuid(snap, small.uuid)
    assert one.uuid.startswith("MIG-") and not one.mig_mode
    assert (one.parent_uuid, one.mig_profile, one.model) == (
        parent.uuid, "1g.10gb", "NVIDIA A100-SXM4-80GB",
    )
    assert one.is_mig and one.up
    assert one.memory_used_bytes == 2 * GIB and one.memory_total_bytes == 10 * GIB
    assert one.utilization_ratio is None and one.power_watts is None
    assert one.row_remapping is None
    assert one.pci_bus_id == parent.pci_bus_id
    assert one.processes == (ProcessSample(500, ("compute",), 2 * GIB, None),)

    three = by_uuid(snap, large.uuid)
    assert three.mig_profile == "3g.40gb" and three.memory_total_bytes == 40 * GIB
    assert [(p.pid, p.memory_used_bytes, p.sm_utilization_ratio) for p in three.processes] == [
        (600, 20 * GIB, None),
        (601, 10 * GIB, None),
    ]
    assert parts(snap)["nvml_devices"]


def test_a_gpu_in_mig_mode_without_slices_says_so(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    # MIG mode on and no GPU instance made (the MIG manager failed to apply its layout, or
    # every slice was destroyed to make new ones): nothing can run on the GPU and NVML gives
    # it no utilization, yet it read as a GPU not in MIG mode (gpu_sharing_info "exclusive").
    fake.gpus[1].mig_enabled = True
    source = make_source()
    snap = source.sample()
    gpu = by_uuid(snap, fake.gpus[1].uuid)
    assert gpu.up and gpu.mig_mode and gpu.utilization_ratio is None
    assert not by_uuid(snap, fake.gpus[0].uuid).mig_mode
    assert [d.index for d in snap.devices] == ["0", "1"]
    # MIG mode turned on while running (no slice yet), and off again.
    fake.gpus[0].mig_enabled = True
    mono.advance(30.0)
    assert by_uuid(source.sample(), fake.gpus[0].uuid).mig_mode
    fake.gpus[0].mig_enabled = False
    mono.advance(30.0)
    assert not by_uuid(source.sample(), fake.gpus[0].uuid).mig_mode


def test_lost_mig_parent_takes_its_slices_down(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    mig = fake.add_mig_slice(0, "2g.20gb")
    source = make_source()
    fake.gpus[0].lost = True
    snap = source.sample()
    assert not by_uuid(snap, fake.gpus[0].uuid).up
    sliced = by_uuid(snap, mig.uuid)
    assert not sliced.up and sliced.mig_profile == "2g.20gb"
    assert by_uuid(snap, fake.gpus[1].uuid).up
    fake.gpus[0].lost = False
    snap = source.sample()
    assert by_uuid(snap, mig.uuid).up and by_uuid(snap, mig.uuid).memory_total_bytes == 20 * GIB


def test_each_device_carries_its_device_files_minor_number(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    # What GKE's device plugin names a GPU by (nvidia<N>: /dev/nvidia<N>), which need not be
    # NVML's index; a MIG slice carries its GPU's.
    fake.gpus[0].minor = 1
    fake.gpus[1].minor = 0
    mig = fake.add_mig_slice(fake.gpus[1], "3g.40gb", gpu_instance_id=2)
    snap = make_source().sample()
    assert [(d.index, d.minor_number) for d in snap.devices] == [
        ("0", 1), ("1", 0), ("1/2", 0)]
    assert by_uuid(snap, mig.uuid).minor_number == 0


def test_a_failed_minor_number_is_unknown_not_a_gpu_fault(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    # The minor number only names the GPU for GKE's device ids (the index stands in): its
    # failure took the whole GPU down, every round.
    fake.gpus[0].errors["nvmlDeviceGetMinorNumber"] = UNKNOWN
    snap = make_source().sample()
    gpu = snap.devices[0]
    assert (gpu.up, gpu.minor_number, gpu.utilization_ratio) == (True, None, 0.5)


def test_an_unanswered_mig_mode_leaves_the_layout_and_its_counters(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    # A mode the GPU does not answer for a while (NOT_SUPPORTED, NO_PERMISSION) is not
    # "MIG off": its slices stay, and their counters go on (they restarted from 0).
    parent = fake.gpus[1]
    mig = fake.add_mig_slice(parent, "3g.40gb", gpu_instance_id=1, util_gpu=80,
                             busy_samples_supported=True)
    source = make_source()
    source.sample()
    mono.advance(20.0)
    before = by_uuid(source.sample(), mig.uuid).busy_seconds
    parent.errors["nvmlDeviceGetMigMode"] = NO_PERMISSION
    mono.advance(20.0)
    snap = source.sample()
    assert [d.uuid for d in snap.devices if d.is_mig] == [mig.uuid]
    del parent.errors["nvmlDeviceGetMigMode"]
    mono.advance(20.0)
    after = by_uuid(source.sample(), mig.uuid).busy_seconds
    assert before is not None and after is not None and after >= before


def test_a_mig_slice_under_a_new_handle_is_the_same_slice(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The layout is read again every 10 s; a slice is known by its UUID, index and profile,
    # not by the address of the handle NVML hands out (an opaque pointer that no document
    # promises to stay the same), so an unchanged layout is not taken for a new one (which
    # would drop the slices' state and GPM buffers every 10 s).
    mig = fake.add_mig_slice(fake.gpus[1], "3g.40gb", gpu_instance_id=1)
    source = make_source()
    source.sample()
    token = ctypes.create_string_buffer(1)  # another address for the same slice; the old
    del fake._by_address[mig.address]       # one answers no more: the new one must be used
    mig.address = ctypes.addressof(token)
    fake._by_address[mig.address] = mig
    with caplog.at_level(logging.INFO, logger="gpuscope.exporter.sources.nvml.source"):
        mono.advance(30.0)
        snap = source.sample()
    assert not [r for r in caplog.records if "MIG layout" in r.getMessage()]
    assert by_uuid(snap, mig.uuid).up
    assert by_uuid(snap, mig.uuid).memory_total_bytes is not None  # read under the new one


def test_mig_layout_changed_while_running_is_followed(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    # MIG is reconfigured without a driver reload (nvidia-smi mig, the GPU operator's MIG
    # manager): the exporter kept the slices it found at nvmlInit until it restarted, so a
    # destroyed slice stayed (down: gpu_up 0 for a slice that no longer exists) and the new
    # ones, with the pods' processes on them, were never reported.
    parent = fake.gpus[1]
    old = fake.add_mig_slice(parent, "3g.40gb", gpu_instance_id=1)
    source = make_source()
    snap = source.sample()
    assert [d.index for d in snap.devices] == ["0", "1", "1/1"]

    fake.remove_mig_slice(old)
    small = fake.add_mig_slice(parent, "1g.10gb", gpu_instance_id=7)
    other = fake.add_mig_slice(parent, "2g.20gb", gpu_instance_id=8)
    small.add_process(700, used_memory=3 * GIB)
    mono.advance(30.0)
    snap = source.sample()
    assert [(d.index, d.uuid, d.mig_profile, d.up) for d in snap.devices] == [
        ("0", fake.gpus[0].uuid, None, True),
        ("1", parent.uuid, None, True),
        ("1/7", small.uuid, "1g.10gb", True),
        ("1/8", other.uuid, "2g.20gb", True),
    ]
    assert [(p.pid, p.memory_used_bytes) for p in by_uuid(snap, small.uuid).processes] == [
        (700, 3 * GIB)
    ]
    assert parts(snap)["nvml_devices"]

    # An XID on a new GPU instance is counted for its slice.
    fake.inject_xid(parent, 43, gpu_instance_id=8)
    snap = sample_until(source, lambda s: fake.pending_events() == 0 and any(
        d.xid_errors for d in s.devices))
    assert by_uuid(snap, other.uuid).xid_errors == (XidCount(43, 1),)

    # MIG mode turned on for GPU 0 (a reset, no driver reload), off again for GPU 1.
    whole = fake.add_mig_slice(0, "7g.80gb", gpu_instance_id=0)
    fake.remove_mig_slice(small)
    fake.remove_mig_slice(other)
    parent.mig_enabled = False
    parent.add_process(800, used_memory=GIB)
    mono.advance(30.0)
    snap = source.sample()
    assert [(d.index, d.uuid, d.up) for d in snap.devices] == [
        ("0", fake.gpus[0].uuid, True), ("0/0", whole.uuid, True), ("1", parent.uuid, True),
    ]
    assert by_uuid(snap, fake.gpus[0].uuid).processes == ()  # listed on its slice
    assert [p.pid for p in by_uuid(snap, parent.uuid).processes] == [800]


# --- XID events




def test_xid_events_counted_per_device_and_code(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    mig = fake.add_mig_slice(1, "1g.10gb", gpu_instance_id=13)
    source = make_source()
    for xid in (13, 48, 13):
        fake.inject_xid(0, xid)
    fake.inject_xid(1, 43, gpu_instance_id=13)  # hits one MIG instance
    fake.inject_xid(1, 79)  # the whole GPU

    snap = sample_until(source, lambda s: fake.pending_events() == 0 and sum(
        c.count for d in s.devices for c in d.xid_errors
    ) == 5)

    assert by_uuid(snap, fake.gpus[0].uuid).xid_errors == (XidCount(13, 2), XidCount(48, 1))
    assert by_uuid(snap, fake.gpus[1].uuid).xid_errors == (XidCount(79, 1),)
    assert by_uuid(snap, mig.uuid).xid_errors == (XidCount(43, 1),)
    assert parts(snap)["xid"]

    # Counters: they keep counting, and stay on a device that went down.
    fake.inject_xid(0, 13)
    fake.gpus[0].lost = True
    snap = sample_until(source, lambda s: s.devices[0].xid_errors[0].count == 3)
    assert not snap.devices[0].up
    assert snap.devices[0].xid_errors == (XidCount(13, 3), XidCount(48, 1))


def test_gpu_that_cannot_register_events_is_skipped(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    fake.gpus[0].events_supported = False
    source = make_source()
    fake.inject_xid(1, 62)
    snap = sample_until(source, lambda s: bool(s.devices[1].xid_errors))
    assert snap.devices[1].xid_errors == (XidCount(62, 1),)
    assert snap.devices[0].up and snap.devices[0].xid_errors == ()
    assert parts(snap)["xid"]


def test_gpu_identified_after_start_has_its_xid_events_counted(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    # A GPU that does not answer at nvmlInit is identified in a later round; it must then be
    # watched for XID events like the others (and, under MIG, its slices' instances too).
    mig = fake.add_mig_slice(1, "1g.10gb", gpu_instance_id=13)
    fake.gpus[1].lost = True
    source = make_source()
    assert not source.sample().devices[1].up
    fake.gpus[1].lost = False
    assert by_uuid(source.sample(), fake.gpus[1].uuid).up

    fake.inject_xid(1, 79)
    fake.inject_xid(1, 43, gpu_instance_id=13)
    snap = sample_until(source, lambda s: fake.pending_events() == 0 and sum(
        c.count for d in s.devices for c in d.xid_errors) == 2, timeout=3.0)
    assert by_uuid(snap, fake.gpus[1].uuid).xid_errors == (XidCount(79, 1),)
    assert by_uuid(snap, mig.uuid).xid_errors == (XidCount(43, 1),)
    assert parts(snap)["xid"]


def test_xid_part_recovers_when_the_only_gpu_is_identified_after_start(
    make_source: SourceFactory,
) -> None:
    # No GPU could register at start (the only one did not answer): once it answers, its
    # events are watched and the xid part succeeds.
    fake = FakeNvml(1)
    fake.gpus[0].lost = True
    source = make_source(library_loader=lambda: fake)
    snap = source.sample()
    assert parts(snap)["xid"] is False
    fake.gpus[0].lost = False
    fake.inject_xid(0, 48)
    snap = sample_until(source, lambda s: bool(s.devices[0].xid_errors), timeout=3.0)
    assert snap.devices[0].up
    assert snap.devices[0].xid_errors == (XidCount(48, 1),)
    assert parts(snap)["xid"]


def test_no_event_support_at_all_reports_the_xid_part_failed(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    for gpu in fake.gpus:
        gpu.events_supported = False
    snap = make_source().sample()
    assert snap.source_up and all(d.up for d in snap.devices)
    assert parts(snap) == {"nvml_devices": True, "nvml_processes": True, "xid": False}
    assert fake.calls["nvmlEventSetFree"] == 1


def test_a_gpu_fallen_off_the_bus_does_not_stop_the_other_gpus_xids(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    # After XID 79 the driver answers every wait on an event set holding the lost GPU with
    # GPU_IS_LOST: the set is rebuilt without it, the other GPUs' XIDs keep being counted,
    # and the lost GPU is registered again once it answers (reset).
    source = make_source()
    fake.inject_xid(0, 79)
    fake.gpus[0].lost = True
    snap = sample_until(source, lambda s: bool(s.devices[0].xid_errors))
    assert snap.devices[0].xid_errors == (XidCount(79, 1),)
    fake.inject_xid(1, 48)
    snap = sample_until(source, lambda s: bool(s.devices[1].xid_errors), timeout=3.0)
    assert snap.devices[1].xid_errors == (XidCount(48, 1),)
    assert parts(snap)["xid"]

    fake.gpus[0].lost = False  # reset: it answers again
    mono.advance(60.0)
    fake.inject_xid(0, 94)
    snap = sample_until(source, lambda s: len(s.devices[0].xid_errors) == 2, timeout=3.0)
    assert snap.devices[0].xid_errors == (XidCount(79, 1), XidCount(94, 1))
    assert parts(snap)["xid"]


def test_an_event_wait_that_keeps_failing_fails_the_xid_part(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    # The thread is alive but no event can arrive: the xid part says so.
    source = make_source()
    assert parts(sample_until(source, lambda s: parts(s)["xid"]))["xid"]
    fake.errors["nvmlEventSetWait_v2"] = UNKNOWN
    snap = sample_until(source, lambda s: not parts(s)["xid"], timeout=3.0)
    assert not parts(snap)["xid"] and all(d.up for d in snap.devices)
    del fake.errors["nvmlEventSetWait_v2"]
    snap = sample_until(source, lambda s: parts(s)["xid"], timeout=5.0)
    assert parts(snap)["xid"]


def test_an_event_set_that_cannot_be_made_fails_the_xid_part_not_the_gpus(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    # nvmlEventSetCreate failing (UNKNOWN: seen after device discovery on real nodes) costs
    # the XID counts only: every GPU still reports, NVML is not taken down and re-initialised.
    fake.errors["nvmlEventSetCreate"] = UNKNOWN
    source = make_source()
    snap = source.sample()
    assert snap.source_up and all(d.up for d in snap.devices)
    assert snap.devices[0].power_watts == 250.0
    assert parts(snap) == {"nvml_devices": True, "nvml_processes": True, "xid": False}
    assert fake.calls["nvmlInitWithFlags"] == 1
    snap = source.sample()
    assert snap.source_up and fake.calls["nvmlInitWithFlags"] == 1


def test_xid_disabled_starts_no_thread(fake: FakeNvml, make_source: SourceFactory) -> None:
    snap = make_source(xid_events=False).sample()
    assert "xid" not in parts(snap)
    assert fake.calls["nvmlEventSetCreate"] == 0


# --- close


def test_close_is_idempotent_and_stops_everything(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    source = make_source()
    assert source.sample().source_up
    watcher = source._session.xid if source._session else None
    assert watcher is not None and watcher.alive()
    started = time.monotonic()
    source.close()
    source.close()
    assert time.monotonic() - started < 1.0
    assert not watcher.alive()
    assert fake.calls["nvmlShutdown"] == 1
    assert fake.calls["nvmlEventSetFree"] == 1
    assert fake.init_count == 0
    assert not source.sample().source_up
    assert fake.calls["nvmlInitWithFlags"] == 1


def test_source_satisfies_the_protocol(make_source: SourceFactory) -> None:
    from gpuscope.exporter.model import Source

    source: Source = make_source()
    assert source.name == "nvml"


def test_a_read_failing_with_a_bug_every_round_logs_one_traceback_per_device(
    fake: FakeNvml, make_source: SourceFactory, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in a read (not an NVML error: a broken binding, a TypeError) marks the device
    down every round, with one traceback per device, not one per round (exporter/repeats.py);
    the device answering again is logged once."""
    from gpuscope.exporter.sources.nvml import calls

    def broken(handle: object) -> object:
        raise TypeError("binding returned a bad structure")

    good = calls.temperature
    monkeypatch.setattr(calls, "temperature", broken)
    source = make_source()
    with caplog.at_level(logging.INFO):
        for _ in range(20):
            snap = source.sample()
            assert not any(d.up for d in snap.devices)
        monkeypatch.setattr(calls, "temperature", good)
        assert all(d.up for d in source.sample().devices)
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info is not None]
    assert tracebacks == [f"reading device {g.uuid} failed (the same error again is logged "
                          "every 10 min)" for g in fake.gpus]
    assert [r.getMessage() for r in caplog.records if "works again" in r.getMessage()] == [
        f"reading device {g.uuid} works again after 20 failure(s)" for g in fake.gpus]

"""Device memory through the real pynvml over FakeNvml: ``nvmlDeviceGetMemoryInfo_v2``, whose
``used`` leaves out what the driver reserves for itself (nvidia-smi's memory.used), and the
fall back to v1 (``used = total - free``, reserved included) where the driver or pynvml lacks
v2, learnt once per library or device rather than failing every round."""

from __future__ import annotations

import ctypes
import logging

import pynvml
import pytest

from gpuscope.exporter.model import Snapshot
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sources.nvml import calls
from tests.exporter.sources.fake_nvml import (
    ARGUMENT_VERSION_MISMATCH,
    GIB,
    MIB,
    FakeNvml,
)
from tests.exporter.sources.nvml.conftest import SourceFactory, by_uuid

# An idle NVIDIA H200 (driver 580.159.04): nvidia-smi says 0 MiB of 143,771 MiB used; v1
# said 615 MiB used, the memory the driver reserves.
H200_TOTAL = 150_754_820_096
H200_RESERVED = 644_939_776
V2 = "nvmlDeviceGetMemoryInfo_v2"
V1 = "nvmlDeviceGetMemoryInfo"


def memory_series(snap: Snapshot, uuid: str) -> dict[str, float]:
    """The gpu_memory_{used,total}_bytes samples /metrics serves for the device ``uuid``."""
    got: dict[str, float] = {}
    for family in GpuCollector(lambda: snap).collect():
        for s in family.samples:
            if s.labels.get("uuid") == uuid and s.name in (
                "gpu_memory_used_bytes", "gpu_memory_total_bytes"
            ):
                got[s.name] = s.value
    return got


def idle_h200(fake: FakeNvml) -> None:
    for gpu in fake.gpus:
        gpu.name = "NVIDIA H200"
        gpu.memory_total, gpu.memory_reserved, gpu.memory_used = H200_TOTAL, H200_RESERVED, 0


def test_the_fake_gpu_reserves_memory_by_default() -> None:
    fake = FakeNvml(1)
    assert fake.gpus[0].memory_reserved == 615 * MIB
    assert fake.add_mig_slice(0).memory_reserved == 0


def test_used_leaves_out_the_memory_the_driver_reserves(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    idle_h200(fake)
    fake.gpus[1].memory_used = 40 * GIB
    source = make_source()
    for _ in range(3):
        snap = source.sample()
    gpu0, gpu1 = (by_uuid(snap, g.uuid) for g in fake.gpus)
    # What nvidia-smi --query-gpu=memory.used,memory.total says: 0 MiB, 143771 MiB.
    assert (gpu0.memory_used_bytes, gpu0.memory_total_bytes) == (0, H200_TOTAL)
    assert H200_TOTAL // MIB == 143_771
    assert memory_series(snap, fake.gpus[0].uuid) == {
        "gpu_memory_used_bytes": 0.0, "gpu_memory_total_bytes": float(H200_TOTAL),
    }
    assert gpu1.memory_used_bytes == 40 * GIB
    # v2 every round on both GPUs, v1 never.
    assert fake.calls[V2] == 6
    assert fake.calls[V1] == 0


def test_the_double_answers_both_versions_as_the_driver_does(fake: FakeNvml) -> None:
    idle_h200(fake)
    fake.gpus[0].memory_used = 3 * GIB
    pynvml.nvmlLib = fake
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        assert (v2.version, v2.total, v2.reserved, v2.used, v2.free) == (
            pynvml.nvmlMemory_v2, H200_TOTAL, H200_RESERVED, 3 * GIB,
            H200_TOTAL - H200_RESERVED - 3 * GIB,
        )
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        assert (v1.total, v1.used, v1.free) == (H200_TOTAL, 3 * GIB + H200_RESERVED, v2.free)
        # nvmlMemory_v2 is the struct's size | 2 << 24; any other version is refused.
        size = ctypes.sizeof(pynvml.c_nvmlMemory_v2_t)
        assert pynvml.nvmlMemory_v2 == size | 2 << 24 == 0x02000028
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlDeviceGetMemoryInfo(handle, version=size | 1 << 24)
    finally:
        pynvml.nvmlShutdown()


def test_a_driver_without_v2_is_read_with_v1_after_one_lookup(
    make_source: SourceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(2, memory_v2=False)  # a driver before R510: no _v2 symbol
    idle_h200(fake)
    source = make_source(library_loader=lambda: fake)
    with caplog.at_level(logging.INFO, logger=calls.__name__):
        for _ in range(3):
            snap = source.sample()
    said = [r.getMessage() for r in caplog.records if "MemoryInfo_v2" in r.getMessage()]
    assert len(said) == 1 and "this NVML library" in said[0]
    for gpu in fake.gpus:
        dev = by_uuid(snap, gpu.uuid)
        assert dev.up
        # v1's used: total - free, the driver's reserved memory included.
        assert (dev.memory_used_bytes, dev.memory_total_bytes) == (H200_RESERVED, H200_TOTAL)
    # The missing symbol was looked up once for the library, not once a device or a round.
    assert fake.missing_lookups[V2] == 1
    assert fake.calls[V2] == 0
    assert fake.calls[V1] == 6
    assert snap.parts[0].success


def test_a_device_that_does_not_answer_v2_is_read_with_v1_after_one_try(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    idle_h200(fake)
    fake.gpus[0].not_supported(V2)
    source = make_source()
    for _ in range(3):
        snap = source.sample()
    gpu0, gpu1 = (by_uuid(snap, g.uuid) for g in fake.gpus)
    assert gpu0.up and gpu0.memory_used_bytes == H200_RESERVED  # v1, reserved included
    assert gpu1.up and gpu1.memory_used_bytes == 0  # still v2
    assert fake.calls[V2] == 1 + 3  # GPU 0 once, GPU 1 every round
    assert fake.calls[V1] == 3


def test_a_driver_that_knows_another_v2_struct_is_read_with_v1(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    idle_h200(fake)
    fake.errors[V2] = ARGUMENT_VERSION_MISMATCH
    source = make_source()
    for _ in range(3):
        snap = source.sample()
    assert [d.memory_used_bytes for d in snap.devices] == [H200_RESERVED, H200_RESERVED]
    assert all(d.up for d in snap.devices)
    assert fake.calls[V2] == 1  # for the whole library
    assert fake.calls[V1] == 6


def test_a_pynvml_without_memory_v2_reads_v1_only(
    fake: FakeNvml, make_source: SourceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(pynvml, "nvmlMemory_v2")
    idle_h200(fake)
    snap = make_source().sample()
    assert [d.memory_used_bytes for d in snap.devices] == [H200_RESERVED, H200_RESERVED]
    assert fake.calls[V2] == 0 and fake.missing_lookups[V2] == 0
    assert fake.calls[V1] == 2


def test_memory_not_supported_by_either_version_is_absent(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    fake.gpus[0].not_supported(V2, V1)
    source = make_source()
    for _ in range(2):
        snap = source.sample()
    gpu0 = by_uuid(snap, fake.gpus[0].uuid)
    assert gpu0.up
    assert gpu0.memory_used_bytes is None and gpu0.memory_total_bytes is None
    assert memory_series(snap, fake.gpus[0].uuid) == {}
    assert fake.calls[V2] == 1 + 2  # GPU 0 once; GPU 1 every round
    assert fake.calls[V1] == 2  # asked every round, as any value not supported


def test_another_error_on_v2_is_not_a_fall_back(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    # A GPU lost while answering v2 is down, not switched to v1; once back it answers v2.
    source = make_source()
    fake.gpus[0].lost = True
    snap = source.sample()
    assert not by_uuid(snap, fake.gpus[0].uuid).up
    fake.gpus[0].lost = False
    snap = source.sample()
    assert by_uuid(snap, fake.gpus[0].uuid).memory_used_bytes == 1 * GIB
    assert fake.calls[V1] == 0


def test_mig_slices_read_v2(fake: FakeNvml, make_source: SourceFactory) -> None:
    mig = fake.add_mig_slice(1, "3g.40gb", memory_used=5 * GIB)
    fake.gpus[1].memory_used = 5 * GIB
    snap = make_source().sample()
    assert by_uuid(snap, mig.uuid).memory_used_bytes == 5 * GIB
    assert by_uuid(snap, fake.gpus[1].uuid).memory_used_bytes == 5 * GIB
    assert fake.calls[V1] == 0


def test_what_was_learnt_is_forgotten_with_the_library(make_source: SourceFactory) -> None:
    # An old driver, then (a new library object, as after an upgrade) one with v2.
    old = FakeNvml(1, memory_v2=False)
    source = make_source(library_loader=lambda: old)
    assert source.sample().devices[0].memory_used_bytes == 1 * GIB + 615 * MIB
    source.close()
    new = FakeNvml(1)
    calls.install_library(new)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert calls.memory(handle) == (1 * GIB, 80 * GIB)
        assert calls.memory(handle) == (1 * GIB, 80 * GIB)
    finally:
        pynvml.nvmlShutdown()
    assert new.calls[V2] == 2 and new.calls[V1] == 0
    assert old.missing_lookups[V2] == 1

"""Hand-built snapshots for collector and exposition tests (no source involved), and
:func:`sample_until` for the tests that sample a source until something arrives."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from gpuscope.exporter.model import (
    DeviceSample,
    PartResult,
    ProcessSample,
    RowRemapping,
    Snapshot,
    XidCount,
)

GIB = 1024**3


class _Sampling(Protocol):
    def sample(self) -> Snapshot: ...


def sample_until(source: _Sampling, done: Callable[[Snapshot], bool], timeout: float = 10.0,
                 every: float = 0.005) -> Snapshot:
    """Sample ``source`` until ``done`` or ``timeout`` seconds (XID events arrive on the
    event thread, planted faults with time); the last snapshot either way."""
    deadline = time.monotonic() + timeout
    while True:
        snap = source.sample()
        if done(snap) or time.monotonic() > deadline:
            return snap
        time.sleep(every)


def fixed_snapshot() -> Snapshot:
    """Two full GPUs (one busy with two processes, one lost), one MIG parent with a slice."""
    busy = DeviceSample(
        index="0",
        uuid="GPU-11111111-2222-3333-4444-555555555555",
        model="NVIDIA A100-SXM4-80GB",
        pci_bus_id="00000000:07:00.0",
        architecture="Ampere",
        utilization_ratio=0.87,
        memory_utilization_ratio=0.42,
        memory_used_bytes=30 * GIB,
        memory_total_bytes=80 * GIB,
        temperature_celsius=61.0,
        power_watts=312.5,
        power_limit_watts=400.0,
        energy_joules=123456.789,
        sm_clock_hertz=1.41e9,
        memory_clock_hertz=1.593e9,
        fan_speed_ratio=None,  # SXM boards have no fan: NOT_SUPPORTED
        ecc_corrected_errors=3,
        ecc_uncorrected_errors=0,
        row_remapping=RowRemapping(
            correctable_rows=2, uncorrectable_rows=1, pending=True, failed=False
        ),
        xid_errors=(XidCount(xid=13, count=2, last_seen=1_699_999_400.25),
                    XidCount(xid=79, count=1, last_seen=1_699_999_940.5)),
        processes=(
            ProcessSample(pid=4242, kinds=("compute",), memory_used_bytes=20 * GIB,
                          sm_utilization_ratio=0.6),
            ProcessSample(pid=4343, kinds=("compute", "graphics"), memory_used_bytes=10 * GIB,
                          sm_utilization_ratio=0.25),
        ),
    )
    lost = DeviceSample(
        index="1",
        uuid="GPU-66666666-7777-8888-9999-000000000000",
        model="NVIDIA A100-SXM4-80GB",
        pci_bus_id="00000000:0F:00.0",
        up=False,
    )
    mig_parent = DeviceSample(
        index="2",
        uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        model="NVIDIA A100-SXM4-80GB",
        pci_bus_id="00000000:47:00.0",
        utilization_ratio=None,  # NOT_SUPPORTED with MIG on
        memory_used_bytes=5 * GIB,
        memory_total_bytes=80 * GIB,
        temperature_celsius=40.0,
        power_watts=90.0,
        power_limit_watts=400.0,
        row_remapping=RowRemapping(
            correctable_rows=0, uncorrectable_rows=0, pending=False, failed=False
        ),
    )
    mig_slice = DeviceSample(
        index="2/7",
        uuid="MIG-12345678-aaaa-bbbb-cccc-123456789abc",
        model="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
        pci_bus_id="00000000:47:00.0",
        parent_uuid=mig_parent.uuid,
        mig_profile="1g.10gb",
        memory_used_bytes=5 * GIB,
        memory_total_bytes=10 * GIB,
        processes=(ProcessSample(pid=777, kinds=("compute",), memory_used_bytes=5 * GIB),),
    )
    return Snapshot(
        timestamp=1_700_000_000.5,
        source_up=True,
        driver_version="550.54.15",
        devices=(busy, lost, mig_parent, mig_slice),
        parts=(
            PartResult("nvml_devices", True, 0.004),
            PartResult("nvml_processes", False, 0.002),
        ),
    )

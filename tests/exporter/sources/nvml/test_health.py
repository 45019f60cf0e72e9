"""GPU health signals through the real pynvml over FakeNvml, down to the series /metrics
serves: a lost GPU, critical XIDs, uncorrectable ECC errors and the row remapper
(``nvmlDeviceGetRemappedRows``: rows remapped, a remap pending, a remap failed)."""

from __future__ import annotations

import pynvml

from gpuscope.exporter.model import RowRemapping, Snapshot, XidCount
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from tests.exporter.snapshots import sample_until
from tests.exporter.sources.fake_nvml import (
    UNKNOWN,
    FakeNvml,
    FakeRemappedRows,
)
from tests.exporter.sources.nvml.conftest import FakeClock, SourceFactory, by_uuid

# The XIDs the dashboard's health verdict counts as critical.
CRITICAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154)
REMAP_SERIES = ("gpu_remapped_rows", "gpu_row_remap_pending", "gpu_row_remap_failed")

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def series(snap: Snapshot, uuid: str) -> Series:
    """Every sample /metrics would serve for the device ``uuid``: (name, other labels) ->
    value (``gpu`` and ``uuid`` left out of the labels)."""
    got: Series = {}
    for family in GpuCollector(lambda: snap).collect():
        for s in family.samples:
            if s.labels.get("uuid") != uuid:
                continue
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("gpu", "uuid")))
            got[(s.name, rest)] = s.value
    return got


def remap_series(snap: Snapshot, uuid: str) -> Series:
    return {k: v for k, v in series(snap, uuid).items() if k[0] in REMAP_SERIES}




def test_a_healthy_gpu_has_its_row_remapper_at_zero(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    snap = make_source().sample()
    for gpu in fake.gpus:
        dev = by_uuid(snap, gpu.uuid)
        assert dev.row_remapping == RowRemapping(0, 0, pending=False, failed=False)
        assert remap_series(snap, gpu.uuid) == {
            ("gpu_remapped_rows", (("cause", "correctable"),)): 0.0,
            ("gpu_remapped_rows", (("cause", "uncorrectable"),)): 0.0,
            ("gpu_row_remap_pending", ()): 0.0,
            ("gpu_row_remap_failed", ()): 0.0,
        }


def test_a_pending_row_remap_with_exact_counts_then_the_reset(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[1]
    gpu.remapped_rows = FakeRemappedRows(correctable=3, uncorrectable=2, pending=True)
    gpu.ecc_uncorrected = 1
    source = make_source()
    snap = source.sample()
    assert by_uuid(snap, gpu.uuid).row_remapping == RowRemapping(3, 2, pending=True, failed=False)
    assert remap_series(snap, gpu.uuid) == {
        ("gpu_remapped_rows", (("cause", "correctable"),)): 3.0,
        ("gpu_remapped_rows", (("cause", "uncorrectable"),)): 2.0,
        ("gpu_row_remap_pending", ()): 1.0,
        ("gpu_row_remap_failed", ()): 0.0,
    }
    assert series(snap, gpu.uuid)[("gpu_ecc_uncorrected_errors_total", ())] == 1.0
    assert by_uuid(snap, gpu.uuid).up  # a pending remap does not take the GPU down
    assert remap_series(snap, fake.gpus[0].uuid)[("gpu_row_remap_pending", ())] == 0.0

    # The GPU is reset: the row is remapped, nothing pending. Read every round.
    gpu.remapped_rows = FakeRemappedRows(correctable=3, uncorrectable=3)
    snap = source.sample()
    assert remap_series(snap, gpu.uuid)[("gpu_row_remap_pending", ())] == 0.0
    assert remap_series(snap, gpu.uuid)[
        ("gpu_remapped_rows", (("cause", "uncorrectable"),))
    ] == 3.0
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 2 * len(fake.gpus)


def test_a_failed_row_remap(fake: FakeNvml, make_source: SourceFactory) -> None:
    gpu = fake.gpus[0]
    gpu.remapped_rows = FakeRemappedRows(uncorrectable=512, failed=True)
    snap = make_source().sample()
    assert by_uuid(snap, gpu.uuid).row_remapping == RowRemapping(0, 512, False, failed=True)
    got = remap_series(snap, gpu.uuid)
    assert got[("gpu_row_remap_failed", ())] == 1.0
    assert got[("gpu_row_remap_pending", ())] == 0.0
    assert got[("gpu_remapped_rows", (("cause", "uncorrectable"),))] == 512.0


def test_no_row_remapper_means_absent_series_not_zero(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    old = fake.gpus[1]
    old.architecture = pynvml.NVML_DEVICE_ARCH_VOLTA
    old.remapped_rows = None  # NOT_SUPPORTED: before Ampere
    mig = fake.add_mig_slice(0, "3g.40gb")
    snap = make_source().sample()

    dev = by_uuid(snap, old.uuid)
    assert dev.up and dev.row_remapping is None
    assert remap_series(snap, old.uuid) == {}
    assert ("gpu_power_watts", ()) in series(snap, old.uuid)  # the rest is there
    # A MIG slice has none of its own (the board's is on its parent), and is not asked.
    assert remap_series(snap, mig.uuid) == {}
    assert by_uuid(snap, fake.gpus[0].uuid).row_remapping is not None
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 2


def test_a_driver_without_the_call_leaves_the_series_out(make_source: SourceFactory) -> None:
    fake = FakeNvml(1, missing_functions={"nvmlDeviceGetRemappedRows"})
    snap = make_source(library_loader=lambda: fake).sample()
    assert snap.devices[0].up and snap.devices[0].row_remapping is None
    assert remap_series(snap, fake.gpus[0].uuid) == {}


def test_a_failing_row_remapper_read_marks_the_gpu_down_like_any_reading(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    fake.gpus[0].errors["nvmlDeviceGetRemappedRows"] = UNKNOWN
    snap = make_source().sample()
    assert not snap.devices[0].up
    assert snap.devices[1].up and snap.devices[1].row_remapping is not None


def test_a_gpu_fallen_off_the_bus_keeps_only_its_identity_and_xids(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[0]
    gpu.remapped_rows = FakeRemappedRows(uncorrectable=1, pending=True)
    source = make_source(xid_events=True)
    assert remap_series(source.sample(), gpu.uuid)[("gpu_row_remap_pending", ())] == 1.0

    fake.inject_xid(gpu, 79)
    gpu.lost = True  # GPU_IS_LOST from every call from now on
    snap = sample_until(source, lambda s: bool(by_uuid(s, gpu.uuid).xid_errors))

    dev = by_uuid(snap, gpu.uuid)
    assert not dev.up
    assert dev.xid_errors == (XidCount(79, 1),)
    assert dev.row_remapping is None
    assert set(series(snap, gpu.uuid)) == {
        ("gpu_info", (("driver_version", "550.54.15"), ("mig_profile", ""),
                      ("model", gpu.name), ("parent_uuid", ""),
                      ("pci_bus_id", gpu.pci_bus_id))),
        ("gpu_up", ()),
        ("gpu_xid_errors_total", (("xid", "79"),)),
        ("gpu_xid_last_seen_timestamp_seconds", (("xid", "79"),)),
    }
    assert series(snap, gpu.uuid)[("gpu_up", ())] == 0.0
    assert series(snap, gpu.uuid)[("gpu_xid_errors_total", (("xid", "79"),))] == 1.0
    other = fake.gpus[1].uuid
    assert series(snap, other)[("gpu_up", ())] == 1.0
    assert remap_series(snap, other)[("gpu_row_remap_pending", ())] == 0.0


def test_an_xid_carries_the_wall_clock_time_its_last_event_arrived(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock
) -> None:
    # What tells a new event from an old count: after an exporter restart the counter
    # starts again at 1, as it was before; the time of its last event does not repeat.
    gpu = fake.gpus[0]
    source = make_source(xid_events=True)
    first = wall.now
    fake.inject_xid(gpu, 79)
    snap = sample_until(source, lambda s: bool(by_uuid(s, gpu.uuid).xid_errors))
    assert [(c.xid, c.count, c.last_seen) for c in by_uuid(snap, gpu.uuid).xid_errors] == [
        (79, 1, first)]
    wall.advance(600.0)
    fake.inject_xid(gpu, 79)
    snap = sample_until(source, lambda s: by_uuid(s, gpu.uuid).xid_errors[0].count == 2)
    assert [(c.xid, c.count, c.last_seen) for c in by_uuid(snap, gpu.uuid).xid_errors] == [
        (79, 2, first + 600.0)]
    assert series(snap, gpu.uuid)[
        ("gpu_xid_last_seen_timestamp_seconds", (("xid", "79"),))] == first + 600.0


def test_every_critical_xid_is_counted_under_its_own_code(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[1]
    source = make_source(xid_events=True)
    for xid in CRITICAL_XIDS:
        fake.inject_xid(gpu, xid)
    fake.inject_xid(gpu, 79)
    snap = sample_until(source, lambda s: sum(
        c.count for c in by_uuid(s, gpu.uuid).xid_errors
    ) == len(CRITICAL_XIDS) + 1)
    dev = by_uuid(snap, gpu.uuid)
    assert dev.up  # an XID alone does not take the GPU down; GPU_IS_LOST does
    assert {(c.xid, c.count) for c in dev.xid_errors} == {
        (xid, 2 if xid == 79 else 1) for xid in CRITICAL_XIDS
    }
    xids = {k[1]: v for k, v in series(snap, gpu.uuid).items()
            if k[0] == "gpu_xid_errors_total"}
    assert xids == {(("xid", str(x)),): (2.0 if x == 79 else 1.0) for x in CRITICAL_XIDS}
    assert by_uuid(snap, fake.gpus[0].uuid).xid_errors == ()

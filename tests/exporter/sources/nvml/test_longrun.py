"""State the NVML source keeps per device UUID stays bounded over weeks of MIG re-carving.

Each MIG slice created gets a new UUID (``nvidia-smi mig -cgi``, the GPU operator's MIG
manager, dynamic-MIG schedulers that re-carve per job). The source keeps per-UUID state
across rounds and NVML sessions (work-signal counters, utilization cursors, XID counts,
what MPS and optional reads did there), so that a counter never goes back while its device
exists. A UUID that has left the node for good must not keep that state for the life of the
process: a node re-carved every few minutes would otherwise grow by every slice it ever
had.
"""

from __future__ import annotations

import gc
import logging
import tracemalloc
import uuid as uuidlib
from pathlib import Path

import pytest

from gpuscope import exporter
from tests.exporter.sources.fake_nvml import FakeMigSlice, FakeNvml
from tests.exporter.sources.nvml.conftest import FakeClock, SourceFactory, by_uuid

# The exporter package's own files (installed as gpuscope.exporter from exporter/).
_EXPORTER = str(Path(exporter.__file__).parent)


def _exporter_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes the exporter's own lines hold (the double's and pytest's left out)."""
    held = snapshot.filter_traces([tracemalloc.Filter(True, f"*{_EXPORTER}*")])
    return sum(stat.size for stat in held.statistics("filename"))


def _recarve(fake: FakeNvml, slices: list[FakeMigSlice], n: int) -> list[FakeMigSlice]:
    """Destroy the GPU's slices and create two new ones, with new UUIDs (as the driver
    gives every new GPU instance), under the same GPU instance ids."""
    for old in slices:
        fake.remove_mig_slice(old)
    parent = fake.gpus[1]
    made = []
    for gi in (1, 2):
        mig = fake.add_mig_slice(
            parent, "3g.40gb", gpu_instance_id=gi, util_gpu=40, util_memory=10,
            uuid=f"MIG-{uuidlib.UUID(int=(0x5EED << 64) + n * 8 + gi)}",
        )
        mig.add_process(1000 + gi, used_memory=1 << 30)
        made.append(mig)
    return made


def test_state_of_destroyed_mig_slices_does_not_pile_up(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock, wall: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two slices re-carved every 30 s: after a warm-up longer than the retention, 600 more
    # re-carvings (1,200 slices come and go) leave the source's memory where it was (what
    # moves is the capacity of its dicts). Before, each slice kept ~110 bytes for the life
    # of the process (+120 KB here; a node re-carving 20 slices a minute, ~20 MB a week).
    caplog.set_level(logging.ERROR, logger="gpuscope.exporter.sources.nvml")  # (records held)
    source = make_source(mig_layout_interval_seconds=10.0)
    slices = _recarve(fake, [], 0)
    source.sample()

    def churn(first: int, last: int) -> None:
        nonlocal slices
        for n in range(first, last):
            slices = _recarve(fake, slices, n)
            mono.advance(30.0)  # the round re-reads the layout first: the new slices
            wall.advance(30.0)
            snap = source.sample()
            assert by_uuid(snap, slices[0].uuid).up
            assert by_uuid(snap, slices[0].uuid).busy_seconds is not None

    # Traced from the start: the slices kept for the retention (an hour by default, 120
    # re-carvings) are in both measurements, so only what outlives it counts.
    tracemalloc.start(1)
    try:
        churn(1, 3600 // 30 + 10)
        gc.collect()
        before = _exporter_bytes(tracemalloc.take_snapshot())
        churn(130, 730)
        gc.collect()
        after = _exporter_bytes(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    assert after - before < 32 * 1024, f"{after - before} bytes more after 1,200 slices"


def test_a_slice_back_within_the_retention_keeps_its_counters(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock, wall: FakeClock
) -> None:
    # A slice absent from a few layout reads (a transient answer) and back under its UUID
    # continues its counters, never from 0.
    parent = fake.gpus[1]
    mig = fake.add_mig_slice(parent, "3g.40gb", gpu_instance_id=1, util_gpu=80, util_memory=10,
                             busy_samples_supported=False)
    source = make_source(mig_layout_interval_seconds=10.0)
    source.sample()
    for _ in range(4):
        mono.advance(5.0)
        wall.advance(5.0)
        snap = source.sample()
    before = by_uuid(snap, mig.uuid).busy_seconds
    assert before is not None and before > 0
    fake.remove_mig_slice(mig)
    mono.advance(30.0)
    wall.advance(30.0)
    assert not any(d.uuid == mig.uuid for d in source.sample().devices)
    back = fake.add_mig_slice(parent, "3g.40gb", gpu_instance_id=1, util_gpu=80, util_memory=10,
                              busy_samples_supported=False, uuid=mig.uuid)
    for _ in range(3):
        mono.advance(5.0)
        wall.advance(5.0)
        snap = source.sample()
    after = by_uuid(snap, back.uuid).busy_seconds
    assert after is not None and after >= before

    # Gone for longer than the retention (an hour by default), it is forgotten: back, it
    # is a new device to the source and its counters start again.
    fake.remove_mig_slice(back)
    for _ in range(3600 // 10 + 2):
        mono.advance(10.0)
        wall.advance(10.0)
        source.sample()
    fake.add_mig_slice(parent, "3g.40gb", gpu_instance_id=1, util_gpu=80, util_memory=10,
                       busy_samples_supported=False, uuid=mig.uuid)
    mono.advance(10.0)
    wall.advance(10.0)
    assert by_uuid(source.sample(), mig.uuid).busy_seconds == 0.0

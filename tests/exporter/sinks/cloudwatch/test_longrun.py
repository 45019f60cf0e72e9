"""The CloudWatch sink over weeks on a busy node: what it keeps stays bounded while MIG slices
(a new UUID each) and pods come and go, and while CloudWatch cannot be reached for hours."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from gpuscope import exporter
from gpuscope.exporter.model import DeviceSample
from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink
from gpuscope.exporter.sinks.cloudwatch.aggregate import Datum
from tests.exporter.sinks.cloudwatch.helpers import (
    GIB,
    FakeClock,
    FakeCloudWatch,
    fake_sink,
    gpu,
    snapshot,
)

T0 = 1_700_000_000.0  # a minute boundary
# The exporter package's own files (installed as gpuscope.exporter from exporter/).
_EXPORTER = str(Path(exporter.__file__).parent)


def exporter_bytes_growth(run: Callable[[int, int], None], warm: int, measured: int) -> int:
    """Bytes the exporter's own lines hold more after ``run`` over ``measured`` rounds than
    after ``warm`` rounds before them, all traced."""
    tracemalloc.start(1)
    try:
        only = [tracemalloc.Filter(True, f"*{_EXPORTER}*")]
        run(0, warm)
        gc.collect()
        before = tracemalloc.take_snapshot().filter_traces(only)
        run(warm, warm + measured)
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(only)
    finally:
        tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename"))


class CountingCloudWatch(FakeCloudWatch):
    """Counts what it is sent and keeps none of it (the datums are the exporter's)."""

    sent: int = 0

    def put_metric_data(self, Namespace: str, MetricData: list[Datum]) -> None:
        self.calls += 1
        error = self.fail(self.calls)
        if error is not None:
            raise error
        self.sent += len(MetricData)


def mig_slice(index: str, n: int) -> DeviceSample:
    """A MIG slice as the source reports it; ``n`` makes its UUID (a new one per slice)."""
    return DeviceSample(
        index=index, uuid=f"MIG-{n:08x}-0000-0000-0000-000000000000", model="A100",
        architecture="Ampere", parent_uuid=gpu(1, None).uuid, mig_profile="3g.40gb",
        memory_used_bytes=GIB, memory_total_bytes=40 * GIB, utilization_ratio=0.5,
        sm_active_seconds=float(n),
    )


def feed(sink: CloudWatchSink, clock: FakeClock, devices: Callable[[int], list[DeviceSample]],
         ) -> Callable[[int, int], None]:
    """Rounds every 10 s (the sink's interval 60 s), each with ``devices(round)``; the sink
    flushes every 10 minutes (its record of its last 512 requests fills slowly)."""
    def run(first: int, last: int) -> None:
        for n in range(first, last):
            clock.advance(10.0)
            sink(snapshot(clock.t, devices(n)))
            if n % 60 == 0:
                sink.tick()
    return run


def test_state_per_device_does_not_pile_up_as_mig_slices_come_and_go() -> None:
    # Two slices re-carved every round (a new UUID each): 3,000 rounds, 6,000 slices. Each
    # UUID's last GPM counters were kept for the life of the process (+0.86 MB here).
    clock, client = FakeClock(T0), CountingCloudWatch()
    sink = fake_sink(clock, client)
    whole = gpu(0, 0.5)
    run = feed(sink, clock,
               lambda n: [whole, mig_slice("1/1", 2 * n), mig_slice("1/2", 2 * n + 1)])
    growth = exporter_bytes_growth(run, warm=400, measured=3000)
    assert growth < 32 * 1024, f"{growth} bytes more after 6,000 slices"
    assert client.sent and sink.stats().dropped["rejected"] == 0

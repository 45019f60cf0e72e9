"""The CloudWatch sink over weeks on a busy node: what it keeps stays bounded while MIG slices
(a new UUID each) and pods come and go, and while CloudWatch cannot be reached for hours."""

from __future__ import annotations

import gc
import logging
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuscope import exporter
from gpuscope.exporter.kubernetes.attribution import Attribution
from gpuscope.exporter.model import DeviceSample
from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink, Identity
from gpuscope.exporter.sinks.cloudwatch.aggregate import Datum
from tests.exporter.sinks.cloudwatch.helpers import (
    GIB,
    FakeClock,
    FakeCloudWatch,
    attribution,
    client_error,
    fake_sink,
    gpu,
    snapshot,
    usage,
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


def test_memory_is_flat_through_pod_churn_and_an_outage_of_hours(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A CI node: a new pod every round (10 s), each in the pod rollups under its own
    # dimension sets, for 4 hours while CloudWatch cannot be reached (the buffer stays
    # full, dropping its oldest interval each minute). Every pod's Dimensions list was
    # cached for the life of the process, up to 16,384 of them (~1 KB a pod, +1.5 MB here;
    # 17.6 MB in all, which a node starting a pod every 5 s reaches within a day).
    # (Records not made: pytest would hold each retry's, and through its exception the
    # request's datums.)
    caplog.set_level(logging.ERROR, logger="gpuscope.exporter.sinks.cloudwatch")
    clock, client = FakeClock(T0), CountingCloudWatch()
    client.fail = lambda n: client_error("InternalFailure", 500)
    latest: list[Attribution] = []
    sink = fake_sink(clock, client, identity=Identity(host="node-a", cluster_name="prod"),
                     attribution_of=lambda: latest[-1] if latest else None,
                     retry_max_seconds=60.0)
    whole = gpu(0, 0.5)

    def devices(n: int) -> list[DeviceSample]:
        latest[:] = [attribution(clock.t, [
            usage("ci", f"runner-{k:06d}-abcde", whole.uuid, 0.1, GIB) for k in (n, n + 1)
        ])]
        return [whole]

    growth = exporter_bytes_growth(feed(sink, clock, devices), warm=400, measured=1500)
    stats = sink.stats()
    assert stats.datums_sent == 0 and stats.dropped["buffer_full"] > 0
    assert growth < 64 * 1024, f"{growth} bytes more after 1,500 pods"

"""The sink's own logic on a fake clock and a fake client: intervals, buffer order and bound,
backoff, rejected requests, shutdown flush, dry run, self-metrics."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.metrics import METRICS
from gpuscope.exporter.model import Snapshot
from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink, Identity, SinkSettings
from gpuscope.exporter.sinks.cloudwatch.aggregate import Datum
from gpuscope.exporter.sinks.cloudwatch.batching import request_problems
from gpuscope.exporter.sinks.cloudwatch.publish import PublishError
from gpuscope.exporter.sinks.prometheus.collectors.cloudwatch import CloudWatchCollector
from tests.exporter.sinks.cloudwatch.helpers import (
    FakeClock,
    FakeCloudWatch,
    client_error,
    fake_sink,
    gpu,
    snapshot,
)

T0 = 1_784_000_040.0  # a minute boundary (2026-07-14T03:34:00Z)
UTIL = "nvidia_smi_utilization_gpu"


def feed_interval(sink: CloudWatchSink, clock: FakeClock, values: list[float],
                  interval: float = 60.0) -> None:
    """One sample per second of one interval, GPU 0 at ``values`` (ratios), then the
    clock moves past the interval's end and the flush loop runs once."""
    start = clock.t
    for i, v in enumerate(values):
        sink(snapshot(start + i, [gpu(0, v)]))
    clock.advance(interval + 2.5)  # past the end plus the close grace
    sink.tick()
    clock.t = start + interval  # the next interval starts on its boundary


def util_values(client: FakeCloudWatch) -> list[tuple[float, dict[float, float]]]:
    """(timestamp, {value: count}) of every utilization datum sent, in send order."""
    out = []
    for d in client.datums:
        if d["MetricName"] == UTIL:
            out.append((d["Timestamp"].timestamp(),
                        dict(zip(d["Values"], d["Counts"], strict=True))))
    return out


def test_one_request_per_interval_with_exact_values() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    sink = fake_sink(clock, client)
    values = [0.25] * 59 + [1.0]  # a one-second spike
    feed_interval(sink, clock, values)
    assert len(client.requests) == 1
    assert util_values(client) == [(T0, {25.0: 59.0, 100.0: 1.0})]
    stats = sink.stats()
    assert stats.requests == 1 and stats.failures == 0 and stats.buffered == 0
    assert stats.datums_sent == len(client.datums)
    assert stats.last_success_timestamp == T0 + 62.5
    assert all(request_problems("CWAgent", batch, "json") == []
               for _, batch in client.requests)


def test_nothing_is_sent_before_the_interval_is_over() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    sink = fake_sink(clock, client)
    sink(snapshot(T0 + 1, [gpu(0, 0.5)]))
    clock.t = T0 + 60.5  # over, but within the 2 s grace for the sampler's last round
    sink(snapshot(T0 + 59.9, [gpu(0, 0.75)]))
    delay = sink.tick()
    assert client.requests == [] and 0 < delay <= 1.5
    clock.t = T0 + 62.0
    sink.tick()
    assert util_values(client) == [(T0, {50.0: 1.0, 75.0: 1.0})]


def test_throttling_keeps_data_and_sends_it_in_order_later() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    client.fail = lambda n: client_error("Throttling", 400) if n <= 3 else None
    sink = fake_sink(clock, client, retry_base_seconds=1.0, retry_max_seconds=30.0)
    for k in range(3):
        feed_interval(sink, clock, [0.1 * (k + 1)] * 60)
    assert client.requests == [] and sink.stats().failures == 3
    assert sink.stats().buffered > 0
    feed_interval(sink, clock, [0.5] * 60)
    got = util_values(client)
    assert [t for t, _ in got] == [T0, T0 + 60, T0 + 120, T0 + 180]  # in order
    assert [v for _, v in got] == [{10.0: 60.0}, {20.0: 60.0}, {30.0: 60.0}, {50.0: 60.0}]
    assert len(client.requests) == 1  # four intervals packed into one request
    stats = sink.stats()
    assert stats.dropped["buffer_full"] == 0 and stats.buffered == 0


def test_backoff_is_exponential_with_jitter_and_capped() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    client.fail = lambda n: client_error("ServiceUnavailable", 503)
    jitter = iter([0.0, 0.0, 1.0, 0.0, 1.0, 0.5] + [0.0] * 20)  # first: the flush offset
    sink = CloudWatchSink(
        SinkSettings(retry_base_seconds=2.0, retry_max_seconds=10.0, flush_spread_seconds=0),
        Identity(host="h"), client_factory=lambda: client, clock=clock.time,
        monotonic=clock.monotonic, sleep=clock.sleep, random=lambda: next(jitter),
    )
    sink(snapshot(T0, [gpu(0, 0.5)]))
    clock.t = T0 + 63
    delays = []
    for _ in range(5):
        delays.append(sink.tick())
        clock.mono += 100  # long enough for any backoff: the next tick retries
    # base 2 s doubling (2, 4, 8, 10 cap, 10), each times (0.5 + 0.5 * random)
    assert client.calls == 5
    assert delays[:4] == pytest.approx([1.0, 4.0, 4.0, 10.0])
    assert delays[4] == pytest.approx(7.5)


def test_no_retry_before_the_backoff_is_over() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    client.fail = lambda n: client_error("Throttling", 400)
    sink = fake_sink(clock, client, retry_base_seconds=5.0)
    sink(snapshot(T0, [gpu(0, 0.5)]))
    clock.t = T0 + 63
    sink.tick()
    clock.mono += 1.0
    sink.tick()
    assert client.calls == 1
    clock.mono += 2.0  # 2.5 s (5 s * 0.5 with random 0) have passed
    sink.tick()
    assert client.calls == 2


def test_buffer_bound_drops_the_oldest_intervals_and_counts_them() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    outage = True
    client.fail = lambda n: client_error("InternalFailure", 500) if outage else None
    sink = fake_sink(clock, client, buffer_seconds=180.0, retry_max_seconds=1.0)
    per_interval = 0
    for k in range(5):
        feed_interval(sink, clock, [0.1 * (k + 1)] * 60)
        if k == 0:
            per_interval = sink.stats().buffered
    stats = sink.stats()
    assert stats.buffered == 3 * per_interval
    assert stats.dropped["buffer_full"] == 2 * per_interval
    outage = False
    clock.mono += 10
    sink.tick()
    got = util_values(client)
    assert [t for t, _ in got] == [T0 + 120, T0 + 180, T0 + 240]
    assert sink.stats().datums_sent == 3 * per_interval


class RefusingCloudWatch(FakeCloudWatch):
    """Refuses, as CloudWatch does, a whole request that holds one datum ``refuse`` says
    it does not take."""

    def __init__(self, refuse: Callable[[Datum], bool]) -> None:
        super().__init__()
        self.refuse = refuse
        self.sizes: list[int] = []

    def put_metric_data(self, Namespace: str, MetricData: list[Datum]) -> None:
        self.calls += 1
        self.sizes.append(len(MetricData))
        if any(self.refuse(d) for d in MetricData):
            raise client_error("InvalidParameterValue", 400)
        self.requests.append((Namespace, list(MetricData)))


def test_a_refused_datum_is_dropped_alone_and_not_retried() -> None:
    clock = FakeClock(T0)
    client = RefusingCloudWatch(lambda d: d["MetricName"] == "nvidia_smi_power_draw")
    sink = fake_sink(clock, client)
    feed_interval(sink, clock, [0.5] * 10)
    stats = sink.stats()
    per_interval = len(sink._observer.observe(snapshot(T0, [gpu(0, 0.5)]), None))
    assert stats.dropped["rejected"] == 1 and stats.buffered == 0
    assert stats.datums_sent == per_interval - 1
    assert "nvidia_smi_power_draw" not in {d["MetricName"] for d in client.datums}
    assert client.calls <= 2 * 4 + 1  # halving 9 datums, not one request each
    calls = client.calls
    client.refuse = lambda d: False
    feed_interval(sink, clock, [0.75] * 10)
    assert client.calls == calls + 1  # nothing refused is sent again
    assert util_values(client)[-1] == (T0 + 60, {75.0: 10.0})


def test_everything_refused_costs_a_bounded_number_of_requests() -> None:
    # A node whose clock is hours off: CloudWatch refuses every datum. They are dropped and
    # counted without a request for each.
    clock = FakeClock(T0)
    client = RefusingCloudWatch(lambda d: True)
    sink = fake_sink(clock, client, identity=Identity(host="h", cluster_name="c"))
    for _ in range(3):
        sink(snapshot(clock.t, [gpu(g, 0.5) for g in range(8)]))
        clock.advance(60)
    clock.advance(2.5)
    sink.tick()
    stats = sink.stats()
    assert stats.buffered == 0 and stats.datums_sent == 0
    assert stats.dropped["rejected"] > 200
    assert client.calls <= 10 + 8 + 1


def test_network_errors_are_retried() -> None:
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    clock, client = FakeClock(T0), FakeCloudWatch()
    errors = {1: EndpointConnectionError(endpoint_url="http://x"), 2: NoCredentialsError(),
              3: client_error("AccessDenied", 403)}
    client.fail = errors.get
    sink = fake_sink(clock, client, retry_max_seconds=1.0)
    for _ in range(4):
        feed_interval(sink, clock, [0.5] * 5)
    assert sink.stats().dropped["rejected"] == 0
    assert [t for t, _ in util_values(client)] == [T0, T0 + 60, T0 + 120, T0 + 180]


def test_shutdown_flushes_the_open_interval() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    sink = fake_sink(clock, client)
    sink(snapshot(T0 + 5, [gpu(0, 0.5)]))
    sink(snapshot(T0 + 6, [gpu(0, 1.0)]))
    sink.stop()
    assert util_values(client) == [(T0, {50.0: 1.0, 100.0: 1.0})]


def test_shutdown_is_bounded_and_counts_what_is_left() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    client.fail = lambda n: client_error("Throttling", 400)
    sink = fake_sink(clock, client, shutdown_timeout=5.0, retry_base_seconds=1.0)
    sink(snapshot(T0 + 5, [gpu(0, 0.5)]))
    buffered = len(sink._observer.observe(snapshot(T0 + 5, [gpu(0, 0.5)]), None))
    sink.stop()
    assert sum(clock.slept) <= 5.0 and client.calls >= 3
    stats = sink.stats()
    assert stats.dropped["shutdown"] == buffered and stats.buffered == 0


def test_flush_thread_sends_on_its_own_and_stops_promptly() -> None:
    client = FakeCloudWatch()
    sink = CloudWatchSink(SinkSettings(interval=0.2, flush_spread_seconds=0.0),
                          Identity(host="h"), client_factory=lambda: client)
    sink.start()
    try:
        deadline = time.monotonic() + 5
        while not client.requests and time.monotonic() < deadline:
            sink(Snapshot(timestamp=time.time(), source_up=True, devices=(gpu(0, 0.5),)))
            time.sleep(0.02)
        assert client.requests
    finally:
        started = time.monotonic()
        sink.stop()
        assert time.monotonic() - started < 2.0
    assert not any(t.name == "gpuscope-cloudwatch" for t in threading.enumerate())


def test_listener_never_sends() -> None:
    # The sampler thread calls the listener every round (8 GPUs, both dimension sets): it
    # only adds to the open interval, and sending is the flush loop's, so a slow or hung
    # CloudWatch never holds a sampling round. (Its cost per call: bench/hot_paths.py.)
    clock, client = FakeClock(T0), FakeCloudWatch()
    sink = fake_sink(clock, client, identity=Identity(host="h", cluster_name="c",
                                                      instance_type="p4d.24xlarge"))
    for i in range(120):  # two whole intervals, the clock never past their close
        clock.t = T0 + i
        sink(snapshot(T0 + i, [gpu(g, (i % 7) / 7) for g in range(8)]))
    assert client.calls == 0
    clock.advance(62.5)
    sink.tick()
    assert client.calls >= 1
    sent = {d["Timestamp"].timestamp() for d in client.datums if d["MetricName"] == UTIL}
    assert sent == {T0, T0 + 60}


def test_dry_run_prints_json_lines_without_a_client() -> None:
    clock, out = FakeClock(T0), io.StringIO()
    sink = CloudWatchSink(SinkSettings(dry_run=True, flush_spread_seconds=0.0),
                          Identity(host="h"), out=out, clock=clock.time,
                          monotonic=clock.monotonic, random=lambda: 0.0)
    sink(snapshot(T0 + 1, [gpu(0, 0.5)]))
    clock.t = T0 + 63
    sink.tick()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    util = next(d for d in lines if d["MetricName"] == UTIL)
    assert util == {
        "Namespace": "CWAgent", "MetricName": UTIL,
        "Dimensions": [{"Name": "host", "Value": "h"}, {"Name": "index", "Value": "0"},
                       {"Name": "name", "Value": "NVIDIA A100-SXM4-80GB"},
                       {"Name": "arch", "Value": "Ampere"}],
        "Timestamp": "2026-07-14T03:34:00Z", "Values": [50.0], "Counts": [1.0],
    }
    assert sink.stats().datums_sent == len(lines)


def test_client_factory_is_required_unless_dry_run() -> None:
    with pytest.raises(ValueError, match="client_factory"):
        CloudWatchSink(SinkSettings(), Identity(host="h"))


def test_self_metrics() -> None:
    clock, client = FakeClock(T0), FakeCloudWatch()
    def fail(n: int) -> Exception | None:
        return client_error("Throttling", 400) if n == 1 else None

    client.fail = fail
    sink = fake_sink(clock, client)
    feed_interval(sink, clock, [0.5] * 3)
    feed_interval(sink, clock, [0.5] * 3)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CloudWatchCollector(sink.stats))
    from prometheus_client import generate_latest

    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    stats = sink.stats()
    assert samples[("gpu_exporter_cloudwatch_datums_sent_total", ())] == stats.datums_sent
    assert samples[("gpu_exporter_cloudwatch_requests_total", ())] == 2.0
    assert samples[("gpu_exporter_cloudwatch_request_failures_total", ())] == 1.0
    assert samples[("gpu_exporter_cloudwatch_datums_buffered", ())] == 0.0
    assert samples[("gpu_exporter_cloudwatch_datums_dropped_total",
                    (("reason", "buffer_full"),))] == 0.0
    assert ("gpu_exporter_cloudwatch_last_success_timestamp_seconds", ()) in samples
    names = {f.name for f in families.values()}
    documented = {s.name.removesuffix("_total") for s in METRICS.values()
                  if s.name.startswith("gpu_exporter_cloudwatch_")}
    assert names == documented


def test_publish_error_is_one_line() -> None:
    from gpuscope.exporter.sinks.cloudwatch.publish import _classify

    err = _classify(client_error("Throttling", 400))
    assert isinstance(err, PublishError) and err.retryable
    assert "\n" not in str(err) and "Throttling" in str(err)
    assert not _classify(client_error("InvalidParameterCombination", 400)).retryable
    assert _classify(client_error("InternalFailure", 500)).retryable

"""The CloudWatch sink's own health (``gpu_exporter_cloudwatch_*``), registered only when the
sink is on."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.metrics import new_family
from gpuscope.exporter.sinks.cloudwatch.sink import DROP_REASONS, SinkStats


class CloudWatchCollector(Collector):
    """Renders :meth:`CloudWatchSink.stats` at scrape time (a copy of a few counters)."""

    def __init__(self, stats: Callable[[], SinkStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        sent = new_family("gpu_exporter_cloudwatch_datums_sent_total")
        sent.add_metric([], float(stats.datums_sent))
        yield sent
        requests = new_family("gpu_exporter_cloudwatch_requests_total")
        requests.add_metric([], float(stats.requests))
        yield requests
        failures = new_family("gpu_exporter_cloudwatch_request_failures_total")
        failures.add_metric([], float(stats.failures))
        yield failures
        dropped = new_family("gpu_exporter_cloudwatch_datums_dropped_total")
        for reason in DROP_REASONS:
            dropped.add_metric([reason], float(stats.dropped.get(reason, 0)))
        yield dropped
        buffered = new_family("gpu_exporter_cloudwatch_datums_buffered")
        buffered.add_metric([], float(stats.buffered))
        yield buffered
        if stats.last_success_timestamp is not None:
            last = new_family("gpu_exporter_cloudwatch_last_success_timestamp_seconds")
            last.add_metric([], stats.last_success_timestamp)
            yield last

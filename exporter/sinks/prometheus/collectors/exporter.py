"""The exporter's own health: source up, sample freshness, per-part success and duration."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.metrics import new_family
from gpuscope.exporter.model import PartResult
from gpuscope.exporter.sampler import Sampler

PartsProvider = Callable[[], Iterable[PartResult]]


class ExporterCollector(Collector):
    """Self-metrics. ``gpu_exporter_collector_*`` has one series per part of the work: the
    parts of the last sampling round (``nvml_devices``, ``nvml_processes``, ``xid``, or
    ``simulated``) plus whatever background workers report through ``extra_parts``
    (kubelet, API server), each with its own success and duration."""

    def __init__(
        self, sampler: Sampler, extra_parts: tuple[PartsProvider, ...] = (),
        dropped_series: Callable[[], Mapping[str, int]] | None = None,
        render_errors: Callable[[], Mapping[str, int]] | None = None,
        connections_closed: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self._connections_closed = connections_closed
        self._sampler = sampler
        self._extra_parts = extra_parts
        self._dropped_series = dropped_series
        self._render_errors = render_errors

    def collect(self) -> Iterator[Metric]:
        snap = self._sampler.latest()
        nvml_up = new_family("gpu_exporter_nvml_up")
        nvml_up.add_metric([], 1.0 if snap is not None and snap.source_up else 0.0)
        yield nvml_up
        if snap is not None:
            last = new_family("gpu_exporter_last_sample_timestamp_seconds")
            last.add_metric([], snap.timestamp)
            yield last
        interval = new_family("gpu_exporter_sampling_interval_seconds")
        interval.add_metric([], self._sampler.interval)
        yield interval
        rounds = new_family("gpu_exporter_sampling_rounds_total")
        rounds.add_metric([], float(self._sampler.rounds))
        yield rounds
        missed = new_family("gpu_exporter_missed_rounds_total")
        missed.add_metric([], float(self._sampler.missed_rounds))
        yield missed
        if self._dropped_series is not None:
            dropped = new_family("gpu_exporter_series_dropped_total")
            for family, count in sorted(self._dropped_series().items()):
                dropped.add_metric([family], float(count))
            yield dropped
        if self._render_errors is not None:
            render = new_family("gpu_exporter_render_errors_total")
            for collector, count in sorted(self._render_errors().items()):
                render.add_metric([collector], float(count))
            yield render
        if self._connections_closed is not None:
            closed = new_family("gpu_exporter_http_connections_closed_total")
            for reason, count in sorted(self._connections_closed().items()):
                closed.add_metric([reason], float(count))
            yield closed

        success = new_family("gpu_exporter_collector_success")
        duration = new_family("gpu_exporter_collector_duration_seconds")
        errors = new_family("gpu_exporter_collector_errors_total")
        parts: list[PartResult] = list(snap.parts) if snap is not None else []
        for provider in self._extra_parts:
            parts.extend(provider())
        for part in parts:
            success.add_metric([part.name], 1.0 if part.success else 0.0)
            duration.add_metric([part.name], part.duration_seconds)
            errors.add_metric([part.name], float(part.errors_total))
        yield success
        yield duration
        yield errors

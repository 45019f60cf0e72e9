"""Shared pieces of the CloudWatch tests: a controllable clock, hand-built snapshots, a
recording publisher, and reading aggregates back from moto."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuscope.exporter.kubernetes.apiserver import NodeInfo
from gpuscope.exporter.kubernetes.attribution import Attribution, ContainerKey, ContainerUsage
from gpuscope.exporter.model import DeviceSample, Snapshot
from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink, Identity, SinkSettings
from gpuscope.exporter.sinks.cloudwatch.aggregate import Datum
from gpuscope.exporter.sinks.cloudwatch.publish import make_client

GIB = 1 << 30
MIB = 1 << 20
MODEL = "NVIDIA A100-SXM4-80GB"
REGION = "us-east-1"


class FakeClock:
    """Wall clock and monotonic clock the test moves by hand."""

    def __init__(self, start: float) -> None:
        self.t = start
        self.mono = 1000.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.mono += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)


def minute_start(offset_minutes: int = -10) -> float:
    """A minute boundary ``offset_minutes`` from now (moto keeps any timestamp)."""
    import time

    return (math.floor(time.time() / 60) + offset_minutes) * 60.0


def gpu(index: int, util: float | None, *, memory_used: int = 10 * GIB, **kw: Any
        ) -> DeviceSample:
    return DeviceSample(
        index=str(index), uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", model=MODEL,
        architecture="Ampere", utilization_ratio=util,
        memory_utilization_ratio=None if util is None else util / 2,
        memory_used_bytes=memory_used, memory_total_bytes=80 * GIB,
        temperature_celsius=40.0, power_watts=100.0, sm_clock_hertz=1.41e9,
        memory_clock_hertz=1.593e9, **kw,
    )


def snapshot(ts: float, devices: Sequence[DeviceSample]) -> Snapshot:
    return Snapshot(timestamp=ts, source_up=True, driver_version="550.54.15",
                    devices=tuple(devices))


def usage(namespace: str, pod: str, uuid: str, util: float | None, memory: int | None,
          container: str = "main") -> ContainerUsage:
    return ContainerUsage(ContainerKey(namespace, pod, container), uuid, True, util, memory)


def attribution(ts: float, usages: Iterable[ContainerUsage], instance_type: str = ""
                ) -> Attribution:
    return Attribution(timestamp=ts, containers=tuple(usages),
                       node=NodeInfo(instance_type=instance_type))


def client_error(code: str, status: int) -> Exception:
    """A botocore ``ClientError`` as boto3 raises it once its own retries are spent."""
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": f"{code} (test)"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutMetricData")


@dataclass
class FakeCloudWatch:
    """Stands in for the boto3 client (``put_metric_data`` and ``meta``): records every
    request; raises ``fail(call_number)`` when that returns an exception."""

    protocol: str = "json"
    requests: list[tuple[str, list[Datum]]] = field(default_factory=list)
    fail: Callable[[int], Exception | None] = lambda n: None
    calls: int = 0

    @property
    def meta(self) -> Any:
        service_model = type("ServiceModel", (), {"protocol": self.protocol})()
        return type("Meta", (), {"service_model": service_model})()

    def put_metric_data(self, Namespace: str, MetricData: list[Datum]) -> None:
        self.calls += 1
        error = self.fail(self.calls)
        if error is not None:
            raise error
        self.requests.append((Namespace, list(MetricData)))

    @property
    def datums(self) -> list[Datum]:
        return [d for _, batch in self.requests for d in batch]


def fake_sink(
    clock: FakeClock,
    client: FakeCloudWatch,
    *,
    identity: Identity | None = None,
    attribution_of: Callable[[], Attribution | None] | None = None,
    **settings: Any,
) -> CloudWatchSink:
    """A sink whose client factory returns ``client``, on the fake clock, no jitter."""
    return CloudWatchSink(
        SinkSettings(**{"flush_spread_seconds": 0.0, **settings}),
        identity or Identity(host="node-a"),
        client_factory=lambda: client,
        attribution=attribution_of, clock=clock.time, monotonic=clock.monotonic,
        sleep=clock.sleep, random=lambda: 0.0,
    )


def moto_sink(clock: FakeClock, endpoint: str, *, identity: Identity,
              attribution_of: Callable[[], Attribution | None] | None = None,
              total_attempts: int = 2, **settings: Any) -> CloudWatchSink:
    """A sink with a real boto3 client against ``endpoint`` (the proxy in front of moto)."""
    return CloudWatchSink(
        SinkSettings(**{"flush_spread_seconds": 0.0, **settings}), identity,
        client_factory=lambda: make_client(REGION, endpoint, total_attempts=total_attempts),
        attribution=attribution_of, clock=clock.time, monotonic=clock.monotonic,
        sleep=clock.sleep, random=lambda: 0.0,
    )


STATS = ("Minimum", "Maximum", "Sum", "SampleCount")


def read_aggregates(client: Any, namespace: str,
                    series: Iterable[tuple[str, tuple[tuple[str, str], ...]]],
                    start: float, end: float, period: int = 60
                    ) -> dict[tuple[str, frozenset[tuple[str, str]]], list[dict[str, float]]]:
    """``get_metric_data`` for every series and the four statistics: per series, one
    ``{stat: value}`` per period that has data, oldest first."""
    series = list(series)
    queries = []
    index: dict[str, tuple[tuple[str, frozenset[tuple[str, str]]], str]] = {}
    for i, (name, dims) in enumerate(series):
        for stat in STATS:
            qid = f"q{i}_{stat.lower()}"
            index[qid] = ((name, frozenset(dims)), stat)
            queries.append({"Id": qid, "MetricStat": {
                "Metric": {"Namespace": namespace, "MetricName": name,
                           "Dimensions": [{"Name": k, "Value": v} for k, v in dims]},
                "Period": period, "Stat": stat}})
    out: dict[tuple[str, frozenset[tuple[str, str]]], list[dict[str, float]]] = {}
    t0 = datetime.fromtimestamp(start, tz=UTC)
    t1 = datetime.fromtimestamp(end, tz=UTC) - timedelta(seconds=1)
    for i in range(0, len(queries), 400):
        result = client.get_metric_data(MetricDataQueries=queries[i:i + 400],
                                        StartTime=t0, EndTime=t1,
                                        ScanBy="TimestampAscending")
        for r in result["MetricDataResults"]:
            key, stat = index[r["Id"]]
            rows = out.setdefault(key, [])
            while len(rows) < len(r["Values"]):
                rows.append({})
            for row, value in zip(rows, r["Values"], strict=False):
                row[stat] = value
    return out


def list_all_metrics(client: Any, namespace: str, names: Iterable[str]
                     ) -> dict[tuple[str, frozenset[tuple[str, str]]], tuple[tuple[str, str], ...]]:
    """Every metric ``list_metrics`` returns for these metric names: (name, dimension set)
    -> dimensions in the order they were published.

    One call per name: moto de-duplicates stored samples against every metric found so far
    before it looks at the name, O(samples x metrics) per unfiltered call. And query moto in
    the published order: its ``Dimension.__lt__`` compares a value with a name, so its
    ``sorted(dimensions)`` match depends on the input order (CloudWatch does not care)."""
    found = {}
    paginator = client.get_paginator("list_metrics")
    for name in sorted(set(names)):
        for page in paginator.paginate(Namespace=namespace, MetricName=name):
            for m in page["Metrics"]:
                dims = tuple((d["Name"], d["Value"]) for d in m.get("Dimensions", []))
                found[(m["MetricName"], frozenset(dims))] = dims
    return found


def expected_aggregates(samples: dict[tuple[str, frozenset[tuple[str, str]]], list[float]]
                        ) -> dict[tuple[str, frozenset[tuple[str, str]]], dict[str, float]]:
    return {key: {"Minimum": min(v), "Maximum": max(v), "Sum": math.fsum(v),
                  "SampleCount": float(len(v))} for key, v in samples.items()}

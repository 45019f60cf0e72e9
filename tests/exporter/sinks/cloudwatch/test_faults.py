"""CloudWatch throttling and outages, through a fault proxy in front of moto: data within
the buffer bound arrives complete and in order; beyond it the oldest is dropped and counted."""

from __future__ import annotations

import logging
import time
from datetime import datetime

import pytest

from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink, Identity
from tests.exporter.sinks.cloudwatch.conftest import MotoServer
from tests.exporter.sinks.cloudwatch.helpers import (
    FakeClock,
    gpu,
    list_all_metrics,
    minute_start,
    moto_sink,
    read_aggregates,
    snapshot,
)
from tests.exporter.sinks.cloudwatch.wire import WireProxy, WireRequest

UTIL = "nvidia_smi_utilization_gpu"
IDENTITY = Identity(host="node-f")


def play_interval(sink: CloudWatchSink, clock: FakeClock, k: int) -> None:
    """Interval ``k``: six rounds with GPU 0 at 10k+1 … 10k+6 percent, GPU 1 at 50 %,
    then the flush loop runs once the interval is over."""
    start = clock.t
    for i in range(6):
        sink(snapshot(start + 10 * i + 0.5, [gpu(0, (10 * k + i + 1) / 100), gpu(1, 0.5)]))
    clock.advance(62.5)
    sink.tick()
    clock.t = start + 60


def util_series(moto: MotoServer) -> tuple[tuple[str, str], ...]:
    listed = list_all_metrics(moto.client(), "CWAgent", [UTIL])
    return next(dims for (name, _), dims in listed.items() if ("index", "0") in dims)


def test_throttling_and_503_lose_nothing_within_the_bound_and_keep_order(
    moto: MotoServer, proxy: WireProxy, caplog: pytest.LogCaptureFixture
) -> None:
    healthy = False

    def plan(req: WireRequest) -> str:
        if healthy:
            return "pass"
        # The first three attempts are throttled, then the service is down (503).
        return "throttle" if len(proxy.put_requests()) < 3 else "503"

    proxy.plan = plan
    t0 = minute_start(-20)
    clock = FakeClock(t0)
    sink = moto_sink(clock, proxy.url, identity=IDENTITY, total_attempts=2,
                     retry_base_seconds=1.0, retry_max_seconds=30.0)
    caplog.set_level(logging.WARNING, "gpuscope.exporter.sinks.cloudwatch")
    for k in range(3):
        play_interval(sink, clock, k)
    stats = sink.stats()
    assert stats.failures == 3 and stats.datums_sent == 0 and stats.buffered > 0
    failed = proxy.put_requests(ok=False)
    assert [r.status for r in failed] == [400, 400, 400, 503, 503, 503]
    assert [r.attempt for r in failed] == [1, 2, 1, 2, 1, 2]  # botocore retried each call
    assert "HTTP 400 Throttling" in caplog.text  # botocore parsed our error body

    healthy = True
    play_interval(sink, clock, 3)
    ok = proxy.put_requests(ok=True)
    assert len(ok) == 1  # the backlog of four intervals fits one request
    timestamps = [d["Timestamp"] for d in ok[0].datums]
    assert timestamps == sorted(timestamps)  # oldest first
    stats = sink.stats()
    assert stats.buffered == 0 and sum(stats.dropped.values()) == 0
    assert stats.datums_sent == len(ok[0].datums) and stats.requests == 4

    dims = util_series(moto)
    got = read_aggregates(moto.client(), "CWAgent", [(UTIL, dims)], t0, t0 + 240)
    assert got[(UTIL, frozenset(dims))] == [
        {"Minimum": 10.0 * k + 1, "Maximum": 10.0 * k + 6, "Sum": 60.0 * k + 21,
         "SampleCount": 6.0} for k in range(4)]


def test_beyond_the_bound_the_oldest_is_dropped_and_counted(
    moto: MotoServer, proxy: WireProxy
) -> None:
    healthy = False
    proxy.plan = lambda req: "pass" if healthy else "503"
    t0 = minute_start(-20)
    clock = FakeClock(t0)
    # Two intervals of buffer; no botocore retries here (the test above covers them).
    sink = moto_sink(clock, proxy.url, identity=IDENTITY, total_attempts=1,
                     buffer_seconds=120.0, retry_max_seconds=1.0)
    per_interval = []
    for k in range(4):
        before = sink.stats()
        play_interval(sink, clock, k)
        after = sink.stats()
        per_interval.append(after.buffered - before.buffered
                            + after.dropped["buffer_full"] - before.dropped["buffer_full"])
    stats = sink.stats()
    assert stats.dropped["buffer_full"] == per_interval[0] + per_interval[1]
    assert stats.buffered == per_interval[2] + per_interval[3]

    healthy = True
    clock.mono += 5.0  # past the backoff
    sink.tick()
    stats = sink.stats()
    assert stats.buffered == 0 and stats.datums_sent == per_interval[2] + per_interval[3]
    dims = util_series(moto)
    got = read_aggregates(moto.client(), "CWAgent", [(UTIL, dims)], t0, t0 + 240)
    # Intervals 0 and 1 are gone; 2 and 3 arrived whole.
    assert [row["Minimum"] for row in got[(UTIL, frozenset(dims))]] == [21.0, 31.0]
    assert [row["SampleCount"] for row in got[(UTIL, frozenset(dims))]] == [6.0, 6.0]
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuscope.exporter.sinks.prometheus.collectors.cloudwatch import CloudWatchCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CloudWatchCollector(sink.stats))
    text = generate_latest(registry).decode()
    assert (f'gpu_exporter_cloudwatch_datums_dropped_total{{reason="buffer_full"}} '
            f"{float(per_interval[0] + per_interval[1])}") in text


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_the_proxy_speaks_each_protocols_error_format(protocol: str) -> None:
    # What botocore's own response parser makes of the proxy's Throttling answer, for the
    # protocol this botocore speaks (json) and the one older botocore spoke (query).
    from botocore.parsers import create_parser

    from tests.exporter.sinks.cloudwatch.wire import error_response

    status, headers, body = error_response(protocol, 400, "Throttling", "Rate exceeded")
    parsed = create_parser(protocol).parse(
        {"status_code": status, "headers": headers, "body": body}, None)
    assert parsed["Error"]["Code"] == "Throttling"
    assert parsed["Error"]["Message"] == "Rate exceeded"


def _wire_timestamp(datum: dict[str, object]) -> float:
    value = datum["Timestamp"]
    if isinstance(value, int | float):  # json: epoch seconds
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()  # query


def test_a_refused_datum_does_not_take_the_good_ones_with_it(
    moto: MotoServer, proxy: WireProxy, caplog: pytest.LogCaptureFixture
) -> None:
    # CloudWatch refuses a whole request for one datum it does not take: here a timestamp
    # more than two hours ahead (moto checks none; the proxy does, as CloudWatch would).
    def plan(req: WireRequest) -> str:
        late = time.time() + 2 * 3600
        return "reject" if any(_wire_timestamp(d) > late for d in req.datums) else "pass"

    proxy.plan = plan
    t0 = minute_start(-5)
    clock = FakeClock(t0 + 3 * 3600)  # the node's clock runs three hours ahead…
    sink = moto_sink(clock, proxy.url, identity=IDENTITY, total_attempts=1)
    caplog.set_level(logging.WARNING, "gpuscope.exporter.sinks.cloudwatch")
    sink(snapshot(clock.t + 0.5, [gpu(0, 0.875), gpu(1, 0.5)]))
    clock.t = t0  # … until NTP steps it back
    for i in range(6):
        sink(snapshot(t0 + 10 * i + 0.5, [gpu(0, 0.25), gpu(1, 0.5)]))
    sink.stop()  # SIGTERM: both open intervals are flushed together

    dims = util_series(moto)
    got = read_aggregates(moto.client(), "CWAgent", [(UTIL, dims)], t0, t0 + 60)
    assert got[(UTIL, frozenset(dims))] == [
        {"Minimum": 25.0, "Maximum": 25.0, "Sum": 150.0, "SampleCount": 6.0}]
    stats = sink.stats()
    refused = [d for r in proxy.put_requests(ok=False) for d in r.datums]
    sent = [d for r in proxy.put_requests(ok=True) for d in r.datums]
    assert all(_wire_timestamp(d) == t0 for d in sent)
    per_interval = len(sent)
    # Only the three-hours-ahead interval's datums are dropped, and counted.
    assert stats.dropped["rejected"] == per_interval and stats.datums_sent == per_interval
    assert stats.buffered == 0 and stats.dropped["shutdown"] == 0
    assert {_wire_timestamp(d) for d in refused} >= {t0 + 3 * 3600}
    assert "rejected" in caplog.text

"""CloudWatch faults: a 10-minute throttle (on a fast-forwarded clock, so it runs in
seconds), and SIGTERM while a PutMetricData call is in flight.

The throttle runs the real sink and the real boto3 client against a real moto server,
through the recording fault proxy of ``tests/exporter/sinks/cloudwatch`` (``wire.py``); only the
clocks are the test's. Sampling rounds and the flush thread's wake-ups are replayed in
time order on that clock, as the two threads would run them. The SIGTERM cases run a real
``gpuscope-exporter --cloudwatch`` process (and, for a call that never returns, the sink
with its own flush thread in-process). Every wait is bounded.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import pairwise

import pytest

from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink, Identity, SinkSettings
from gpuscope.exporter.sinks.prometheus.collectors.cloudwatch import CloudWatchCollector
from tests.conftest import ExporterProcess
from tests.exporter.sinks.cloudwatch.conftest import MotoServer
from tests.exporter.sinks.cloudwatch.conftest import aws_env as aws_env  # autouse fixture
from tests.exporter.sinks.cloudwatch.helpers import (
    FakeClock,
    FakeCloudWatch,
    gpu,
    list_all_metrics,
    minute_start,
    moto_sink,
    read_aggregates,
    snapshot,
)
from tests.exporter.sinks.cloudwatch.wire import WireProxy, WireRequest, wait_until

UTIL = "nvidia_smi_utilization_gpu"
INTERVAL = 60.0
SAMPLE_EVERY = 10.0  # six rounds per interval keep moto's work small; the logic is the same
THROTTLED_INTERVALS = 11  # intervals closed while throttled: their flushes span > 10 min
INTERVALS = THROTTLED_INTERVALS + 2


def percent(k: int, i: int) -> float:
    """GPU 0's utilization (percent) in round ``i`` of interval ``k``: distinct per
    interval, and multiples of 1/8, so sums are exact in any order."""
    return k + (i + 1) / 8


class Node:
    """Replays the sampler (a round every SAMPLE_EVERY s) and the sink's flush thread (woken
    after the delay each tick() returns) on a fake clock, in time order."""

    def __init__(self, sink: CloudWatchSink, clock: FakeClock) -> None:
        self.sink = sink
        self.clock = clock
        self.t0 = clock.t
        self.next_round = clock.t + 0.5
        self.next_tick = clock.t
        self.peak_buffered = 0

    def run_until(self, end: float) -> None:
        while min(self.next_round, self.next_tick) <= end:
            if self.next_round <= self.next_tick:
                self.clock.advance(self.next_round - self.clock.t)
                k, i = divmod(int((self.next_round - self.t0) // SAMPLE_EVERY), 6)
                self.sink(snapshot(self.next_round, [gpu(0, percent(k, i) / 100),
                                                     gpu(1, 0.5)]))
                self.next_round += SAMPLE_EVERY
            else:
                self.clock.advance(self.next_tick - self.clock.t)
                self.next_tick += self.sink.tick()
                self.peak_buffered = max(self.peak_buffered, self.sink.stats().buffered)


def util_series(moto: MotoServer) -> tuple[tuple[str, str], ...]:
    listed = list_all_metrics(moto.client(), "CWAgent", [UTIL])
    return next(dims for (name, _), dims in listed.items() if ("index", "0") in dims)


@pytest.mark.parametrize("buffer_seconds", [1800.0, 180.0], ids=["buffer-1800s", "buffer-180s"])
def test_ten_minute_throttle(
    moto: MotoServer, proxy: WireProxy, buffer_seconds: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    t0 = minute_start(-20)
    clock = FakeClock(t0)
    throttle_end = t0 + THROTTLED_INTERVALS * INTERVAL + 5.0
    attempts: list[tuple[float, str]] = []  # (fake time, what the proxy did)

    def plan(req: WireRequest) -> str:
        fault = "throttle" if clock.t < throttle_end else "pass"
        attempts.append((clock.t, fault))
        return fault

    proxy.plan = plan
    # The CLI's settings (retry 1 s doubling to 60 s, --cloudwatch-buffer), but no botocore
    # retries inside a call: those sleep on the real clock (the in-call retries are covered
    # by tests/exporter/sinks/cloudwatch/test_faults.py).
    sink = moto_sink(clock, proxy.url, identity=Identity(host="node-t"), total_attempts=1,
                     buffer_seconds=buffer_seconds)
    caplog.set_level(logging.WARNING, "gpuscope.exporter.sinks.cloudwatch")
    node = Node(sink, clock)
    node.run_until(throttle_end)
    throttled = sink.stats()
    per_interval = len(proxy.put_requests(ok=False)[0].datums)
    node.run_until(t0 + INTERVALS * INTERVAL + 15.0)

    # The throttle lasted over ten minutes of fake time; the sink retried throughout, on
    # its own backoff (1, 2, 4 ... capped at 60 s, times a jitter of 0.5 here), never
    # in a loop and never giving up.
    failed = [t for t, fault in attempts if fault == "throttle"]
    assert failed[-1] - failed[0] >= 600.0
    gaps = [b - a for a, b in pairwise(failed)]
    assert min(gaps) >= 0.5 and max(gaps) <= 60.0, gaps
    assert len(failed) <= 40
    assert throttled.failures == len(failed) and throttled.datums_sent == 0

    stats = sink.stats()
    assert stats.buffered == 0 and stats.dropped["rejected"] == stats.dropped["shutdown"] == 0
    ok = proxy.put_requests(ok=True)
    sent = [d for r in ok for d in r.datums]
    timestamps = [d["Timestamp"] for d in sent]
    assert timestamps == sorted(timestamps)  # oldest first, across requests too
    dims = util_series(moto)
    got = read_aggregates(moto.client(), "CWAgent", [(UTIL, dims)], t0,
                          t0 + INTERVALS * INTERVAL)[(UTIL, frozenset(dims))]
    expected = [{"Minimum": k + 1 / 8, "Maximum": k + 6 / 8, "Sum": 6 * k + 21 / 8,
                 "SampleCount": 6.0} for k in range(INTERVALS)]

    kept = int(buffer_seconds // INTERVAL)
    if kept >= THROTTLED_INTERVALS:
        # Nothing lost: every interval arrived, later, whole and in order.
        assert got == expected
        assert stats.dropped["buffer_full"] == 0
        assert node.peak_buffered == THROTTLED_INTERVALS * per_interval
        assert len(ok) <= 3  # the backlog went out packed, not one request per interval
    else:
        # Only the newest `kept` intervals fit: the older ones were dropped, oldest first,
        # and counted (self-metric and log); the rest arrived whole.
        lost = THROTTLED_INTERVALS - kept
        assert got == expected[lost:]
        assert stats.dropped["buffer_full"] == lost * per_interval
        text = collect_text(sink)
        assert (f'gpu_exporter_cloudwatch_datums_dropped_total{{reason="buffer_full"}} '
                f"{float(lost * per_interval)}") in text
        drops = [r.getMessage() for r in caplog.records if "buffer full" in r.getMessage()]
        starts = [float(m.rsplit(" ", 1)[1]) for m in drops]
        assert starts == [t0 + k * INTERVAL for k in range(lost)]


def collect_text(sink: CloudWatchSink) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CloudWatchCollector(sink.stats))
    return generate_latest(registry).decode()


# ---------------------------------------------------------------------------------------------
# SIGTERM during a flush


def test_sigterm_while_put_metric_data_is_in_flight(
    moto: MotoServer, proxy: WireProxy, start_exporter: Callable[..., ExporterProcess]
) -> None:
    slow = threading.Event()
    in_flight = threading.Event()
    delay = 2.0

    def plan(req: WireRequest) -> str:
        if slow.is_set():
            in_flight.set()
            time.sleep(delay)  # CloudWatch answers, but slowly
        return "pass"

    proxy.plan = plan
    exp = start_exporter(
        "--source", "simulated", "--interval", "0.2", "--cloudwatch",
        "--cloudwatch-endpoint-url", proxy.url, "--cloudwatch-region", "us-east-1",
        "--cloudwatch-interval", "1", "--node-name", "node-sigterm",
    )
    wait_until(lambda: len(proxy.put_requests(ok=True)) >= 1, 60, "a first PutMetricData")
    slow.set()
    assert in_flight.wait(10), "no PutMetricData after the proxy turned slow"
    sigterm_at = time.time()
    exp.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = exp.proc.wait(25)  # inside Kubernetes' default 30 s grace period
    took = time.monotonic() - started
    output = exp.proc.stdout.read() if exp.proc.stdout else ""
    assert code == 0, output
    assert delay <= took < 10.0 + 2 * delay, took  # waited for the call, then flushed
    assert "Traceback" not in output

    # The call in flight completed, and the final flush sent what was left: the interval
    # SIGTERM fell in, and no gap before it.
    ok = proxy.put_requests(ok=True)
    assert len(proxy.put_requests()) == len(ok)
    seconds = sorted({int(d["Timestamp"]) if isinstance(d["Timestamp"], (int, float))
                      else int(datetime.fromisoformat(str(d["Timestamp"]))
                               .replace(tzinfo=UTC).timestamp())
                      for r in ok for d in r.datums if d["MetricName"] == UTIL})
    assert seconds == list(range(seconds[0], seconds[-1] + 1))  # every interval, no gap
    assert seconds[-1] >= int(sigterm_at) - 1
    assert "not sent before shutdown" not in output
    dims = util_series(moto)
    # (read_aggregates ends its query a second before `end`)
    got = read_aggregates(moto.client(), "CWAgent", [(UTIL, dims)], seconds[0],
                          seconds[-1] + 2, period=1)
    assert len(got[(UTIL, frozenset(dims))]) == len(seconds)  # all of it reached moto


def test_sigterm_while_put_metric_data_never_returns_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call that hangs past the shutdown budget (a black-holed endpoint: botocore's
    5 s connect / 10 s read timeouts, three attempts) must not make the datums vanish
    silently: stop() returns within its bound, and says how many were not sent."""
    release = threading.Event()
    entered = threading.Event()

    class Hanging(FakeCloudWatch):
        def put_metric_data(self, Namespace: str, MetricData: list[dict[str, object]]) -> None:
            entered.set()
            release.wait(30)
            super().put_metric_data(Namespace, MetricData)

    sink = CloudWatchSink(
        SinkSettings(interval=0.2, flush_spread_seconds=0.0, shutdown_timeout=0.5),
        Identity(host="h"), client_factory=Hanging,
    )
    caplog.set_level(logging.WARNING, "gpuscope.exporter.sinks.cloudwatch")
    sink.start()
    try:
        deadline = time.monotonic() + 5
        while not entered.is_set() and time.monotonic() < deadline:
            sink(snapshot(time.time(), [gpu(0, 0.5), gpu(1, 0.25)]))
            time.sleep(0.02)
        assert entered.is_set()
        for _ in range(3):  # samples of the open interval, after the call started
            sink(snapshot(time.time(), [gpu(0, 0.75)]))
        started = time.monotonic()
        sink.stop()  # what the exporter does on SIGTERM, after stopping the sampler
        assert time.monotonic() - started < 0.5 + 2.0 + 0.5
    finally:
        release.set()
    stats = sink.stats()
    lines = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert stats.dropped["shutdown"] > 0
    assert lines[0].startswith(f"CloudWatch: {stats.dropped['shutdown']} datums not sent")

"""The CloudWatch sink: a sampler listener that aggregates, and a flush thread that sends.

Two threads touch it, and neither waits on the other for long:

- the **sampler thread** calls the sink (it is a :class:`~gpuscope.exporter.sampler.Sampler`
  listener, registered after the
  :class:`~gpuscope.exporter.kubernetes.attribution.Attributor`, so the attribution of the
  same round is ready) with every snapshot; the sink turns it into observations and adds them
  to the current interval's aggregates, then returns;
- the sink's own **flush thread** wakes when an interval has closed, turns its aggregates into
  datums (:func:`~gpuscope.exporter.sinks.cloudwatch.aggregate.datums_for`), appends them to
  the send buffer and sends the buffer, oldest first, in requests that respect every
  PutMetricData limit (:mod:`gpuscope.exporter.sinks.cloudwatch.batching`).

Failures: botocore's standard retry mode retries throttling, 5xx and connection errors inside
one call (with exponential backoff and jitter). When a call still fails, the datums stay in
the buffer and the sink backs off on its own (exponential, with jitter, up to
``retry_max_seconds``) before trying again; nothing is reordered. The buffer holds at most
``buffer_seconds`` of intervals (default 30 minutes); beyond that the oldest interval is
dropped and counted. A request CloudWatch rejects for its content (400 ``InvalidParameter…``)
is dropped and counted, so it cannot block everything behind it. On shutdown the open
interval is closed and everything buffered is sent within ``shutdown_timeout`` seconds.

Every outside input — the boto3 client factory, the output of a dry run, the attribution
provider, the wall clock, the monotonic clock, sleep and the random source of the jitter —
is a constructor parameter.
"""

from __future__ import annotations

import logging
import math
import random as _random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TextIO

from gpuscope.exporter.kubernetes.attribution import Attribution
from gpuscope.exporter.model import Snapshot
from gpuscope.exporter.repeats import Repeats
from gpuscope.exporter.sinks.cloudwatch.aggregate import (
    Aggregator,
    ClosedInterval,
    Datum,
    SharedDimensions,
    datums_for,
)
from gpuscope.exporter.sinks.cloudwatch.batching import MAX_DATUMS_PER_REQUEST, take_batch
from gpuscope.exporter.sinks.cloudwatch.publish import (
    BotoPublisher,
    DryRunPublisher,
    Publisher,
    PublishError,
)
from gpuscope.exporter.sinks.cloudwatch.series import Identity, Observer

log = logging.getLogger(__name__)

#: Reasons datums are dropped (the ``reason`` label of the dropped counter).
DROP_REASONS = ("buffer_full", "rejected", "shutdown")
#: Single datums refused in a row after which the rest of a refused request is dropped
#: without sending each alone (see :meth:`CloudWatchSink._send`).
_MAX_REFUSED_SINGLES = 8


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """How the sink publishes.

    ``interval`` (s): length of one aggregation interval and the flush period.
    ``buffer_seconds`` (s): how much data (in intervals) the send buffer keeps during an
    outage. ``retry_base_seconds``/``retry_max_seconds`` (s): the sink's own backoff after a
    call failed despite botocore's retries. ``shutdown_timeout`` (s): time allowed to send
    what is buffered at shutdown. ``flush_spread_seconds`` (s): the flush of each node is
    delayed by a random offset up to ``min(this, interval / 2)`` so a fleet of DaemonSet pods
    does not call PutMetricData in the same second.
    """

    namespace: str = "CWAgent"
    interval: float = 60.0
    buffer_seconds: float = 1800.0
    dry_run: bool = False
    retry_base_seconds: float = 1.0
    retry_max_seconds: float = 60.0
    shutdown_timeout: float = 10.0
    flush_spread_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class SinkStats:
    """Counters since start (the self-metrics). ``dropped`` maps a reason in
    :data:`DROP_REASONS` to datums dropped; ``buffered`` is datums waiting to be sent;
    ``last_success_timestamp`` is wall-clock seconds of the last accepted request."""

    datums_sent: int
    requests: int
    failures: int
    dropped: Mapping[str, int]
    buffered: int
    last_success_timestamp: float | None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One PutMetricData call: datums in it, its estimated size (bytes), whether it
    succeeded. The sink keeps the last few hundred, for tests and debugging."""

    datums: int
    estimated_bytes: int
    ok: bool


class _Group:
    """The datums of one closed interval, and how many of them were sent already."""

    __slots__ = ("datums", "sent", "start")

    def __init__(self, start: float, datums: list[Datum]) -> None:
        self.start = start
        self.datums = datums
        self.sent = 0

    @property
    def remaining(self) -> int:
        return len(self.datums) - self.sent


class CloudWatchSink:
    """Aggregates snapshots per interval and publishes them to CloudWatch (or stdout).

    ``client_factory`` builds the boto3 client (called once, here, so a bad region fails
    at start); not needed with ``settings.dry_run``, where datums go to ``out`` (default
    stdout) as JSON lines. ``attribution`` returns the latest attribution (pod rollups).
    """

    def __init__(
        self,
        settings: SinkSettings,
        identity: Identity,
        *,
        client_factory: Callable[[], Any] | None = None,
        out: TextIO | None = None,
        attribution: Callable[[], Attribution | None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if not settings.interval > 0:
            raise ValueError(f"interval must be positive, got {settings.interval}")
        self.settings = settings
        self.identity = identity
        self._publisher: Publisher
        if settings.dry_run:
            self._publisher = DryRunPublisher(out if out is not None else sys.stdout)
        elif client_factory is None:
            raise ValueError("client_factory is required unless dry_run")
        else:
            self._publisher = BotoPublisher(client_factory())
        self._attribution = attribution
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._random = random
        self._observer = Observer(identity)
        self._aggregator = Aggregator(settings.interval)
        # The datums' Dimensions lists, shared from one interval to the next (flush thread).
        self._dimensions = SharedDimensions()
        # The flush thread's unexpected errors (a bug), logged without a traceback each try.
        self._flush_errors = Repeats(log, "CloudWatch flush")
        # An interval is closed this long after its end: a little grace for the sampler's
        # last round of the interval, plus this node's random offset within the fleet.
        grace = min(2.0, settings.interval / 4)
        spread = min(settings.flush_spread_seconds, settings.interval / 2)
        self._close_delay = grace + random() * spread
        self._max_groups = max(1, math.ceil(settings.buffer_seconds / settings.interval))
        self._groups: deque[_Group] = deque()
        self._lock = threading.Lock()  # guards the counters read by scrapes
        self._buffered = 0
        self._sent = 0
        self._requests = 0
        self._failures = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._last_success: float | None = None
        self._failures_in_row = 0
        self._retry_at = -math.inf
        self._records: deque[RequestRecord] = deque(maxlen=512)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._abandoned = False  # stop() gave up waiting for the flush thread

    # -- sampler thread ---------------------------------------------------------------------
    def __call__(self, snapshot: Snapshot) -> None:
        """Adds one snapshot's values to the current interval (the sampler listener)."""
        attribution = self._attribution() if self._attribution is not None else None
        self._aggregator.add(snapshot.timestamp, self._observer.observe(snapshot, attribution))

    # -- any thread -------------------------------------------------------------------------
    def stats(self) -> SinkStats:
        with self._lock:
            return SinkStats(
                datums_sent=self._sent, requests=self._requests, failures=self._failures,
                dropped=MappingProxyType(dict(self._dropped)), buffered=self._buffered,
                last_success_timestamp=self._last_success,
            )

    def recent_requests(self) -> tuple[RequestRecord, ...]:
        with self._lock:
            return tuple(self._records)

    @property
    def protocol(self) -> str:
        """The wire protocol the client speaks (``json``, ``query``…): what sizes assume."""
        return self._publisher.protocol

    # -- flush thread (or a test calling tick() directly) ------------------------------------
    def tick(self) -> float:
        """One round of the flush loop: close finished intervals, send what is buffered
        unless backing off. Returns seconds until the next round is due."""
        now = self._clock()
        self._enqueue(self._aggregator.take_closed(now - self._close_delay))
        if self._buffered and self._monotonic() >= self._retry_at:
            self._send(deadline=None)
        return self._next_delay()

    def _flush_all(self, timeout: float | None = None) -> bool:
        """Closes every interval, the open one included, and sends everything buffered,
        ignoring the backoff, for at most ``timeout`` seconds (default
        ``settings.shutdown_timeout``). True when nothing is left."""
        budget = self.settings.shutdown_timeout if timeout is None else timeout
        deadline = self._monotonic() + budget
        self._enqueue(self._aggregator.take_all())
        while self._buffered and self._monotonic() < deadline:
            if self._send(deadline=deadline):
                continue
            pause = min(self._backoff_delay(), deadline - self._monotonic())
            if pause > 0:
                self._sleep(pause)
        return self._buffered == 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gpuscope-cloudwatch",
                                         daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stops the flush thread after a final flush (bounded by ``shutdown_timeout``);
        without a thread, flushes here. What could not be sent is counted as dropped."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            self._final_flush()
            return
        self._stop.set()
        self._thread.join(self.settings.shutdown_timeout + 2.0 if timeout is None else timeout)
        if self._thread.is_alive():
            self._abandon()

    def _abandon(self) -> None:
        """The flush thread is still inside a call (a hung connection: botocore's timeouts
        and retries can take far longer than the shutdown budget) and the process is about
        to exit: count and log everything not confirmed sent, the open interval included,
        instead of letting it vanish with the thread."""
        pending = sum(len(datums_for(i)) for i in self._aggregator.take_all())
        with self._lock:
            self._abandoned = True
            left = self._buffered + pending
            self._dropped["shutdown"] += left
        log.warning("CloudWatch: %d datums not sent before shutdown (a PutMetricData call "
                    "was still running after %g s; its datums are counted too)", left,
                    self.settings.shutdown_timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.tick()
            except Exception:  # a bug here must not end publishing for good
                self._flush_errors.failed()
                delay = min(5.0, self.settings.interval)
            else:
                self._flush_errors.succeeded()
            self._stop.wait(delay)
        self._final_flush()

    def _final_flush(self) -> None:
        if self._abandoned:
            return  # stop() has counted and reported what is left
        if not self._flush_all():
            with self._lock:
                if self._abandoned:
                    return
                left = self._buffered
                self._dropped["shutdown"] += left
                self._buffered = 0
                self._groups.clear()
            log.warning("CloudWatch: %d datums not sent before shutdown", left)

    # -- internals (flush thread only) ------------------------------------------------------
    def _next_delay(self) -> float:
        interval = self.settings.interval
        now = self._clock()
        starts = self._aggregator.open_starts()
        first = starts[0] if starts else self._aggregator.bucket_start(now)
        delay = first + interval + self._close_delay - now
        if self._buffered:
            delay = min(delay, self._retry_at - self._monotonic())
        return min(max(delay, 0.01), interval)

    def _enqueue(self, closed: list[ClosedInterval]) -> None:
        for interval in closed:
            datums = datums_for(interval, dimensions=self._dimensions)
            self._dimensions.next_interval()
            if not datums:
                continue
            with self._lock:
                self._groups.append(_Group(interval.start, datums))
                self._buffered += len(datums)
                while len(self._groups) > self._max_groups:
                    oldest = self._groups.popleft()
                    self._buffered -= oldest.remaining
                    self._dropped["buffer_full"] += oldest.remaining
                    log.warning(
                        "CloudWatch buffer full (%g s of data): dropped %d datums of the "
                        "interval starting %.0f", self.settings.buffer_seconds,
                        oldest.remaining, oldest.start,
                    )

    def _candidates(self, limit: int = MAX_DATUMS_PER_REQUEST) -> list[Datum]:
        out: list[Datum] = []
        for group in self._groups:
            need = limit - len(out)
            out.extend(group.datums[group.sent:group.sent + need])
            if len(out) >= limit:
                break
        return out

    def _consume(self, n: int) -> None:
        with self._lock:
            self._buffered -= n
            while n and self._groups:
                group = self._groups[0]
                take = min(n, group.remaining)
                group.sent += take
                n -= take
                if group.remaining == 0:
                    self._groups.popleft()

    def _backoff_delay(self) -> float:
        k = max(1, self._failures_in_row)
        base = min(self.settings.retry_max_seconds,
                   self.settings.retry_base_seconds * 2.0 ** (k - 1))
        return base * (0.5 + 0.5 * self._random())  # "equal jitter"

    def _send(self, deadline: float | None) -> bool:
        """Sends buffered datums, oldest first, until the buffer is empty (True) or a
        call fails in a way worth retrying (False, backoff set)."""
        namespace = self.settings.namespace
        protocol = self._publisher.protocol
        # CloudWatch refuses a whole request for one datum it does not take (a timestamp
        # out of its window after a clock step, a value or dimension it refuses): the refused
        # request is halved until the refused datums go alone, so the good ones around them
        # are still sent. ``suspect``: datums at the head of the buffer that were in a
        # refused request; ``singles``: single datums refused in a row. Once
        # _MAX_REFUSED_SINGLES are, the rest of the suspects is dropped at once (everything
        # refused, e.g. the node's clock is hours off: no request per datum).
        limit = MAX_DATUMS_PER_REQUEST
        suspect = 0
        singles = 0
        while self._buffered:
            if deadline is not None and self._monotonic() >= deadline:
                return False
            if self._abandoned:  # stop() gave up on this thread and counted the rest
                return False
            candidates = self._candidates(limit)
            n, size = take_batch(candidates, namespace, protocol)
            batch = candidates[:n]
            try:
                self._publisher.put(namespace, batch)
            except PublishError as exc:
                with self._lock:
                    self._requests += 1
                    self._failures += 1
                    self._records.append(RequestRecord(n, size, False))
                if not exc.retryable:
                    suspect = max(suspect, n)
                    if n == 1:
                        singles += 1
                    if n > 1 and singles < _MAX_REFUSED_SINGLES:
                        limit = max(1, n // 2)
                        continue
                    drop = suspect if singles >= _MAX_REFUSED_SINGLES else n
                    first = batch[0]
                    log.error("CloudWatch rejected %d datums (%s at %s%s), dropping them: %s",
                              drop, first["MetricName"], first["Timestamp"].isoformat(),
                              "" if drop == 1 else " and more", exc)
                    with self._lock:
                        self._dropped["rejected"] += drop
                    self._consume(drop)
                    suspect -= drop
                    if suspect == 0:
                        limit, singles = MAX_DATUMS_PER_REQUEST, 0
                    continue
                self._failures_in_row += 1
                delay = self._backoff_delay()
                self._retry_at = self._monotonic() + delay
                log.warning("%s; %d datums kept, retrying in %.1f s",
                            exc, self._buffered, delay)
                return False
            with self._lock:
                self._requests += 1
                self._sent += n
                self._last_success = self._clock()
                self._records.append(RequestRecord(n, size, True))
            self._consume(n)
            suspect = max(0, suspect - n)
            singles = 0
            limit = min(MAX_DATUMS_PER_REQUEST, limit * 2)
            if self._failures_in_row:
                log.info("CloudWatch reachable again")
            self._failures_in_row = 0
            self._retry_at = -math.inf
        return True

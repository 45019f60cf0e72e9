"""The sampling loop: calls ``Source.sample()`` on a fixed interval in its own thread.

Scrapes never touch the source. They read :meth:`Sampler.latest`, an atomic reference to the
last frozen :class:`~gpuscope.exporter.model.Snapshot`, so a slow or hung NVML call can delay
the next sample but never a scrape. Listeners (sinks such as CloudWatch) are called with every
snapshot on the sampler thread, and must be quick (append to a buffer and return).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from gpuscope.exporter.model import Snapshot, Source
from gpuscope.exporter.repeats import Repeats

log = logging.getLogger(__name__)

Listener = Callable[[Snapshot], None]


class Sampler:
    """Samples ``source`` every ``interval`` seconds (fixed rate, not fixed delay).

    ``clock`` gives wall-clock seconds (snapshot timestamps, readiness); ``monotonic`` drives
    scheduling and liveness so a wall-clock jump neither skips nor bunches rounds.
    """

    def __init__(
        self,
        source: Source,
        interval: float,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        listeners: tuple[Listener, ...] = (),
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.source = source
        self.interval = interval
        self._clock = clock
        self._monotonic = monotonic
        self._listeners = listeners
        # Their unexpected errors, logged without a traceback every round (repeats.py).
        self._source_errors = Repeats(log, f"sampling source {source.name}", clock=monotonic)
        self._listener_errors = [Repeats(log, f"snapshot listener {listener!r}", clock=monotonic)
                                 for listener in listeners]
        self._latest: Snapshot | None = None
        # Monotonic time the latest snapshot's round began (its age for /readyz: the wall
        # clock may step back under NTP while a round hangs).
        self._latest_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Monotonic time the loop last finished a round (or started): the liveness heartbeat.
        self._heartbeat = monotonic()
        self.rounds = 0
        self.missed_rounds = 0
        self.errors = 0
        # Failed rounds per part of the source's work (``nvml_devices``, ...), since start:
        # ``gpu_exporter_collector_errors_total``. Sources report each round's success only.
        self._part_errors: dict[str, int] = {}

    # -- reading (any thread, never blocks) -------------------------------------------------
    def latest(self) -> Snapshot | None:
        """The last snapshot, or None before the first round finished."""
        return self._latest

    def alive(self) -> bool:
        """The loop thread runs and has finished a round recently (``/healthz``).

        A round stuck in the driver for longer than three intervals plus 30 s makes the
        exporter unhealthy, so the kubelet restarts it instead of serving stale data forever.
        """
        thread = self._thread
        if thread is None or not thread.is_alive():
            return False
        return self._monotonic() - self._heartbeat < 3 * self.interval + 30.0

    def ready(self) -> bool:
        """A sample from a working source, newer than three intervals (``/readyz``), by the
        monotonic clock: a wall clock stepped back would keep a stuck sampler ready."""
        snap = self._latest
        if snap is None or not snap.source_up:
            return False
        return self._monotonic() - self._latest_at < 3 * self.interval

    # -- running ----------------------------------------------------------------------------
    def run_once(self) -> Snapshot:
        """Take one sample now, publish it and notify listeners. Never raises."""
        began = self._monotonic()
        try:
            snap = self.source.sample()
        except Exception:  # a source bug must not kill the loop; the next round retries
            self.errors += 1
            self._source_errors.failed()
            snap = Snapshot(timestamp=self._clock(), source_up=False)
        else:
            self._source_errors.succeeded()
        snap = self._count_part_errors(snap)
        self._latest, self._latest_at = snap, began
        for listener, errors in zip(self._listeners, self._listener_errors, strict=True):
            try:
                listener(snap)
            except Exception:
                errors.failed()
            else:
                errors.succeeded()
        # Counted once the listeners (attribution) have published this round too: the HTTP
        # server re-renders /metrics when this changes.
        self.rounds += 1
        self._heartbeat = self._monotonic()
        return snap

    def _count_part_errors(self, snap: Snapshot) -> Snapshot:
        """The snapshot with each part's ``errors_total``: the rounds in which that part
        failed since the sampler started (a part that keeps its own count keeps it)."""
        if not snap.parts:
            return snap
        parts = []
        for part in snap.parts:
            if not part.success:
                self._part_errors[part.name] = self._part_errors.get(part.name, 0) + 1
            counted = self._part_errors.get(part.name, 0)
            if counted > part.errors_total:  # (never below a count the part keeps itself)
                part = dataclasses.replace(part, errors_total=counted)
            parts.append(part)
        return dataclasses.replace(snap, parts=tuple(parts))

    def start(self) -> None:
        if self._thread is not None:
            return
        self._heartbeat = self._monotonic()
        self._thread = threading.Thread(target=self._loop, name="gpuscope-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Ends the loop after its current round, waiting at most ``timeout`` seconds. False
        when the thread is still inside a round (a source call that never returns)."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        next_due = self._monotonic()
        while not self._stop.is_set():
            self.run_once()
            next_due += self.interval
            now = self._monotonic()
            if now > next_due:
                # The round overran one or more intervals: skip the missed slots rather than
                # sampling back-to-back to catch up, and count them.
                skipped = int((now - next_due) // self.interval) + 1
                self.missed_rounds += skipped
                next_due += skipped * self.interval
            self._stop.wait(max(0.0, next_due - self._monotonic()))

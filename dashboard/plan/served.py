"""The window a Prometheus-compatible store serves the fleet page (:meth:`ServedStore.served`:
the page's end moved back to the store's newest data where the store is behind), and
whether the ``gpuscope-dashboard`` recording rules serve it (:meth:`~ServedStore.rules_loaded`):
the two small instant queries a page asks before its rounds, each answer kept a while and
shared by the page's rows and steps, which ask side by side."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpuscope.dashboard.data.prometheus import EDGE, PrometheusStore
from gpuscope.dashboard.data.promql import duration, labelled, selector
from gpuscope.dashboard.data.recorded import RULE_INTERVAL, RULE_R, RULES, RULES_VERSION
from gpuscope.dashboard.data.source import DataError
from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.series import Series, Window
from gpuscope.dashboard.verdicts import Thresholds


def newest_sample(span: float, step: float, by: str = "", at: float | None = None) -> str:
    """The store's newest exporter sample within ``span`` seconds (its time, seconds since
    the epoch; ``by``: one per value of that label), read at steps of ``step`` seconds (a
    subquery of each node's ``gpu_node_info`` timestamp: a sample after the last step is
    missed); ``at``: as of that instant (``@``), else the query's."""
    pin = "" if at is None else f" @ {at:.3f}"
    group = f" by ({by})" if by else ""
    return (f"max{group} (max_over_time(timestamp(gpu_node_info)"
            f"[{duration(span)}:{duration(step)}]{pin}))")


class ServedStore(PrometheusStore):
    """The store, with the page's thresholds (None: the defaults; the rules are recorded
    per thresholds), the window it serves and whether its rules serve it."""

    def __init__(self, url: str, *, thresholds: Thresholds | None = None,
                 **store: Any) -> None:
        """``store``: :class:`PrometheusStore`'s keywords (``PlanQueries`` names them)."""
        super().__init__(url, **store)
        self.thresholds = thresholds or Thresholds()
        # Whether the recording rules serve a window (by its length): (when checked, loaded).
        self._rules_seen: dict[int, tuple[float, bool]] = {}
        # A check that failed (the store's error), by window length: (when, error). Those
        # who waited for it share it instead of each waiting a timeout of their own.
        self._rules_failed: dict[int, tuple[float, DataError]] = {}
        # The windows last served (:meth:`served`), by the window asked: the latest
        # :attr:`SERVED_KEPT` (pages of other windows asked between a page's rows and its
        # steps leave its own).
        self._served_seen: dict[Window, tuple[float, Window, bool]] = {}
        # The store's newest exporter sample each served window was placed by (only where
        # it was found further back than the store's lookback: the first round, read at
        # the dashboard's clock, finds none then, and the page's note says it from here).
        self._newest_far: dict[Window, float] = {}
        self._served_lock = threading.Lock()
        self._check_lock = threading.Lock()

    #: How many windows' :meth:`served` answers are kept (the page's windows, each with and
    #: without a namespace asking the same).
    SERVED_KEPT = 16
    #: How long a window served a step earlier is kept, in seconds: long enough for a page's
    #: rows and steps (asked side by side) to share it, short of the next page.
    SERVED_EARLIER_KEPT = 10.0

    #: How long a finding that the recording rules serve the window is kept, in seconds.
    RULES_CHECK_EVERY = 300.0
    #: How long a finding that they do not is kept: one rule interval, so that a miss (a
    #: minute whose evaluation was not written yet when the page asked) does not leave the
    #: page on the raw series, slow at a large fleet, for :attr:`RULES_CHECK_EVERY`.
    RULES_MISSING_CHECK_EVERY = RULE_INTERVAL
    #: How long a failed check's error answers those who asked while it ran, in seconds:
    #: the page's rows and its steps ask side by side, and a store that timed out the first
    #: would otherwise keep the second waiting a whole timeout more (the page's error
    #: banner twice as late, when the store is in trouble). Short: the next page asks again.
    RULES_FAILED_KEPT = 5.0

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        """:meth:`PrometheusStore.step_series` over the window the fleet page is served
        (:meth:`served`)."""
        return super().step_series(queries, window_seconds,
                                   self.served(window or self.window(window_seconds)))

    def served(self, window: Window) -> Window:
        """:meth:`served_window`'s window."""
        return self.served_window(window)[0]

    def served_window(self, window: Window) -> tuple[Window, int]:
        """The window the fleet page is served (its rows and the registry's steps):
        ``window``, or ``window`` some steps earlier (on the grid of its step, as
        :meth:`window` ends it: VictoriaMetrics rounds a range query to it), and how many
        queries that took (0 or 1: the page's rows and its steps ask side by side, and the
        first asks). One small instant query, its answer kept for the same ``window`` (one
        that serves it earlier only :attr:`SERVED_EARLIER_KEPT` seconds), asks two things:

        - The store's newest exporter sample (``max(timestamp(gpu_node_info))``, within
          the store's lookback): where it is older than the window's end by more than a
          step's queries look back (the step, at least :attr:`lookback`), the dashboard's
          clock is ahead of the store's, or data reaches the store late (remote write, a
          managed store's ingestion, a backlog after an outage), and every verdict that
          needs a point at the last step would be missing. The page ends at the last step
          at or before that sample (its notes say so:
          :func:`~gpuscope.dashboard.plan.answers.lag_note`). Where the store has none
          within its lookback (5 minutes by default: an outage of remote write, a backlog
          longer than that), a second query looks for it up to an hour back, or as far
          as the window is long (:meth:`_newest_before`); the page is empty only where
          the store has no exporter sample in that time either.
        - Where the rules may serve the window (:meth:`_rules_may_serve`, and their check
          has not found them missing for this length): whether the rules' last record of
          a minute (``gpuscope:dashboard_rules:version``, the group's last rule) is at its
          end for fewer of the store's rule sets (clusters) than a minute before. The
          store evaluates the group at its own second of each minute, and at a large fleet
          one evaluation takes seconds, so a page asked in between would find the minute
          it ends at not recorded yet, the rules' check would miss and the page fall to
          the raw series (slow, and a banner that says to load the rules). The page then
          ends at the last step they recorded, a step behind."""
        rules = self._rules_may_serve(window)
        if rules:
            with self._lock:
                found = self._rules_seen.get(round(window.seconds))
            rules = found is None or found[1] or (
                time.monotonic() - found[0] >= self.RULES_MISSING_CHECK_EVERY)
        with self._served_lock:
            # (One at a time: the second caller reads the first one's answer.)
            kept = self._served_seen.get(window)
            # A window served earlier (or not asked: the store failed) is asked again after
            # :attr:`SERVED_EARLIER_KEPT` seconds: by then the store has usually written the
            # minute (the next page, or the kept-warm view's refresh, is not left a step
            # behind for the whole step). One served as asked is kept.
            if kept is not None and (kept[2] or time.monotonic() - kept[0]
                                     < self.SERVED_EARLIER_KEPT):
                return kept[1], 0
            parts = {"newest": "max(timestamp(gpu_node_info))"}
            if rules:
                parts.update({
                    name: f"count(last_over_time({self._version()}[{RULE_R}] @ {t:.3f}))"
                    for name, t in (("end", window.end),
                                    ("before", window.end - RULE_INTERVAL))})
            query = " or ".join(labelled(q, "at", name) for name, q in parts.items())
            try:
                counts = {lab.get("at", ""): v for lab, v in self.instant(query, window.end)}
            except DataError as error:
                # The page's own queries say what failed (this one is only a shortcut); the
                # page's other caller does not wait out the store's timeout a second time,
                # nor does the rules' check that follows (:meth:`_check_rules`: its error).
                self._keep_served(window, window, final=False)
                if rules:
                    with self._lock:
                        self._rules_failed[round(window.seconds)] = (time.monotonic(), error)
                return window, 1
            back = int(rules and counts.get("before", 0.0) > counts.get("end", 0.0))
            asked = 1
            newest = counts.get("newest", math.nan)
            far = not math.isfinite(newest)
            if far:
                newest = self._newest_before(window)
                asked += 1
            # Where the first round's reads at the end (over the step, at least the
            # lookback, a millisecond short) would not reach the newest sample: the page
            # ends at the last step at or before it. (Not merely within reach of it: that
            # sample is the freshest exporter's, and the others' last ones are up to a
            # scrape interval older; each has one within reach of a step at or before it.)
            lag = window.end - newest
            if math.isfinite(lag) and lag >= max(window.step, self.lookback) - EDGE:
                back = max(back, math.ceil(lag / window.step))
            out = window if not back else Window(start=window.start - back * window.step,
                                                 end=window.end - back * window.step,
                                                 step=window.step)
            if far and math.isfinite(newest):
                self._newest_far[out] = newest
                while len(self._newest_far) > self.SERVED_KEPT:
                    del self._newest_far[next(iter(self._newest_far))]
            self._keep_served(window, out, final=out == window)
            return out, asked

    #: The longest step of :meth:`_newest_before`'s subquery (seconds): under the stores'
    #: default lookback (5 minutes), so that each sample is within reach of a step after it.
    NEWEST_STEP_MAX = 240.0

    #: How far back :meth:`_newest_before` looks at least (seconds): a backlog of an hour
    #: is served on a page of any length (a longer page's own length, where longer).
    NEWEST_SPAN_MIN = 3600.0

    def _newest_before(self, window: Window) -> float:
        """The store's newest exporter sample within an hour, or ``window``'s length where
        longer, before its end (seconds since the epoch; NaN where there is none or the
        query failed): a subquery of each node's ``gpu_node_info`` timestamp at steps of
        :attr:`lookback` (longer for a long span: at most 240 of them, each step at most
        :attr:`NEWEST_STEP_MAX`), asked only where none is within the store's lookback."""
        span = max(window.seconds, self.NEWEST_SPAN_MIN)
        step = min(max(self.lookback, span / 240), self.NEWEST_STEP_MAX)
        try:
            rows = self.instant(newest_sample(span, step), window.end)
        except DataError:
            return math.nan  # (the page's own queries say what failed)
        return max((v for _, v in rows if math.isfinite(v)), default=math.nan)

    def served_newest(self, window: Window) -> float | None:
        """The store's newest exporter sample that placed the served ``window``, where it
        was beyond the store's lookback (:meth:`served_window`); else None."""
        with self._served_lock:
            return self._newest_far.get(window)

    def _keep_served(self, window: Window, out: Window, *, final: bool) -> None:
        """Keeps :meth:`served_window`'s answer (``final``: for as long as ``window`` is
        asked), the newest last, the oldest dropped beyond :attr:`SERVED_KEPT`. Called
        with ``_served_lock`` held."""
        self._served_seen.pop(window, None)
        self._served_seen[window] = (time.monotonic(), out, final)
        while len(self._served_seen) > self.SERVED_KEPT:
            del self._served_seen[next(iter(self._served_seen))]

    def rules_loaded(self, window: Window) -> bool:
        """Whether the ``gpuscope-dashboard`` recording rules can serve ``window``: its step
        is a whole number of the rules' interval (and the lookback no longer), and every
        recorded series exists at the window's start and end (rules loaded after the
        window began leave it to the raw series). One instant query (``count`` of each at
        both ends, pinned with ``@``), which Prometheus and VictoriaMetrics answer alike
        (VictoriaMetrics has no ``/api/v1/rules`` without vmalert); the finding is kept for
        :attr:`RULES_CHECK_EVERY` seconds per window length (a negative one
        :attr:`RULES_MISSING_CHECK_EVERY`)."""
        return self._check_rules(window)[0]

    def _version(self) -> str:
        """The selector of the rules' version (``gpuscope:dashboard_rules:version``, the
        group's last rule) recorded for this page's thresholds and cluster label."""
        return selector(RULES["version"], thresholds=self.thresholds.key,
                        cluster_label=self.cluster_label)

    def _rules_may_serve(self, window: Window) -> bool:
        """Whether the rules could serve ``window`` at all: its step is a whole number of
        the rules' interval, and the lookback no longer."""
        step_ms, every_ms = round(window.step * 1000), round(RULE_INTERVAL * 1000)
        return not step_ms % every_ms and max(window.step, self.lookback) == window.step

    def _check_rules(self, window: Window) -> tuple[bool, int]:
        """:meth:`rules_loaded`, and how many queries that took (0 or 1)."""
        if not self._rules_may_serve(window):
            return False, 0
        # One check at a time (the page's rows and the registry's steps ask side by side):
        # the second reads the first one's finding instead of sending the query again.
        asked = time.monotonic()
        with self._check_lock:
            key = round(window.seconds)
            now = time.monotonic()
            with self._lock:
                found = self._rules_seen.get(key)
                failed = self._rules_failed.get(key)
            if found is not None and now - found[0] < (
                    self.RULES_CHECK_EVERY if found[1] else self.RULES_MISSING_CHECK_EVERY):
                return found[1], 0
            if failed is not None and failed[0] >= asked - self.RULES_FAILED_KEPT:
                # It failed while this caller waited for it (or just before): its error.
                raise DataError(str(failed[1]))
            probe = duration(RULE_INTERVAL)
            # The dense series (the sparse ones may rightly be empty: nothing spins), of each
            # node's GPU 0 (as the first round's ``at_start``: an eighth of the series, 0.41 s
            # of VictoriaMetrics' time less at 5,000 nodes), and the rules' version (a rule file
            # older than the page lacks what it reads).
            probes = [(selector(RULES["util_max"], gpu="0"), ""),
                      (selector(RULES["util"], gpu="0"), ""),
                      (self._version(), f" >= {RULES_VERSION}")]
            ends = (window.start + window.step, window.end)
            # One sample when every series is there at both ends (``and`` of the counts).
            query = " and ".join(
                f"count(last_over_time({sel}[{probe}] @ {t:.3f}){keep})"
                for sel, keep in probes for t in ends)
            try:
                loaded = len(self.instant(query, window.end)) == 1
            except DataError as error:
                with self._lock:
                    self._rules_failed[key] = (time.monotonic(), error)
                raise
            with self._lock:
                self._rules_seen[key] = (now, loaded)
                self._rules_failed.pop(key, None)
            return loaded, 1

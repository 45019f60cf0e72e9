"""A collector's fault kept to its own families: :class:`Guarded` renders one collector
and, where it raises, leaves its families out of that scrape and counts it, instead of the
whole ``/metrics`` answer failing (prometheus_client's ``generate_latest`` stops at the
first collector that raises, and the client gets no answer at all)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class RenderErrors:
    """Renders that failed, per collector, since the exporter started (thread-safe: scrapes
    run on the server's threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, collector: str) -> int:
        """Count one failed render of ``collector``; the count now."""
        with self._lock:
            self._counts[collector] = self._counts.get(collector, 0) + 1
            return self._counts[collector]

    def totals(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._counts)


class Guarded(Collector):
    """``inner``'s families, all of them or (where rendering them raised) none, the failure
    counted under ``name`` in ``errors`` and logged with its traceback the first time."""

    def __init__(self, name: str, inner: Collector, errors: RenderErrors) -> None:
        self._name = name
        self._inner = inner
        self._errors = errors

    def collect(self) -> Iterator[Metric]:
        try:
            # (Whole, before any is written: a half-rendered collector would be a lie.)
            families = list(self._inner.collect())
        except Exception:
            if self._errors.add(self._name) == 1:
                log.exception("rendering the %s metrics failed; left out of /metrics "
                              "(counted in gpu_exporter_render_errors_total)", self._name)
            return iter(())
        return iter(families)

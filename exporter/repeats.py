"""One place's unexpected errors logged without flooding the node's logs: a part that fails
with a bug fails the same way every round (every second at ``--interval 1``: 86,400
tracebacks a day per part, each shipped and paid for by the cluster's log pipeline).

:class:`Repeats` logs an error with its traceback the first time, then the same error (its
type and message) at most once every ``every`` seconds, as one line saying how many times it
came back; another error logs its traceback at once, and the first success after failures
logs that the part works again. The parts' own counters (``gpu_exporter_collector_*``) count
every failure whatever is logged.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

#: How often a repeated error is logged again (seconds).
REPEAT_EVERY = 600.0


class Repeats:
    """The errors of one place (``what``: "reading device GPU-…", "attribution"), logged to
    ``logger`` as the module says; ``clock``: monotonic seconds. Not thread-safe: each place
    fails in one thread."""

    def __init__(self, logger: logging.Logger, what: str, every: float = REPEAT_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.what = what
        self._every = every
        self._clock = clock
        self._error: tuple[type[BaseException], str] | None = None
        self._since_logged = 0  # repeats of ``_error`` not logged yet
        self._failures = 0  # since the last success
        self._logged_at = 0.0

    def failed(self) -> None:
        """Call in an ``except`` block: the exception being handled is the failure."""
        exc = sys.exc_info()[1]
        error = (type(exc), str(exc)) if exc is not None else (Exception, "")
        now = self._clock()
        self._failures += 1
        if error != self._error:
            self._error, self._since_logged, self._logged_at = error, 0, now
            self._log.exception("%s failed (the same error again is logged every %s)",
                                self.what, _minutes(self._every))
            return
        self._since_logged += 1
        if now - self._logged_at >= self._every:
            self._log.error("%s failed again, %d more time(s) in the last %s: %s: %s",
                            self.what, self._since_logged, _minutes(now - self._logged_at),
                            error[0].__name__, error[1])
            self._since_logged, self._logged_at = 0, now

    def succeeded(self) -> None:
        """The place worked: logged once after failures."""
        if self._error is None:
            return
        self._log.info("%s works again after %d failure(s)", self.what, self._failures)
        self._error, self._failures, self._since_logged = None, 0, 0


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"

"""A verdict's trailing runs, recorded by the rules as they go (:class:`RunRule`) and read
back by the page (:func:`read_runs`, :class:`RecordedRun`).

Each minute, a verdict's recorded flag (a sparse series while its rule holds, e.g.
``uuid:gpu_idle_activity:ratio1m``) either continues the run it had a minute before or
begins one. The rules carry, per flagged series, when its run began (``...:since_seconds``,
seconds since the epoch, the run's first flagged minute), how many minutes it has held
(``...:minutes``) and running sums of what the table shows over the run (minutes held, use,
a group's median...), each rule reading its own record of the minute before. A minute
without the flag (no data, or the rule not met) ends the run, as a gap does in
:func:`~.common.trailing_run`.

That costs the store each minute what the flagged series are, not an hour of them (the same
runs summarised from the flags' history, an hour's subquery each minute, cost several CPU
seconds more per evaluation at 5,000 nodes). The runs are not bounded by an hour: the page
clamps them to its own history, and takes a mean over its part of a run from the sums at
both ends.

Because each rule reads its own past, the records exist from when the rules run, minute by
minute: a backfill that evaluates a rule over a range at once (``promtool tsdb
create-blocks-from rules``, ``vmalert -replay``) cannot make them; ``tests/stores.py``'s
``record_runs`` evaluates them one minute at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuscope.dashboard.data.recorded import RULE_INTERVAL, RULE_R, RULES
from gpuscope.dashboard.series import Window
from gpuscope.dashboard.verdicts.common import Run

#: A recorded flag (or data) series per the run's labels, ``offset`` ("" or " offset 1m")
#: applied to its range.
Flag = Callable[[str], str]

#: A minute before: the records the rule evaluation of a minute ago wrote.
BEFORE = " offset 1m"


def recorded(key: str, by: str, match: str = "") -> Flag:
    """``RULES[key]``'s value in the rules' minute per ``by`` (the highest of several),
    ``match`` its matchers, e.g. ``{signal="sm"}``."""
    def at(offset: str) -> str:
        return f"max by ({by}) (last_over_time({RULES[key]}{match}[{RULE_R}]{offset}))"
    return at


def either(*flags: Flag) -> Flag:
    """The union of flags (one per series where several hold)."""
    def at(offset: str) -> str:
        return "(" + " or ".join(f(offset) for f in flags) + ")"
    return at


@dataclass(frozen=True, slots=True)
class RunRule:
    """How one verdict's runs are recorded: ``prefix`` names its records in :data:`RULES`
    (``<prefix>_since``, ``<prefix>_minutes`` and ``<prefix>_<sum>`` for each of ``sums``);
    ``flag`` the verdict's flag per ``by``; ``data`` its input (where the verdict can be
    judged: a run that begins the minute after none was began with its data, which the page
    asks of the few runs that begin near its history's start); ``sums`` what is summed over
    each minute of the run (a value per ``by``; absent is 0, and a sum is recorded from its
    first value on: held minutes only for the devices held)."""

    prefix: str
    by: str
    flag: Flag
    data: Flag
    sums: Mapping[str, str]

    def record(self, part: str) -> str:
        return RULES[f"{self.prefix}_{part}"]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label.strip() for label in self.by.split(","))

    def _mine(self, part: str) -> str:
        return f"max by ({self.by}) (last_over_time({self.record(part)}[{RULE_R}]{BEFORE}))"

    def rules(self) -> list[tuple[str, str]]:
        """``(record, expr)``: since, minutes, then each sum."""
        on = f"on ({self.by})"
        now = self.flag("")
        # The run's first minute: a minute ago's where the run goes on (a record then means
        # the flag held then), else this one; and how many minutes it has held (with since:
        # the minute recorded).
        out = [(self.record("since"),
                f"({now} * 0 + {on} {self._mine('since')}) or {on} ({now} * 0 + time())"),
               (self.record("minutes"),
                f"{now} * 0 + {on} (({now} * 0 + 1 + {on} {self._mine('minutes')})"
                f" or {on} ({now} * 0 + 1))")]
        for name, value in self.sums.items():
            before = self._mine(f"{name}_sum")
            out.append((self.record(f"{name}_sum"),
                        f"{now} * 0 + {on} (({value} + {on} {before}) or {on} {before}"
                        f" or {on} {value})"))
        return out


def runs_since() -> str:
    """The rule ``gpuscope:dashboard_runs:since_seconds``: the minute the runs began to be
    recorded, carried from minute to minute (its own record of the minute before), else
    this minute: where the rules stopped for a minute or more (a run then has a gap it did
    not see), it starts again. A page reads the runs only over a history that begins after
    it."""
    mine = RULES["runs_since"]
    return f"last_over_time({mine}[{RULE_R}]{BEFORE}) or on () vector(time())"


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """One flagged series' run as the page reads it at ``at`` (the last rule evaluation):
    ``since`` as recorded; ``fresh``: it began with its data (the verdict's input absent the
    minute before), asked of the runs that began near the history's start; ``sums`` the
    running sums at ``at``, ``before`` the same sums at the page's history start where the
    run began before it (else empty)."""

    since: float
    fresh: bool
    at: float
    sums: Mapping[str, float]
    before: Mapping[str, float]

    def start(self, history_start: float, step: float = RULE_INTERVAL) -> float:
        """Where the run starts on a page whose history starts at ``history_start``: a
        minute before its first flagged minute (each minute stands for the one before it),
        no earlier than the history, and the history's start where it began with its data
        within two steps of it (:func:`~.common.trailing_run`'s benefit: scrapes trail the
        fleet's first by up to an interval)."""
        start = self.since - RULE_INTERVAL
        if start <= history_start or (self.fresh and start - history_start <= 2 * step):
            return history_start
        return start

    def on_page(self, window: Window, history_start: float) -> Run:
        """The run as a page of ``window`` whose history starts at ``history_start`` sees
        it: from :meth:`start` to the window's last step (which the last evaluation falls
        in), as :func:`~.common.trailing_run` gives it of the page's steps."""
        return Run(self.start(history_start, window.step), window.end, 0)

    def seconds(self, history_start: float, end: float | None = None) -> float:
        """How long it has held by ``end`` (a page's last step, which the last evaluation
        falls in; its own minute where None)."""
        return max(0.0, (self.at if end is None else end) - self.start(history_start))

    def is_current(self, end: float, step: float) -> bool:
        """Whether the run is the present's on a page ending at ``end``: recorded within its
        last step and a half (rules that stopped leave a run that held then)."""
        return end - self.at <= 1.5 * step

    def minutes_in(self, history_start: float) -> int:
        """The run's flagged minutes after ``history_start`` (those a mean is taken over)."""
        first = max(self.since, self.since + RULE_INTERVAL * math.ceil(
            (history_start - self.since) / RULE_INTERVAL + 1e-9))
        return max(0, round((self.at - first) / RULE_INTERVAL) + 1)

    def total(self, name: str) -> float:
        """``name``'s sum over the run's minutes after the history start."""
        return self.sums.get(name, 0.0) - self.before.get(name, 0.0)

    def mean(self, name: str, history_start: float) -> float | None:
        n = self.minutes_in(history_start)
        return self.total(name) / n if n else None


#: An instant query: ``(promql, at)`` to each series' labels and value
#: (:meth:`~gpuscope.dashboard.data.prometheus.PrometheusStore.instant`).
Instant = Callable[[str, float], Iterable[tuple[Mapping[str, str], float]]]


def read_runs(instant: Instant, rule: RunRule, end: float, history_start: float,
              step: float = RULE_INTERVAL, match: str = "",
              ) -> dict[tuple[str, ...], RecordedRun]:
    """The runs of ``rule``'s verdict that held at the rules' last evaluation by ``end``
    (within a minute of it), keyed by ``rule.labels``' values, ``match`` (e.g.
    ``{node=~"a|b"}``) on each record read; for the runs that began by ``history_start``,
    their sums then too; for those that began within two of the page's ``step`` after it,
    whether their data began with them (the verdict's input absent the minute before)."""
    keys = rule.labels

    def rows(q: str, t: float) -> dict[tuple[str, ...], float]:
        return {tuple(lab.get(k, "") for k in keys): v for lab, v in instant(q, t)}

    def read(part: str, t: float) -> dict[tuple[str, ...], float]:
        return rows(f"max by ({rule.by}) (last_over_time({rule.record(part)}{match}"
                    f"[{RULE_R}]))", t)
    since = read("since", end)
    minutes = read("minutes", end)
    sums = {name: read(f"{name}_sum", end) for name in rule.sums}
    before: dict[str, dict[tuple[str, ...], float]] = {}
    if any(s <= history_start for s in since.values()):
        # The same run then (its first minute the same), its sums up to the history start.
        then = read("since", history_start)
        before = {name: {k: v for k, v in read(f"{name}_sum", history_start).items()
                         if then.get(k) == since.get(k)} for name in rule.sums}
    fresh: set[tuple[str, ...]] = set()
    near = {s for s in since.values()
            if 0 < s - RULE_INTERVAL - history_start <= 2 * step}
    for began in near:
        # (A handful of minutes: runs that began at one of the history's first.)
        # Its data the minute before, of those runs alone (their ``since`` pinned at the
        # end: the data's series of the rest are not sent).
        runs_then = (f"max by ({rule.by}) (last_over_time({rule.record('since')}{match}"
                     f"[{RULE_R}] @ {end:.3f})) == {began!r}")
        had = rows(f"{rule.data('')} and on ({rule.by}) ({runs_then})", began - RULE_INTERVAL)
        fresh |= {k for k, s in since.items() if s == began and k not in had}
    return {k: RecordedRun(s, k in fresh, s + (minutes[k] - 1) * RULE_INTERVAL,
                           {n: sums[n].get(k, 0.0) for n in rule.sums},
                           {n: before[n][k] for n in before if k in before[n]})
            for k, s in since.items() if k in minutes}

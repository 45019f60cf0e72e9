"""A verdict's trailing runs, recorded by the rules as they go (:func:`run_rules`) and read
back by the page (:class:`RecordedRun`).

Each minute, a verdict's recorded flag (a sparse series while its rule holds, e.g.
``uuid:gpu_idle_activity:ratio1m``) either continues the run it had a minute before or
begins one. The rules carry, per flagged series, when its run began (``...:since``, seconds
since the epoch, the run's first flagged minute), whether it began with its data (``...:fresh``:
the verdict's input was absent the minute before, as a device's first sample is) and running
sums of what the table shows over the run (``...:<name>_sum``: minutes held, mean use...),
each rule reading its own record of the minute before. A minute without the flag (no data,
or the rule not met) ends the run, as a gap does in :func:`~.common.trailing_run`.

That costs the store each minute what the flagged series are, not an hour of them: the same
run summarised from the flags' history (an hour's subquery per minute) cost five times
more at 5,000 nodes. The runs are not bounded by an hour: the page clamps them to its own
history, and takes a mean over its window from the sums at both ends.

Because each rule reads its own past, the records exist from when the rules run, minute by
minute: a backfill (``promtool tsdb create-blocks-from rules``, ``vmalert -replay``) that
evaluates a rule over a range at once cannot make them; ``tests/stores.py`` evaluates them
minute by minute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuscope.dashboard.data.recorded import RULE_INTERVAL, RULE_R, RULES

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
    (``<prefix>_since``, ``<prefix>_fresh``, ``<prefix>_minutes`` and ``<prefix>_<sum>`` for
    each of ``sums``);
    ``flag`` the verdict's flag per ``by``; ``data`` its input (present where the verdict
    could be judged: a run that begins the minute after none was is ``fresh``); ``sums``
    what is summed over each minute of the run (a value per ``by``, absent as 0)."""

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

    def _mine(self, part: str, offset: str = BEFORE) -> str:
        return f"max by ({self.by}) (last_over_time({self.record(part)}[{RULE_R}]{offset}))"

    def rules(self) -> list[tuple[str, str]]:
        """``(record, expr)``: since, fresh, minutes, then each sum."""
        on = f"on ({self.by})"
        now, since = self.flag(""), self._mine("since")
        out = [
            # The run's first minute: a minute ago's where the run goes on (a record then
            # means the flag held then), else this one.
            (self.record("since"), f"({now} * 0 + {on} {since}) or {on} ({now} * 0 + time())"),
            # Fresh where the run goes on fresh, or begins now with no data a minute ago.
            (self.record("fresh"),
             f"({now} * 0 + {on} {self._mine('fresh')}) or {on}"
             f" (({now} unless {on} {since} unless {on} {self.data(BEFORE)}) * 0 + 1)"),
        ]
        # How many minutes the run has held (with since: the minute recorded, ``at``).
        out.append((self.record("minutes"),
                    f"{now} * 0 + {on} (({now} * 0 + 1 + {on} {self._mine('minutes')})"
                    f" or {on} ({now} * 0 + 1))"))
        for name, value in self.sums.items():
            before = self._mine(f"{name}_sum")
            out.append((self.record(f"{name}_sum"),
                        f"{now} * 0 + {on} (({value} + {on} {before}) or {on} {before}"
                        f" or {on} {value} or {on} ({now} * 0))"))
        return out


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """One flagged series' run as the page reads it at ``at`` (the last rule evaluation):
    ``since`` and ``fresh`` as recorded, ``sums`` the running sums at ``at``, ``before``
    the same sums at the page's history start where the run began before it (else
    empty)."""

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

    def seconds(self, history_start: float, end: float | None = None) -> float:
        """How long it has held by ``end`` (a page's last step, which the last evaluation
        falls in; its own minute where None)."""
        return max(0.0, (self.at if end is None else end) - self.start(history_start))

    def fresh_at(self, end: float, step: float) -> bool:
        """Whether the run is the present's on a page ending at ``end``: recorded within its
        last step and a half (rules that stopped leave a run that held then)."""
        return end - self.at <= 1.5 * step

    def minutes_in(self, history_start: float) -> int:
        """The run's flagged minutes after ``history_start`` (those a mean is taken over)."""
        first = max(self.since, self.since + RULE_INTERVAL * _ceil(
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
              match: str = "") -> dict[tuple[str, ...], RecordedRun]:
    """The runs of ``rule``'s verdict that held at the rules' last evaluation by ``end``
    (within a minute of it), keyed by ``rule.labels``' values, ``match`` (e.g.
    ``{node=~"a|b"}``) on each record read; for the runs that began by ``history_start``,
    their sums then too."""
    keys = rule.labels

    def read(part: str, t: float) -> dict[tuple[str, ...], float]:
        q = f"max by ({rule.by}) (last_over_time({rule.record(part)}{match}[{RULE_R}]))"
        return {tuple(lab.get(k, "") for k in keys): v for lab, v in instant(q, t)}
    since = read("since", end)
    minutes = read("minutes", end)
    fresh = read("fresh", end)
    sums = {name: read(f"{name}_sum", end) for name in rule.sums}
    before: dict[str, dict[tuple[str, ...], float]] = {}
    if any(s <= history_start for s in since.values()):
        # The same run then (its first minute the same), its sums up to the history start.
        then = read("since", history_start)
        before = {name: {k: v for k, v in read(f"{name}_sum", history_start).items()
                         if then.get(k) == since.get(k)} for name in rule.sums}
    return {k: RecordedRun(s, k in fresh, s + (minutes[k] - 1) * RULE_INTERVAL,
                           {n: sums[n].get(k, 0.0) for n in rule.sums},
                           {n: before[n][k] for n in before if k in before[n]})
            for k, s in since.items() if k in minutes}


def _ceil(x: float) -> int:
    return -int(-x // 1)

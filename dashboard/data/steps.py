"""A verdict's series, declared as data: :class:`StepQuery` names one metric, how it is reduced
over each step of the window and which steps to keep; every store answers a list of them
(``DataSource.step_series``) with, per series, only the kept steps, so a healthy fleet
answers with nothing.

Only the query's own fields reach PromQL (:func:`promql`), each validated when the query is
made: a metric name, label names, one of a few reductions and comparisons, a finite number.
Nothing a user types (a namespace, a node) is part of a step query.

What a step is, in each store (``step`` is the window's step, ``lookback`` the Prometheus
store's shortest range, 60 s by default; the embedded store uses two scrape intervals):

- ``min`` / ``max``: the lowest / highest sample in ``(t - r, t]``, ``r`` the step, at least
  ``lookback`` (the fleet page's gauges: a step shorter than the scrape interval still finds
  a sample). A step without a sample has no point.
- ``increase``: how much the counter grew over its samples in ``(t - r - lookback, t]``, a
  drop being a reset (counting starts again from 0). The range reaches ``lookback`` into the
  step before: Prometheus' ``increase()`` sees only the samples inside its range, so over the
  step alone it would miss a rise between the last sample of one step and the first of the
  next (at a 60 s scrape and step, every rise). A rise therefore also shows in the step after
  its own when the sample before it is within ``lookback`` of that step's start (on
  VictoriaMetrics: the sample after it). Prometheus extrapolates the increase to the range's
  edges (a rise of 1 reads about 1.07 at a 15 s scrape); VictoriaMetrics and the embedded
  store do not: the same steps pass ``> 0``, a threshold between the two values would not.
  A step with fewer than two samples of a series has no increase for it: a counter that
  first appears inside the window with its count (``gpu_xid_errors_total`` appears at its
  first XID, at 1) shows no increase until it rises again. VictoriaMetrics differs there: it
  counts a new series' small first value from 0, so it flags such a first XID (in the steps
  whose range holds that sample) where Prometheus and the embedded store do not.
- ``by``: the labels kept besides ``node``; series that differ only in others (``instance``,
  ``job``, or ``xid`` when it is not in ``by``) are aggregated: the lowest for ``min``, the
  highest for ``max``, the sum for ``increase`` (every kind of event counted), for
  ``rate`` each exporter pod's increase (``instance``), summed, over the range
  (:func:`~gpuscope.dashboard.data.promql.summed_rate`: across a rollout each pod covers
  only its part of the range).
- ``rate``: the counter's mean rate per second over the same range as ``increase`` (the
  increase over the time between the range's first and last samples; Prometheus
  extrapolates, VictoriaMetrics and the embedded store do not: at a steady rate the three
  agree, at the edges of a burst they differ by a few percent).
- ``match``: only the series whose label is one of the given values (``reason=~"power|
  thermal"``).
- ``recorded``: the same question of the recording rules (a sparse series recorded per
  minute); the Prometheus store sends it instead when its rules are loaded for the window
  (``PrometheusData.rules_loaded``). At a one-minute step the two answer the same steps;
  over longer steps the recorded one keeps a step where some minute of it passed.
- ``on``: other step queries (each with ``uuid`` in its ``by``, none with an ``on`` of its
  own) that restrict this one (``uuid`` in its ``by`` too) to the devices they flag, step by
  step: a series of this query keeps a kept step ``t`` only where some query of ``on`` kept
  ``t`` for a series with the same ``node`` and ``uuid`` (whatever their other labels; a
  series without ``uuid`` matches one without it, as in PromQL). ``max`` of
  ``container_gpu_allocated`` by ``namespace, pod, container, uuid`` on the GPU-health
  queries answers which containers held each broken GPU while it was broken, and nothing
  for a healthy fleet: bounded by the findings, not by the fleet. The step is the unit: a
  container whose last sample on a GPU falls in the step where the GPU's fault first shows
  is returned at that step, even when the sample came before the fault's (neither store
  orders samples within a step); one that left the GPU a step before is not. The values
  are this query's; in PromQL ``(<this query>) and on (node, uuid) (<on[0]> or <on[1]>
  ...)``.
- ``slices`` (with ``on``): also keep a kept step ``t`` of a series on a MIG slice where
  some query of ``on`` kept ``t`` for the slice's GPU (``gpu_info``'s ``parent_uuid``, on
  the same ``node``): a GPU in MIG mode is held through its slices, and board-level faults
  (throttling) are the GPU's. Such a series has a ``parent_uuid`` label besides ``node``
  and ``by`` (the GPU's uuid: a store's page may not know the slice), and is a series of
  its own beside one kept for its own uuid. The Prometheus store reads the slice's GPU
  from ``gpu_info`` at the step (``max_over_time`` over the step's range), the embedded
  store, which keeps ``gpu_info`` as last seen only, from those seen in the window (a
  slice's uuid names one GPU for good). In PromQL ``(<the above>) or ((<this query>) * on
  (node, uuid) group_left (parent_uuid) group by (node, uuid, parent_uuid)
  (max_over_time(gpu_info{parent_uuid!=""}[r])) and on (node, parent_uuid)
  label_replace(<on[0]> or ..., "parent_uuid", "$1", "uuid", "(.*)"))``.

The Prometheus store sends a list of step queries as one range query per round
(:func:`combined`): each query's text tagged with its position in a label of its own,
:data:`STEP_LABEL`, and the texts joined with ``or``; it splits the answer back by that
label. No query's ``by`` may name that label. The queries with ``on`` go in a second round,
asked of the devices their ``on`` flagged only (``promql(q, ..., among=...)``), their steps
kept where a device was flagged (``PrometheusStore.step_series``), and for ``slices`` the
slices of the GPUs flagged there (one more text: :func:`slices_promql`); :func:`promql` of a
query with ``on`` writes the same question in one text (``and on``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from gpuscope.dashboard.data.promql import any_of, duration, selector, summed_rate

Reduce = Literal["min", "max", "increase", "rate"]
Keep = Literal["<", ">", ">=", "<="]

REDUCE: frozenset[str] = frozenset({"min", "max", "increase", "rate"})
KEEP: frozenset[str] = frozenset({"<", ">", ">=", "<="})
#: The Prometheus store's default ``lookback`` (:class:`~.prometheus.PrometheusData`).
LOOKBACK = 60.0
#: A range is a millisecond short of its length (``prometheus.EDGE``): Prometheus 2 takes
#: the samples of ``[t - d, t]``, both ends, VictoriaMetrics and Prometheus 3 ``(t - d, t]``.
EDGE = 0.001

_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: A value :attr:`StepQuery.match` may name: literal in a regex without escaping.
_VALUE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")

#: The label :func:`combined` tags each query's series with (its position in the list), and
#: which no query's ``by`` may name: every series a step query answers has ``node`` and its
#: ``by`` alone (an aggregation), so that label cannot clash with one of the data's. Not a
#: name starting with ``__``: those are reserved for the store's own use (a store may drop
#: them from an answer), and ``by`` refuses them already.
STEP_LABEL = "gpuscope_step_query"


@dataclass(frozen=True, slots=True)
class StepQuery:
    """One metric reduced over each step (t - step, t] of the window, keeping only the steps
    whose value passes ``keep`` (so a healthy fleet answers with nothing). See the module's
    docstring for each reduction's range in each store."""

    metric: str                    # e.g. "gpu_up"; validated: [a-zA-Z_:][a-zA-Z0-9_:]*
    reduce: Reduce
    keep: Keep
    threshold: float
    by: tuple[str, ...] = ("gpu", "uuid")   # labels kept besides ``node``; validated label names
    #: Keep a step only where one of these flagged the same (node, uuid) at it (module
    #: docstring); each a StepQuery without ``on``, with ``uuid`` in its ``by`` (as this one).
    on: tuple[StepQuery, ...] = ()
    #: Only the series whose label has one of these values, as ``(label, (value, ...))``
    #: pairs (PromQL ``label=~"v1|v2"``, each value matched literally).
    match: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: The same question asked of the ``gpuscope-dashboard`` recording rules: a store whose
    #: rules are loaded for the window may answer it instead (same ``by``; the answer is
    #: keyed by this query). The embedded store has no rules and answers this query itself.
    recorded: StepQuery | None = None
    #: With ``on``: also keep a step of a series on a MIG slice where ``on`` flagged the
    #: slice's GPU at it, the series labelled with its ``parent_uuid`` (module docstring).
    slices: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not _METRIC.match(self.metric):
            raise ValueError(f"bad metric name {str(self.metric)[:80]!r}")
        if self.reduce not in REDUCE:
            raise ValueError(f"reduce must be one of {sorted(REDUCE)}, got {self.reduce!r}")
        if self.keep not in KEEP:
            raise ValueError(f"keep must be one of {sorted(KEEP)}, got {self.keep!r}")
        if (isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float)
                or not math.isfinite(self.threshold)):
            raise ValueError(f"threshold must be a finite number, got {self.threshold!r}")
        if not isinstance(self.by, tuple):
            raise ValueError(f"by must be a tuple of label names, got {self.by!r}")
        for label in self.by:
            if not isinstance(label, str) or not _LABEL.match(label) or label.startswith("__"):
                raise ValueError(f"bad label name {str(label)[:80]!r}")
            if label == "node":
                raise ValueError("'node' is always kept: leave it out of by")
            if label == STEP_LABEL:
                raise ValueError(f"{STEP_LABEL!r} tells the queries sent together apart: "
                                 "leave it out of by")
        if len(set(self.by)) != len(self.by):
            raise ValueError(f"a label twice in by: {self.by!r}")
        if not isinstance(self.on, tuple):
            raise ValueError(f"on must be a tuple of step queries, got {str(self.on)[:80]!r}")
        for other in self.on:
            if not isinstance(other, StepQuery):
                raise ValueError(f"on: not a StepQuery: {str(other)[:80]!r}")
            if other.on:
                raise ValueError(f"on: {other.metric} has an on of its own (one level only)")
            if "uuid" not in other.by:
                raise ValueError(f"on: {other.metric} must keep uuid in its by, got "
                                 f"{other.by!r}")
        if self.on and "uuid" not in self.by:
            raise ValueError(f"a query with on must keep uuid: by {self.by!r}")
        if not isinstance(self.slices, bool):
            raise ValueError(f"slices must be True or False, got {str(self.slices)[:80]!r}")
        if self.slices and not self.on:
            raise ValueError("slices: only with on (the GPUs whose slices are kept)")
        if self.slices and "parent_uuid" in self.by:
            raise ValueError("slices: parent_uuid labels the series kept through a GPU, "
                             "leave it out of by")
        if not isinstance(self.match, tuple):
            raise ValueError(f"match must be a tuple of (label, values), got {self.match!r}")
        for pair in self.match:
            if (not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str)
                    or not _LABEL.match(pair[0]) or pair[0].startswith("__")
                    or not isinstance(pair[1], tuple) or not pair[1]
                    or not all(isinstance(v, str) and _VALUE.match(v) for v in pair[1])):
                raise ValueError(f"bad match {str(pair)[:80]!r}: (label name, (value, ...)), "
                                 f"values of letters, digits, '_', '-' and '.'")
        if self.recorded is not None:
            r = self.recorded
            if not isinstance(r, StepQuery) or r.recorded is not None or r.on:
                raise ValueError("recorded: a StepQuery without recorded or on of its own")
            if r.by != self.by:
                raise ValueError(f"recorded: by {r.by!r} differs from {self.by!r}")

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels of each answer's series: ``node`` and :attr:`by`."""
        return ("node", *self.by)

    @property
    def metrics(self) -> frozenset[str]:
        """Every metric the query reads as a time series: its own and its :attr:`on`
        queries' (:attr:`slices` reads ``gpu_info`` too, which every store keeps)."""
        return frozenset({self.metric, *(q.metric for q in self.on)})

    @property
    def bare(self) -> StepQuery:
        """This query without :attr:`on` (nor :attr:`slices`)."""
        return replace(self, on=(), slices=False) if self.on else self

    def wants(self, labels: Mapping[str, str]) -> bool:
        """Whether a series with ``labels`` is one :attr:`match` asks for."""
        return all(labels.get(label, "") in values for label, values in self.match)

    @property
    def as_recorded(self) -> StepQuery:
        """The query a store with the recording rules sends: :attr:`recorded` for this one
        and for each query of its :attr:`on` that has one."""
        if self.recorded is not None:
            return self.recorded
        if any(o.recorded is not None for o in self.on):
            return replace(self, on=tuple(o.recorded or o for o in self.on))
        return self

    def passes(self, value: float) -> bool:
        """Whether a step's value is kept."""
        t = self.threshold
        if self.keep == "<":
            return value < t
        if self.keep == ">":
            return value > t
        if self.keep == "<=":
            return value <= t
        return value >= t


def ranges(step_seconds: float, lookback: float) -> tuple[float, float]:
    """A step's range for ``min``/``max`` (the step, at least ``lookback``) and for
    ``increase`` (that and ``lookback`` before it), in seconds, before :data:`EDGE`."""
    gauge = max(step_seconds, lookback)
    return gauge, gauge + lookback


def promql(q: StepQuery, step_seconds: float, lookback: float = LOOKBACK,
           among: Mapping[str, str] | None = None) -> str:
    """The PromQL of ``q`` for a range query at ``step_seconds``, e.g.
    ``min by (node, gpu, uuid) (min_over_time(gpu_up[59999ms])) < 1`` and
    ``sum by (node, gpu, uuid, xid) (increase(gpu_xid_errors_total[119999ms])) > 0``; with
    :attr:`~StepQuery.on`, ``(<that>) and on (node, uuid) (<on[0]'s> or <on[1]'s> ...)``,
    each query of ``on`` as this function writes it at the same step and lookback (``or``
    keeps every series of queries whose label sets differ, and at worst drops one whose
    labels equal an earlier one's, whose (node, uuid) is then there already). ``among``:
    matchers the store adds to the selector (raw PromQL matcher suffixes it built from the
    devices an ``on`` flagged, e.g. ``{"uuid": '=~"GPU-1|GPU-2"'}``)."""
    if not step_seconds > 0 or lookback < 0:
        raise ValueError("step must be positive and lookback not negative")
    if q.on:
        flagged = " or ".join(promql(other, step_seconds, lookback) for other in q.on)
        own = f"({promql(q.bare, step_seconds, lookback)}) and on (node, uuid) ({flagged})"
        if not q.slices:
            return own
        relabelled = f'label_replace({flagged}, "parent_uuid", "$1", "uuid", "(.*)")'
        return (f"({own}) or ({slices_promql(q, step_seconds, lookback)} "
                f"and on (node, parent_uuid) {relabelled})")
    gauge, counter = ranges(step_seconds, lookback)
    sel = selector(q.metric, {**{label: f'=~"{any_of(values)}"' for label, values in q.match},
                              **(among or {})})
    by = ", ".join(q.labels)
    if q.reduce == "rate":  # each pod's increase, the pods summed (module docstring)
        expr = summed_rate(sel, duration(counter - EDGE), by)
    elif q.reduce == "increase":
        expr = f"sum by ({by}) (increase({sel}[{duration(counter - EDGE)}]))"
    else:
        expr = f"{q.reduce} by ({by}) ({q.reduce}_over_time({sel}[{duration(gauge - EDGE)}]))"
    return f"{expr} {q.keep} {float(q.threshold)!r}"


def slices_promql(q: StepQuery, step_seconds: float, lookback: float = LOOKBACK,
                  among: Mapping[str, str] | None = None,
                  parents: Mapping[str, str] | None = None) -> str:
    """``q`` without its ``on`` (:attr:`~StepQuery.bare`) on MIG slices only, each series
    labelled with its slice's GPU (``parent_uuid``, from ``gpu_info`` at the step): ``(<q's
    text>) * on (node, uuid) group_left (parent_uuid) group by (node, uuid, parent_uuid)
    (max_over_time(gpu_info{parent_uuid!=""}[r]))``, ``r`` the range of a ``max`` step
    (``group`` answers 1: ``q``'s values are kept). ``among``: matchers added to ``q``'s
    selector (as :func:`promql`'s); ``parents``: to ``gpu_info``'s (raw PromQL matcher
    suffixes, e.g. ``{"parent_uuid": '=~"GPU-1"'}``), in place of ``parent_uuid!=""``."""
    gauge, _ = ranges(step_seconds, lookback)
    info = selector("gpu_info", dict(parents) if parents else {"parent_uuid": '!=""'})
    return (f"({promql(q.bare, step_seconds, lookback, among)}) * on (node, uuid) "
            f"group_left (parent_uuid) group by (node, uuid, parent_uuid) "
            f"(max_over_time({info}[{duration(gauge - EDGE)}]))")


def combined(texts: Mapping[int, str]) -> str:
    """One query for several step queries' texts (:func:`promql`), by position:
    ``label_replace(<text>, "gpuscope_step_query", "<i>", "", "") or ...``, each series
    tagged with its query's position ``i`` (:data:`STEP_LABEL`; the empty source label
    always matches the empty regex). ``or`` drops a right-hand series whose label set
    equals a left-hand one's at a step: the position label keeps every query's series
    apart. A text with ``on`` (``(...) and on (node, uuid) (...)``) is an argument of
    ``label_replace`` whole."""
    if not texts:
        raise ValueError("no query to combine")
    return " or ".join(f'label_replace({text}, "{STEP_LABEL}", "{i}", "", "")'
                       for i, text in texts.items())

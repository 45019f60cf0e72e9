"""A straggler's evidence beside its group's: throttling by reason, SM clock and temperature,
its own value against the medians of its workload's devices (:class:`StragglerEvidence`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuscope.dashboard.data.source import DataError
from gpuscope.dashboard.series import Evidence, GpuRef
from gpuscope.dashboard.verdicts.stragglers import (
    Compared,
    Group,
    Straggler,
    StragglerEvidence,
    StragglerReport,
    StragglerRow,
)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True, slots=True)
class _GroupEvidence:
    """The medians of a workload group's evidence (the straggler included, as the medians of
    the verdicts are)."""

    throttle: Mapping[str, float]
    sm_clock_hertz: float | None
    temperature_celsius: float | None


def _group_evidence(group: Group | None, evidence: Mapping[GpuRef, Evidence]) -> _GroupEvidence:
    # The devices with evidence (the Prometheus mode asks about a sample of a large group).
    everyone = [evidence[g] for g in (group.devices if group else ()) if g in evidence]
    reasons = {r for e in everyone for r in e.throttle}
    return _GroupEvidence(
        throttle={r: _median([e.throttle.get(r, 0.0) for e in everyone]) or 0.0
                  for r in reasons},
        sm_clock_hertz=_median([e.sm_clock_hertz for e in everyone
                                if e.sm_clock_hertz is not None]),
        temperature_celsius=_median([e.temperature_celsius for e in everyone
                                     if e.temperature_celsius is not None]),
    )


def _evidence(s: Straggler, group: _GroupEvidence, evidence: Mapping[GpuRef, Evidence],
              seconds: float) -> StragglerEvidence:
    own = evidence.get(s.gpu, Evidence())
    reasons = set(own.throttle) | set(group.throttle)
    return StragglerEvidence(
        throttle={r: Compared(own.throttle.get(r, 0.0), group.throttle.get(r, 0.0))
                  for r in sorted(reasons)},
        sm_clock_hertz=Compared(own.sm_clock_hertz, group.sm_clock_hertz),
        temperature_celsius=Compared(own.temperature_celsius, group.temperature_celsius),
        seconds=seconds,
    )


def _row_key(namespace: str, workload: str, ref: GpuRef, kind: str) -> tuple[str, ...]:
    return (namespace, workload, ref.node, ref.uuid, kind)


@dataclass(frozen=True, slots=True)
class RowEvidence:
    """The evidence of the straggler rows a page shows, read when they are shown
    (:meth:`__call__`): from ``read`` (the evidence of the given nodes' devices: the store's,
    :attr:`~gpuscope.dashboard.series.FleetData.read_evidence`, or the evidence in hand)
    for the nodes of the rows' groups alone, so a page reads the evidence of its first rows,
    not of every workload with a straggler; the rest when they are asked for ("show all
    rows", the CSV). ``seconds``: how far back the evidence looks."""

    report: StragglerReport
    read: Callable[[Collection[str]], Mapping[GpuRef, Evidence]]
    seconds: float

    def __call__(self, rows: Sequence[StragglerRow], first: int
                 ) -> tuple[tuple[StragglerRow, ...], str | None]:
        """``rows`` with the evidence of the first ``first`` of them read where it is not
        yet (one round of queries, none where there is nothing to read), and a line for
        the page's notes where the store failed (those rows' evidence stays unread)."""
        todo = [r for r in rows[:first] if r.evidence is None]
        if not todo:
            return tuple(rows), None
        groups = {g.key: g for g in self.report.groups}
        of = {_row_key(s.namespace, s.workload, s.gpu, s.kind): s
              for s in self.report.stragglers}
        wanted = [s for r in todo
                  if (s := of.get(_row_key(r.namespace, r.workload,
                                           GpuRef(r.node, r.uuid), r.kind))) is not None]
        nodes = {s.gpu.node for s in wanted} | {
            ref.node for s in wanted if (g := groups.get(s.key)) is not None
            for ref in g.devices}
        try:
            evidence = self.read(nodes)
        except DataError as exc:
            return tuple(rows), f"The stragglers' evidence could not be read ({exc})."
        medians = {s.key: _group_evidence(groups.get(s.key), evidence) for s in wanted}
        found = {_row_key(s.namespace, s.workload, s.gpu, s.kind):
                 _evidence(s, medians[s.key], evidence, self.seconds) for s in wanted}
        return tuple(
            replace(r, evidence=found.get(
                _row_key(r.namespace, r.workload, GpuRef(r.node, r.uuid), r.kind)))
            if r.evidence is None and i < first else r
            for i, r in enumerate(rows)), None

"""A straggler's evidence beside its group's: throttling by reason, SM clock and temperature,
its own value against the medians of its workload's devices (:class:`StragglerEvidence`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from gpuscope.dashboard.series import Evidence, GpuRef
from gpuscope.dashboard.verdicts.stragglers import (
    Compared,
    Group,
    Straggler,
    StragglerEvidence,
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

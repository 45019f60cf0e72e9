"""The verdicts, in the order the page shows them: one line each.

Like node_exporter's ``registerCollector``: a verdict module declares its section (title, help
text, stable ids, columns) and, where the registry judges it, the series it reads; this list
is the one place that names them all. The layout builds a section per entry, the fleet
callback fills each table by its id (:mod:`gpuscope.dashboard.sections`), and the data
stores are asked for every :class:`~.page.StepVerdict`'s queries in one round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.verdicts import (
    allocated,
    health,
    idle,
    mps,
    owners,
    spinning,
    starvation,
    stragglers,
    throttle,
)
from gpuscope.dashboard.verdicts.page import Section, StepVerdict, Threshold

if TYPE_CHECKING:
    from gpuscope.dashboard.verdicts import Thresholds

#: Every verdict, in page order (the fleet section comes first, the workload view and the
#: drill-downs after these): the section of a verdict judged in the views, or a verdict the
#: registry judges itself.
PAGE: tuple[Section | StepVerdict, ...] = (
    idle.SECTION,
    owners.SECTION,
    allocated.SECTION,
    spinning.SECTION,
    throttle.VERDICT,
    health.VERDICT,
    starvation.SECTION,
    mps.VERDICT,
    stragglers.SECTION,
)

#: Every verdict's section, in page order.
SECTIONS: tuple[Section, ...] = tuple(
    e.section if isinstance(e, StepVerdict) else e for e in PAGE)

#: The verdicts the registry judges itself, on the series they ask for.
STEP_VERDICTS: tuple[StepVerdict, ...] = tuple(e for e in PAGE if isinstance(e, StepVerdict))


#: Every verdict's thresholds, in page order: the dashboard's flags
#: (:mod:`gpuscope.dashboard.cli`) and the fields of
#: :class:`~gpuscope.dashboard.verdicts.Thresholds` (a test keeps the two the same).
THRESHOLDS: tuple[Threshold, ...] = (
    *idle.THRESHOLDS, *allocated.THRESHOLDS, *spinning.THRESHOLDS, *throttle.THRESHOLDS,
    *starvation.THRESHOLDS, *stragglers.THRESHOLDS,
)


def step_queries(th: Thresholds | None = None) -> tuple[StepQuery, ...]:
    """Every query of :data:`STEP_VERDICTS` at the thresholds ``th`` (None: the defaults),
    once each, in registry order."""
    seen: dict[StepQuery, None] = {}
    for verdict in STEP_VERDICTS:
        for q in verdict.step_queries(th):
            seen.setdefault(q, None)
    return tuple(seen)


def step_metrics() -> frozenset[str]:
    """Every metric the step queries read (an embedded store must keep them)."""
    return frozenset(m for q in step_queries() for m in q.metrics)

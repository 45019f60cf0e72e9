"""The fleet page's verdict sections, filled from a :class:`~gpuscope.dashboard.views.FleetView`:
each table's rows and the note under it, each section's header, addressed by element id.

The sections and their tables come from :mod:`gpuscope.dashboard.verdicts.registry`. A
:class:`~gpuscope.dashboard.verdicts.page.StepVerdict` renders its own rows; the verdicts
judged in :mod:`gpuscope.dashboard.views` have theirs in :mod:`.components`, named here by
table id. :func:`outputs` lists every (id, property) the fleet callback writes, and
:func:`fill` gives their values, so the callback returns a dict by id, not a tuple by
position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuscope.dashboard import components, fmt, ids
from gpuscope.dashboard.components import MAX_TABLE_ROWS as MAX_ROWS
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.page import PageContext, Row, State, StepVerdict
from gpuscope.dashboard.views import FleetView

#: A table's rows (at most :data:`MAX_ROWS`) and the note under it.
Filler = Callable[[FleetView, State], tuple[list[Row], str]]


def _idle(v: FleetView, s: State) -> tuple[list[Row], str]:
    return (components.idle_data(v.idle_rows[:MAX_ROWS], s),
            components.count_note(len(v.idle_rows), "idle node", "idle nodes",
                                  "No idle nodes."))


def _slices(v: FleetView, s: State) -> tuple[list[Row], str]:
    return (components.slice_data(v.slice_rows[:MAX_ROWS], s),
            components.count_note(len(v.slice_rows), "idle MIG slice on a busy node",
                                  "idle MIG slices on busy nodes",
                                  "No idle MIG slice on a busy node."))


def _allocated(v: FleetView, s: State) -> tuple[list[Row], str]:
    rows = v.allocated_idle_rows
    return (components.allocated_data(rows[:MAX_ROWS], s),
            components.count_note(len(rows), "allocated-idle container",
                                  "allocated-idle containers",
                                  "No container holds a GPU it does not use.")
            + (f" Together {fmt.money(v.kpis.allocated_idle_per_hour, per_hour=True)}."
               if rows else ""))


def _spinning(v: FleetView, s: State) -> tuple[list[Row], str]:
    return (components.spinning_data(v.spinning_rows[:MAX_ROWS], s),
            components.count_note(len(v.spinning_rows), "spinning GPU", "spinning GPUs",
                                  "No spinning GPUs."))


def _throttled(v: FleetView, s: State) -> tuple[list[Row], str]:
    return (components.throttled_data(v.throttled_rows[:MAX_ROWS], s),
            components.count_note(len(v.throttled_rows), "throttled GPU (by reason)",
                                  "throttled GPUs (by reason)", "No throttled GPUs."))


def _starved(v: FleetView, s: State) -> tuple[list[Row], str]:
    return (components.starved_data(v.starved_rows[:MAX_ROWS], s),
            components.count_note(len(v.starved_rows), "starved container",
                                  "starved containers", "No starved containers."))


def _shares(v: FleetView, s: State) -> tuple[list[Row], str]:
    return (components.share_data(v.share_rows[:MAX_ROWS], s),
            components.count_note(len(v.share_rows), "container on a time-sliced GPU",
                                  "containers on time-sliced GPUs",
                                  "No GPU is shared by several containers (time-slicing)."))


def _stragglers(v: FleetView, s: State) -> tuple[list[Row], str]:
    return (components.straggler_data(v.straggler_rows[:MAX_ROWS], s),
            components.count_note(len(v.straggler_rows), "straggler", "stragglers",
                                  "No stragglers.")
            + f" {v.workloads_checked} workload(s) with two or more GPUs compared.")


#: The tables of the verdicts judged in views, by table id.
FILLERS: dict[str, Filler] = {
    ids.IDLE_NODES_TABLE: _idle,
    ids.IDLE_SLICES_TABLE: _slices,
    ids.ALLOCATED_IDLE_TABLE: _allocated,
    ids.SPINNING_GPUS_TABLE: _spinning,
    ids.THROTTLED_GPUS_TABLE: _throttled,
    ids.STARVED_PODS_TABLE: _starved,
    ids.TIMESLICE_TABLE: _shares,
    ids.STRAGGLERS_TABLE: _stragglers,
}

#: Section headers, by element id.
HEADERS: dict[str, Callable[[FleetView], Any]] = {ids.WASTE_TOTAL: components.waste_total}


def _step_verdicts() -> dict[str, StepVerdict]:
    """The registry's own verdicts, by their table's id."""
    return {t.id: v for v in registry.STEP_VERDICTS for t in v.section.tables}


def outputs() -> list[tuple[str, str]]:
    """Every (element id, property) of the verdict sections the fleet callback writes, in
    page order."""
    out: list[tuple[str, str]] = []
    for section in registry.SECTIONS:
        if section.header_id:
            out.append((section.header_id, "children"))
        for table in section.tables:
            out += [(table.id, "data"), (table.note_id, "children")]
    return out


def missing() -> list[str]:
    """The registry's tables and headers that nothing here fills (a test keeps it empty)."""
    own = _step_verdicts()
    out = []
    for section in registry.SECTIONS:
        if section.header_id and section.header_id not in HEADERS:
            out.append(section.header_id)
        out += [t.id for t in section.tables if t.id not in FILLERS and t.id not in own]
    return out


def fill(view: FleetView, state: State) -> dict[tuple[str, str], Any]:
    """The values of :func:`outputs` for ``view``."""
    own = _step_verdicts()
    out: dict[tuple[str, str], Any] = {}
    for section in registry.SECTIONS:
        if section.header_id:
            out[(section.header_id, "children")] = HEADERS[section.header_id](view)
        for table in section.tables:
            verdict = own.get(table.id)
            if verdict is not None:
                ctx = view.context or PageContext(view.window, view.history_start)
                found = view.findings.get(verdict.name, ())
                rows = verdict.rows(found[:MAX_ROWS], ctx, state)
                note = verdict.note(found, ctx) + components.cap_note(len(found))
            else:
                rows, note = FILLERS[table.id](view, state)
            out[(table.id, "data")] = rows
            out[(table.note_id, "children")] = note
    return out

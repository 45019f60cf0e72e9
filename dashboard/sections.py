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

import csv
import functools
import io
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpuscope.dashboard import components, fmt, ids
from gpuscope.dashboard.verdicts import (
    allocated,
    idle,
    owners,
    registry,
    spinning,
    starvation,
    stragglers,
)
from gpuscope.dashboard.verdicts.page import PageContext, Row, State, StepVerdict, Table
from gpuscope.dashboard.views import TOP_ROWS as TOP_ROWS
from gpuscope.dashboard.views import FleetView

#: A table's rows (at most ``limit``), the note under it, and how many rows there are.
Filler = Callable[[FleetView, State, int], tuple[list[Row], str, int]]


def _idle(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
    n = len(v.idle_rows)
    return (idle.idle_data(v.idle_rows[:limit], s),
            components.count_note(n, "idle node", "idle nodes", "No idle nodes."), n)


def _slices(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
    n = len(v.slice_rows)
    return (idle.slice_data(v.slice_rows[:limit], s),
            components.count_note(n, "idle MIG slice on a busy node",
                                  "idle MIG slices on busy nodes",
                                  "No idle MIG slice on a busy node."), n)


def _allocated(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
    rows = v.allocated_idle_rows
    # A row is a container on one device: a container that holds two GPUs has two rows,
    # and is one container.
    containers = len({(r.node, r.namespace, r.pod, r.container) for r in rows})
    if not rows:
        note = "No container holds a GPU it does not use."
    else:
        devices = f", on {len(rows)} devices" if containers != len(rows) else ""
        note = (f"{containers} allocated-idle container{'s' if containers != 1 else ''}"
                f"{devices}. Together "
                f"{fmt.money(v.kpis.allocated_idle_per_hour, per_hour=True)}.")
    return allocated.allocated_data(rows[:limit], s), note, len(rows)


def _spinning(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
    n = len(v.spinning_rows)
    return (spinning.spinning_data(v.spinning_rows[:limit], s),
            components.count_note(n, "spinning GPU", "spinning GPUs", "No spinning GPUs."), n)


def _starved(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
    n = len(v.starved_rows)
    return (starvation.starved_data(v.starved_rows[:limit], s),
            components.count_note(n, "starved container", "starved containers",
                                  "No starved containers."), n)


def _shares(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
    n = len(v.share_rows)
    return (starvation.share_data(v.share_rows[:limit], s),
            components.count_note(n, "container on a time-sliced GPU",
                                  "containers on time-sliced GPUs",
                                  "No GPU is shared by several containers (time-slicing)."), n)


def _stragglers(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
    n = len(v.straggler_rows)
    return (stragglers.straggler_data(v.straggler_rows[:limit], s),
            components.count_note(n, "straggler", "stragglers", "No stragglers.")
            + f" {v.workloads_checked} workload(s) with two or more GPUs compared.", n)


def _owners(level: str) -> Filler:
    """A showback table (:mod:`.verdicts.owners`) at ``level``: ``cluster``, ``namespace``
    or ``workload``."""
    def fill(v: FleetView, s: State, limit: int) -> tuple[list[Row], str, int]:
        rows = (v.owners if level == "workload" else
                owners.rollup(v.owners, by_namespace=level == "namespace"))
        # The rows' own sums: with a namespace filter the rows are that namespace's, and
        # the page's idle KPI is the fleet's.
        total = math.fsum(r.spent for r in rows)
        idle_total = math.fsum(r.idle for r in rows)
        unpriced = math.fsum(r.unpriced_gpu_hours for r in rows)
        note = (f"{len(rows):,} {level}{'s' if len(rows) != 1 else ''}; together "
                f"{fmt.money(total)} spent and {fmt.money(idle_total)} idle in the "
                f"window." if rows else "Nothing held or priced in this window.")
        if unpriced > 0:  # (their dollars are not known: not in the sums, never $0)
            note += (f" {unpriced:,.2f} GPU-hours on nodes of unknown price are in no "
                     f"dollar column.")
        return owners.owner_rows(rows[:limit], v.kpis.wasted, s), note, len(rows)
    return fill


#: The tables of the verdicts judged in views, by table id.
FILLERS: dict[str, Filler] = {
    ids.IDLE_NODES_TABLE: _idle,
    ids.IDLE_SLICES_TABLE: _slices,
    ids.ALLOCATED_IDLE_TABLE: _allocated,
    ids.SPINNING_GPUS_TABLE: _spinning,
    ids.STARVED_PODS_TABLE: _starved,
    ids.TIMESLICE_TABLE: _shares,
    ids.STRAGGLERS_TABLE: _stragglers,
    ids.COST_BY_CLUSTER_TABLE: _owners("cluster"),
    ids.COST_BY_NAMESPACE_TABLE: _owners("namespace"),
    ids.COST_BY_WORKLOAD_TABLE: _owners("workload"),
}

#: Section headers, by element id.
HEADERS: dict[str, Callable[[FleetView], Any]] = {ids.WASTE_TOTAL: components.waste_total}


@functools.cache
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


#: The most rows "Show all rows" sends (the CSV has every row).
MAX_ROWS = 5000


def table_rows(view: FleetView, table_id: str, state: State, limit: int
               ) -> tuple[list[Row], str, int]:
    """One table's rows (at most ``limit``), its note (how many there are, and how many are
    shown) and its number of rows."""
    verdict = _step_verdicts().get(table_id)
    if verdict is not None:
        ctx = view.context or PageContext(view.window, view.history_start)
        found = view.findings.get(verdict.name, ())
        rows, note, n = verdict.rows(found[:limit], ctx, state), verdict.note(found, ctx), \
            len(found)
    else:
        rows, note, n = FILLERS[table_id](view, state, limit)
    if n > len(rows):
        note += (f" The table shows the first {len(rows):,} of {n:,} (in its order): "
                 f"show all rows or download them as CSV below it.")
    return rows, note, n


def tables() -> list[Table]:
    """Every verdict table, in page order."""
    return [t for section in registry.SECTIONS for t in section.tables]


def more_id(table_id: str) -> str:
    """The id of a table's "Show all rows" button."""
    return f"{table_id}-more"


def more_answer_id(table_id: str) -> str:
    """The id of the store that takes a table's "Show all rows" answer, with the view it was
    asked for, before the page lets it into the table (a late answer for another view is
    dropped: :func:`gpuscope.dashboard.callbacks.table_more_answer`)."""
    return f"{table_id}-more-answer"


def csv_id(table_id: str) -> str:
    """The id of a table's "Download CSV" button (its download: ``-file``)."""
    return f"{table_id}-csv"


def fill(view: FleetView, state: State, limits: Mapping[str, int] | None = None
         ) -> dict[tuple[str, str], Any]:
    """The values of :func:`outputs` for ``view``; each table's first :data:`TOP_ROWS`
    rows, or as many as ``limits`` says for it ("show all rows")."""
    limits = limits or {}
    out: dict[tuple[str, str], Any] = {}
    for section in registry.SECTIONS:
        if section.header_id:
            out[(section.header_id, "children")] = HEADERS[section.header_id](view)
        for table in section.tables:
            rows, note, _ = table_rows(view, table.id, state,
                                       min(MAX_ROWS, limits.get(table.id, TOP_ROWS)))
            out[(table.id, "data")] = rows
            out[(table.note_id, "children")] = note
    return out


_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")

#: What a spreadsheet takes for the start of a formula (OWASP's CSV injection list): a
#: text cell beginning with one of them (a pod, node or workload label, which nothing
#: checks in a store) is written after a ``'``, so it opens as text, never as a formula.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: object) -> object:
    """One CSV cell: a link as its text, text that would start a formula quoted, numbers as
    they are (a negative number stays a number)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return value
    text = _LINK.sub(r"\1", value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def csv_text(view: FleetView, table_id: str) -> str:
    """Every row of one table as CSV, with a header of its column names; links as their
    text, and text that a spreadsheet would run as a formula after a ``'``."""
    columns = next(t.columns for s in registry.SECTIONS for t in s.tables if t.id == table_id)
    rows = table_rows(view, table_id, {}, 1 << 30)[0]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([c.name for c in columns])
    for row in rows:
        writer.writerow([_csv_cell(row.get(c.csv or c.id)) for c in columns])
    return buffer.getvalue()

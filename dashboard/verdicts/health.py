"""GPU health: GPUs that are broken or about to be, each on a node that is paid for and
cannot run its job.

A GPU is listed when, at some step of the window:

- it was lost or failing: ``gpu_up`` below 1 (NVML answered GPU_IS_LOST or an unexpected
  error: off the bus, or a driver fault);
- it raised a critical XID (one of :data:`CRITICAL_XIDS`, NVIDIA's list of XIDs that need a
  GPU reset, a node drain or a replacement): the exporter received the code's last event in
  the window (``gpu_xid_last_seen_timestamp_seconds``), or, from an exporter that does not
  serve that time, ``gpu_xid_errors_total`` grew;
- it had uncorrectable ECC errors since its last reset (``gpu_ecc_uncorrected_errors_total``
  above 0: the driver's volatile count, back to 0 only at a GPU reset or driver reload;
  until then the GPU needs one, as the ``GpuEccUncorrected`` alert says);
- a row remap is pending (``gpu_row_remap_pending``: the GPU must be reset to apply it) or
  has failed (``gpu_row_remap_failed``: the GPU should be replaced).

One row per GPU: node, GPU, what was seen, since when (the first step it was seen in the
window: "or earlier" where that is the window's first step), whether it still holds at the
latest step, the pods on the GPU, and the node's $/hour. Sorted by $/hour, then node and GPU.
The store answers with the flagged steps only (a healthy fleet answers nothing), so the
page's cost does not grow with the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuscope.dashboard import fmt
from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.links import at_node, node_link, pod_link
from gpuscope.dashboard.series import GpuRef, Series, index_key
from gpuscope.dashboard.verdicts.cells import first_step_cell
from gpuscope.dashboard.verdicts.page import (
    Column,
    PageContext,
    Row,
    Section,
    State,
    StepAnswers,
    StepVerdict,
    Table,
    device_ref,
)

#: XIDs that mean the GPU needs a reset, a drain or a replacement (NVIDIA's XID catalog),
#: with what each says: the ``GpuXidCritical`` alert's codes (alerts/gpuscope-rules.yaml;
#: a test keeps the two the same, so that the page and the alert agree about a GPU).
CRITICAL_XIDS: Mapping[str, str] = {
    "48": "double-bit ECC error",
    "63": "ECC page retirement or row remap recorded",
    "64": "ECC page retirement or row remap failed",
    "74": "NVLink error",
    "79": "fallen off the bus",
    "92": "high single-bit ECC error rate",
    "94": "contained ECC error",
    "95": "uncontained ECC error",
    "119": "GSP RPC timeout",
    "120": "GSP firmware error",
    "154": "recovery action changed: reset or reboot required",
}

LOST = StepQuery("gpu_up", "min", "<", 1.0)
# The counters are read as their highest value per step, not as increase(): the store then
# answers only for GPUs that ever counted one (rare), and the rises are found here the same
# way on every store. increase() would miss the first XID of a GPU: the exporter's counter
# appears with it, at 1, and Prometheus counts no increase for a series' first sample
# (VictoriaMetrics does, by a heuristic: the two would disagree).
XID = StepQuery("gpu_xid_errors_total", "max", ">", 0.0, by=("gpu", "uuid", "xid"))
ECC = StepQuery("gpu_ecc_uncorrected_errors_total", "max", ">", 0.0)
REMAP_PENDING = StepQuery("gpu_row_remap_pending", "max", ">", 0.0)
REMAP_FAILED = StepQuery("gpu_row_remap_failed", "max", ">", 0.0)
#: When the exporter received each code's last event (seconds since the epoch, by its
#: clock), highest per step: each value in the window is an event in it. The counter cannot
#: tell a repeat after the exporter restarted (a new counter at 1, the value the old one
#: showed), nor, on a store younger than a step or so of the window, a count from before
#: the window from one in it; the time does.
XID_SEEN = StepQuery("gpu_xid_last_seen_timestamp_seconds", "max", ">", 0.0,
                     by=("gpu", "uuid", "xid"))
#: The containers that held each flagged GPU while it was flagged: the fleet page's own data
#: names only the holders its other findings needed (the Prometheus path).
HOLDERS = StepQuery("container_gpu_allocated", "max", ">", 0.0,
                    by=("namespace", "pod", "container", "uuid"),
                    on=(LOST, XID, ECC, REMAP_PENDING, REMAP_FAILED))


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing seen on a GPU: what, its first and last flagged step (seconds since the
    epoch), how much (XIDs raised in the window; ECC errors counted since the GPU's last
    reset, at its last flagged step; 0 for the other states), and
    whether it still held at the window's latest step."""

    what: str
    first: float
    last: float
    count: float
    now: bool


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """A GPU with problems in the window (:class:`Problem`, first seen first); ``since``:
    the earliest; ``price_per_hour``: its node's $/hour (None: unknown price)."""

    ref: GpuRef
    gpu: str
    problems: tuple[Problem, ...]
    since: float
    pods: tuple[str, ...]
    price_per_hour: float | None
    price_basis: str = "on-demand"

    @property
    def now(self) -> bool:
        """A problem still holds at the window's latest step."""
        return any(p.now for p in self.problems)


def _problem(what: str, series: Series, latest: float, step: float,
             count: float = 0.0) -> Problem:
    """A state (lost, uncorrectable ECC errors, remap pending or failed) over its flagged
    steps (the store answers with those alone)."""
    return Problem(what, series.times[0], series.times[-1], count,
                   series.times[-1] >= latest - 1.5 * step)


def _rises(series: Series, start: float, step: float) -> list[tuple[float, float]]:
    """The steps at which a counter (its highest value per step) rose, and by how much: a
    rise over the step before it; a drop is a reset (the exporter restarted), counted from
    0; a series that first appears after the window's first step appeared with its count
    (the exporter serves an XID's counter from the first one on). A gap of more than a
    step and a half counts as a rise only if the value grew across it."""
    out = []
    times, values = series.times, series.values
    if times and times[0] > start + 1.5 * step and values[0] > 0:
        out.append((times[0], values[0]))
    for i in range(1, len(times)):
        before, now = values[i - 1], values[i]
        grown = now - before if now >= before else now
        if grown > 0:
            out.append((times[i], grown))
    return out


def _event(what: str, series: Series, start: float, latest: float,
           step: float) -> Problem | None:
    """A counter's rises in the window as one problem, or None when it did not rise."""
    rises = _rises(series, start, step)
    if not rises:
        return None
    return Problem(what, rises[0][0], rises[-1][0], sum(n for _, n in rises),
                   rises[-1][0] >= latest - 1.5 * step)


def _seen(what: str, seen: Series, counted: Problem | None, window_start: float,
          latest: float, step: float) -> Problem | None:
    """The events of one code whose times (``seen``: the last event's time, per step) fall
    in the window (after ``window_start``, up to a step past ``latest``: an exporter's clock
    a little ahead), each at the step it fell in, as one problem; at least as many as the
    counter's rises (``counted``: several events of one step leave one time). None when
    none did, whatever the counter says: the time is the exporter's own record."""
    times = sorted({v for v in seen.values if window_start < v <= latest + step})
    if not times:
        return None

    def at_step(t: float) -> float:
        """The end of the window's step ``t`` fell in."""
        return min(latest, window_start + math.ceil((t - window_start) / step) * step)

    first, last = at_step(times[0]), at_step(times[-1])
    return Problem(what, first, last, max(len(times), counted.count if counted else 0),
                   last >= latest - 1.5 * step)


def _health_ref(labels: Mapping[str, str]) -> GpuRef:
    """The GPU a health series is about. A GPU NVML could not open when the exporter started
    (lost: no handle, so no UUID) is served with its index and an empty ``uuid``; two such
    GPUs of one node are told apart by their index (``gpu``), never merged into one row."""
    ref = device_ref(labels)
    if ref.uuid:
        return ref
    return GpuRef(ref.node, f"gpu {labels.get('gpu', '')}")


def _fold_unnamed(found: dict[GpuRef, list[Problem]], index: dict[GpuRef, str]) -> None:
    """A GPU lost while an exporter ran (its UUID on its series) and served without a UUID
    after the exporter restarted (its index alone, :func:`_health_ref`) is one GPU: the
    unnamed one's problems go to the one named GPU of its node and index in the window
    (none where two named GPUs had that index), a state seen under both names as one."""
    named: dict[tuple[str, str], list[GpuRef]] = {}
    for ref in found:
        if not ref.uuid.startswith("gpu "):
            named.setdefault((ref.node, index[ref]), []).append(ref)
    for ref in [r for r in found if r.uuid.startswith("gpu ")]:
        into = named.get((ref.node, index[ref]), [])
        if len(into) != 1:
            continue
        merged = {p.what: p for p in found[into[0]]}
        for p in found.pop(ref):
            q = merged.get(p.what)
            merged[p.what] = p if q is None else Problem(
                p.what, min(p.first, q.first), max(p.last, q.last), max(p.count, q.count),
                p.now or q.now)
        found[into[0]] = list(merged.values())
        del index[ref]


class Health(StepVerdict):
    """The GPU-health verdict (module docstring)."""

    name: ClassVar[str] = "gpu-health"
    queries: ClassVar[tuple[StepQuery, ...]] = (LOST, XID, XID_SEEN, ECC, REMAP_PENDING,
                                                REMAP_FAILED, HOLDERS)
    section: ClassVar[Section] = Section(
        id="section-gpu-health", title="GPU health",
        intro="GPUs lost or fallen off the bus, critical XID errors, uncorrectable ECC "
              "errors and pending or failed row remaps in the window: the node is paid for "
              "and its job cannot run there. Reset, drain or replace.",
        tables=(Table("gpu-health-table", "gpu-health-note", (
            Column("node", "Node", "link"), Column("gpu", "GPU"),
            Column("what", "What", csv="what_csv"),
            Column("since", "Since (UTC)", csv="since_csv"), Column("now", "Now"),
            # (The CSV names each pod with its namespace: the links show the pod alone.)
            Column("pods", "Pods", "link", csv="pods_csv"),
            Column("price", "Node $/hour", "money"),
        ), order="price"),),
    )

    def judge(self, answers: StepAnswers, ctx: PageContext) -> tuple[GpuHealth, ...]:
        latest, step = ctx.window.end, ctx.window.step
        found: dict[GpuRef, list[Problem]] = {}
        index: dict[GpuRef, str] = {}

        def add(lab: Mapping[str, str], problem: Problem) -> None:
            ref = _health_ref(lab)
            found.setdefault(ref, []).append(problem)
            index.setdefault(ref, lab.get("gpu", ""))

        # A counter that appears after this appeared with its count (see _rises).
        start = max(ctx.window.start, ctx.history_start)
        for lab, s in answers.get(LOST, ()):
            if len(s):
                add(lab, _problem("lost or failing (gpu_up 0)", s, latest, step))
        seen = {(device_ref(lab), lab.get("xid", "")): s
                for lab, s in answers.get(XID_SEEN, ()) if len(s)}
        for lab, s in answers.get(XID, ()):
            xid = lab.get("xid", "")
            if xid not in CRITICAL_XIDS:
                continue
            key = (device_ref(lab), xid)
            what = f"XID {xid}: {CRITICAL_XIDS[xid]}"
            e = _event(what, s, start, latest, step)
            if key in seen:  # (the exporter serves the time with the counter: it decides)
                e = _seen(what, seen[key], e, ctx.window.start, latest, step)
            if e is not None:
                add(lab, e)
        for lab, s in answers.get(ECC, ()):
            # A state, not an event: the count is since the GPU's last reset, and a GPU
            # with any still needs one (an error from before the window too, as the alert).
            if len(s):
                add(lab, _problem("uncorrectable ECC errors since the GPU's last reset", s,
                                  latest, step, count=s.values[-1]))
        for lab, s in answers.get(REMAP_PENDING, ()):
            if len(s):
                add(lab, _problem("row remap pending (reset the GPU)", s, latest, step))
        for lab, s in answers.get(REMAP_FAILED, ()):
            if len(s):
                add(lab, _problem("row remap failed (replace the GPU)", s, latest, step))
        _fold_unnamed(found, index)
        holders: dict[GpuRef, set[str]] = {}
        for lab, s in answers.get(HOLDERS, ()):
            if len(s) and lab.get("namespace"):
                pod = f"{lab['namespace']}/{lab.get('pod', '')}"
                holders.setdefault(device_ref(lab), set()).add(pod)
        out = []
        for ref, problems in found.items():
            info = ctx.gpus.get(ref)
            pods = tuple(sorted(holders.get(ref, set()) | set(ctx.pods.get(ref, ()))))
            if ctx.namespace is not None and not any(
                    p.partition("/")[0] == ctx.namespace for p in pods):
                continue
            problems.sort(key=lambda p: (p.first, p.what))
            out.append(GpuHealth(
                ref=ref, gpu=info.gpu if info is not None else index[ref],
                problems=tuple(problems), since=problems[0].first, pods=pods,
                price_per_hour=ctx.node_price.get(ref.node),
                price_basis=ctx.price_basis.get(ref.node, "on-demand"),
            ))
        out.sort(key=lambda h: (-(h.price_per_hour or 0.0), h.ref.node, index_key(h.gpu),
                                h.ref.uuid))
        return tuple(out)

    def rows(self, findings: Sequence[GpuHealth], ctx: PageContext, state: State
             ) -> list[Row]:
        rows: list[Row] = []
        for h in findings:
            def what(show: Callable[[float], str], h: GpuHealth = h) -> str:
                return "; ".join(
                    p.what + (f" ({p.count:g})" if p.count else "")
                    + ("" if p.now else f", last {show(p.last)}") for p in h.problems)
            pods = ", ".join(pod_link(*p.partition("/")[::2], at_node(state, h.ref.node))
                             for p in h.pods)
            rows.append({
                "node": node_link(h.ref.node, state), "gpu": h.gpu,
                "what": what(fmt.clock), "what_csv": what(fmt.stamp),
                "since": first_step_cell(h.since, ctx),
                "since_csv": first_step_cell(h.since, ctx, fmt.stamp),
                "now": "yes" if h.now else "no (in the window)",
                "pods": pods or "(no pod)", "pods_csv": ", ".join(h.pods) or "(no pod)",
                "price": h.price_per_hour,
            })
        return rows

    def note(self, findings: Sequence[GpuHealth], ctx: PageContext) -> str:
        if not findings:
            # (Under a namespace filter, another namespace's GPUs may have some.)
            return ("No GPU problems in this window." if ctx.namespace is None else
                    f"No GPU problems in this window on the GPUs of namespace "
                    f"{ctx.namespace}.")
        nodes = {h.ref.node: h.price_per_hour for h in findings}
        cost = sum(p for p in nodes.values() if p is not None)
        return (f"{len(findings)} GPU{'s' if len(findings) != 1 else ''} with problems on "
                f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, "
                f"{fmt.money(cost, per_hour=True)} of nodes that cannot run their jobs "
                f"in full.")


VERDICT = Health()

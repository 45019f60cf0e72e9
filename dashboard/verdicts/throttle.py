"""Throttled GPUs: clocks held down for a reason the SRE can act on.

A GPU is throttled for a reason when ``rate(gpu_throttle_seconds_total{reason})`` (seconds
of throttling per second) is >= ``ratio`` (0.2) at every step for >= ``duration`` (10 min,
shortened to the window and the history collected). Only the reasons that point at the
machine count (``power``, ``thermal``, ``reliability``, ``board_limit``): ``low_utilization``
(idle clocks), ``sync_boost``, ``app_clocks`` and ``base_clocks`` are settings, not faults.

The registry judges it (:class:`Throttle`): the store answers :func:`queries`, the steps at
or above the ratio for the reasons that count (with the recording rules, from the recorded
``uuid:gpu_throttle_any_ratio:rate2m``), and the containers that held each such GPU at
those steps, for a GPU in MIG mode, which pods hold through its slices (throttling is
board-level, the slices have none of their own), those that held its slices (the step
query's ``slices``); a fleet without throttling answers nothing. A row's pods are those,
and the pods the page saw on the GPU or its slices. One row per (GPU, reason), the
costliest node first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from gpuscope.dashboard import fmt, ids
from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.links import at_node, node_link, pod_link
from gpuscope.dashboard.series import GpuRef, Series, Window, index_key
from gpuscope.dashboard.verdicts.common import holds, is_fresh, required_seconds, trailing_run
from gpuscope.dashboard.verdicts.page import (
    Column,
    PageContext,
    Row,
    Section,
    State,
    StepAnswers,
    StepVerdict,
    Table,
    Threshold,
    device_ref,
)
from gpuscope.exporter.model import THROTTLE_REASONS as EXPORTER_REASONS

if TYPE_CHECKING:  # the package's __init__ imports this module's defaults
    from gpuscope.dashboard.verdicts import Thresholds

THROTTLE_REASONS: tuple[str, ...] = ("power", "thermal", "reliability", "board_limit")
THROTTLE_RATIO = 0.2
THROTTLE_DURATION = 10 * 60.0

THRESHOLDS = (
    Threshold("throttle_ratio", "ratio",
              "a GPU is throttled for a reason held down this share of the time or more"),
    Threshold("throttle_duration", "seconds", "... for at least this long"),
    Threshold("throttle_reasons", "names",
              "the throttle reasons that count (gpu_throttle_seconds_total's reason label)",
              choices=EXPORTER_REASONS),
)


@dataclass(frozen=True, slots=True)
class Throttled:
    """One GPU throttled for one reason: ``ratio``, the mean throttle seconds per second
    over the run; ``since`` (seconds since the epoch) and ``seconds``, the run; what the
    verdict required; the GPU's index, the pods that held it while throttled, and its
    node's $/hour (None: unknown price), set by :class:`Throttle`."""

    ref: GpuRef
    reason: str
    ratio: float
    since: float
    seconds: float
    required_seconds: float
    gpu: str = ""
    pods: tuple[str, ...] = ()
    price_per_hour: float | None = None

    @property
    def node(self) -> str:
        return self.ref.node


def throttled_gpus(
    throttle: Mapping[GpuRef, Mapping[str, Series]],
    window: Window,
    history_start: float,
    *,
    reasons: tuple[str, ...] = THROTTLE_REASONS,
    ratio: float = THROTTLE_RATIO,
    duration: float = THROTTLE_DURATION,
) -> list[Throttled]:
    """One entry per (device, reason) throttled for long enough, worst first per device."""
    required = required_seconds(duration, window, history_start)
    out: list[Throttled] = []
    for ref, by_reason in throttle.items():
        for reason, series in by_reason.items():
            if reason not in reasons or not is_fresh(series.times, window):
                continue
            flags = [v >= ratio for v in series.values]
            run = trailing_run(series.times, flags, window.step, history_start)
            if run is None or not holds(run, required):
                continue
            values = series.values[run.first_index:]
            out.append(Throttled(ref, reason, sum(values) / len(values), run.start,
                                 run.seconds, required))
    out.sort(key=lambda t: (t.ref, -t.ratio, t.reason))
    return out


# -- judged by the registry -----------------------------------------------------------------

#: The recorded form's metric: per device and reason, throttle seconds per second where above
#: 0, every minute (alerts/gpuscope-rules.yaml, ``gpuscope-dashboard``).
RECORDED_THROTTLING = "uuid:gpu_throttle_any_ratio:rate2m"
_BY = ("gpu", "uuid", "reason")


def queries(reasons: tuple[str, ...] = THROTTLE_REASONS, ratio: float = THROTTLE_RATIO
            ) -> tuple[StepQuery, StepQuery]:
    """The verdict's step queries: the throttled steps (``rate`` of the counter, or the
    recorded rate, >= ``ratio`` for ``reasons``), and the containers that held a GPU at its
    throttled steps, or one of its MIG slices (``slices``: labelled with the GPU's
    ``parent_uuid``)."""
    match = (("reason", tuple(reasons)),)
    rate = StepQuery("gpu_throttle_seconds_total", "rate", ">=", ratio, by=_BY, match=match,
                     recorded=StepQuery(RECORDED_THROTTLING, "max", ">=", ratio, by=_BY,
                                        match=match))
    holders = StepQuery("container_gpu_allocated", "max", ">", 0.0,
                        by=("namespace", "pod", "container", "uuid"), on=(rate,),
                        slices=True)
    return rate, holders


def _queries(th: Thresholds | None) -> tuple[StepQuery, StepQuery]:
    if th is None:
        return queries()
    return queries(tuple(th.throttle_reasons), th.throttle_ratio)


THROTTLED_COLUMNS = (
    Column("node", "Node", "link"),
    Column("gpu", "GPU"),
    Column("pods", "Pod", "link"),
    Column("reason", "Reason"),
    Column("ratio", "Throttled", "percent"),
    Column("for", "For"),
    Column("price", "Node $/hour", "money"),
)


class Throttle(StepVerdict):
    """The throttled-GPUs verdict (module docstring)."""

    name: ClassVar[str] = "throttled"
    queries: ClassVar[tuple[StepQuery, ...]] = queries()
    section: ClassVar[Section] = Section(
        id=ids.SECTION_THROTTLED, title="Throttled GPUs",
        intro="GPUs whose clocks have been held down by power, heat, reliability or a board "
              "limit for a good part of the time: they run slower than their peers.",
        tables=(Table(ids.THROTTLED_GPUS_TABLE, ids.THROTTLED_NOTE, THROTTLED_COLUMNS,
                      order="price"),),
    )

    def step_queries(self, th: Thresholds | None = None) -> tuple[StepQuery, ...]:
        return _queries(th)

    def judge(self, answers: StepAnswers, ctx: PageContext) -> tuple[Throttled, ...]:
        th = ctx.thresholds
        rate, holders = _queries(th)
        window = ctx.window
        series: dict[GpuRef, dict[str, Series]] = {}
        index: dict[GpuRef, str] = {}
        for lab, s in answers.get(rate, ()):
            ref = device_ref(lab)
            series.setdefault(ref, {})[lab.get("reason", "")] = s
            index.setdefault(ref, lab.get("gpu", ""))
        held: dict[GpuRef, set[str]] = {}
        for lab, s in answers.get(holders, ()):
            if len(s) and lab.get("namespace"):
                pod = f"{lab['namespace']}/{lab.get('pod', '')}"
                # On a slice of a throttled GPU: the GPU's (``parent_uuid``).
                ref = (GpuRef(lab.get("node", ""), lab["parent_uuid"])
                       if lab.get("parent_uuid") else device_ref(lab))
                held.setdefault(ref, set()).add(pod)
        found = throttled_gpus(
            series, window, ctx.history_start,
            reasons=THROTTLE_REASONS if th is None else tuple(th.throttle_reasons),
            ratio=THROTTLE_RATIO if th is None else th.throttle_ratio,
            duration=THROTTLE_DURATION if th is None else th.throttle_duration)
        # Throttling is board-level (the exporter gives it for the GPU, never its MIG
        # slices), while a GPU in MIG mode is held through its slices: its pods are theirs.
        devices: dict[GpuRef, list[GpuRef]] = {}
        for part in ctx.gpus.values():
            if part.parent_uuid:
                devices.setdefault(GpuRef(part.node, part.parent_uuid), []).append(part.ref)
        out = []
        for t in found:
            pods = tuple(sorted({p for ref in (t.ref, *devices.get(t.ref, ()))
                                 for p in (*held.get(ref, ()), *ctx.pods.get(ref, ()))}))
            if ctx.namespace is not None and not any(
                    p.partition("/")[0] == ctx.namespace for p in pods):
                continue
            info = ctx.gpus.get(t.ref)
            out.append(replace(t, gpu=info.gpu if info is not None else index[t.ref],
                               pods=pods, price_per_hour=ctx.node_price.get(t.ref.node)))
        out.sort(key=lambda t: (-(t.price_per_hour or 0.0), t.ref.node, index_key(t.gpu),
                                t.ref.uuid, -t.ratio, t.reason))
        return tuple(out)

    def rows(self, findings: Sequence[Throttled], ctx: PageContext, state: State
             ) -> list[Row]:
        return [{
            "node": node_link(t.ref.node, state), "gpu": t.gpu,
            "pods": ", ".join(pod_link(*p.partition("/")[::2], at_node(state, t.ref.node))
                          for p in t.pods)
            or "(no pod)",
            "reason": t.reason, "ratio": t.ratio,
            "for": f"{fmt.duration(t.seconds)} (needs {fmt.duration(t.required_seconds)})",
            "price": t.price_per_hour,
        } for t in findings]

    def note(self, findings: Sequence[Throttled], ctx: PageContext) -> str:
        n = len(findings)
        if not n:
            return "No throttled GPUs."
        return f"{n} throttled GPU{'s' if n != 1 else ''} (by reason)."


VERDICT = Throttle()

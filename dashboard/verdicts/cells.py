"""What the verdicts' tables show in a cell, alike in every table: since when (or earlier,
where the run is as long as the history), for how long against what the verdict needs, the
pods as links, and which signal judged it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuscope.dashboard import fmt
from gpuscope.dashboard.links import pod_link
from gpuscope.dashboard.verdicts.page import PageContext, State


def since_cell(ts: float, seconds: float, history: float,
               show: Callable[[float], str] = fmt.clock) -> str:
    """Since ``ts``, "or earlier" where the run is as long as the history; ``show``: how a
    time reads (:func:`fmt.stamp` in a CSV: with its date)."""
    return f"{show(ts)} or earlier" if seconds >= history - 1e-3 else show(ts)


def first_step_cell(first: float, ctx: PageContext,
                    show: Callable[[float], str] = fmt.clock) -> str:
    """Since when something seen at the step ending at ``first`` holds: the start of that
    step, never before the history the page has (a step of a long window over a younger
    store begins before it), "or earlier" where it held from the history's first step."""
    began = max(ctx.history_start, ctx.window.start)
    return (show(max(first - ctx.window.step, began))
            + (" or earlier" if first <= max(ctx.window.start, began) + ctx.window.step
               else ""))


def for_cell(seconds: float, required: float) -> str:
    return f"{fmt.duration(seconds)} (needs {fmt.duration(required)})"


def pods_cell(pods: Sequence[str], state: State) -> str:
    links = []
    for p in pods:
        namespace, _, pod = p.partition("/")
        links.append(pod_link(namespace, pod, state))
    return ", ".join(links) or "(no pod)"


SIGNALS = {
    "utilization": "utilization", "sm": "SM activity (GPM)", "process": "no process (no GPM)",
    "gpm": "SM, tensor, DRAM activity (GPM)", "power": "power vs limit (no GPM)",
    "mig": "MIG mode, no slice",
}


def signal_cell(signal: str, price_basis: str) -> str:
    """Which signal judged it, and how it is priced where that is not on demand (spot)."""
    return SIGNALS.get(signal, signal) + ("" if price_basis == "on-demand"
                                          else f"; priced {price_basis}")

"""Plotly figures, built from view data only (pure: no Dash, no I/O). Times are UTC, and
every time axis says so."""

from __future__ import annotations

import datetime as dt
import html
import textwrap
from collections.abc import Collection, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpuscope.dashboard import fmt
from gpuscope.dashboard.series import GpuRef, Series, WorkloadDetail
from gpuscope.dashboard.views import Heatmap

_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}
_MARGIN = {"l": 10, "r": 10, "t": 36, "b": 10}
_TIME_AXIS: dict[str, object] = {}  # the titles say the times are UTC


def _plain(text: str) -> str:
    """``text`` (a node, pod or workload name from the store) as plotly shows it, as text:
    plotly reads its strings as a little HTML (an ``<a href>`` would be a link to another
    site) and a hover template's ``%{...}`` as a field, so ``&``, ``<``, ``>`` and ``%``
    are written as entities."""
    return html.escape(text, quote=False).replace("%", "&#37;")


def _title(text: str) -> dict[str, object]:
    return {"text": f"{_plain(text)} <span style='font-size:11px;color:#5b6475'>(UTC)</span>",
            "x": 0, "font": {"size": 13}}

#: Below the idle threshold a GPU is grey; at and above it, blue, darker the busier.
IDLE_GREY = "#d4d4d4"


def _utc(times: Sequence[float]) -> list[dt.datetime]:
    return [dt.datetime.fromtimestamp(t, tz=dt.UTC).replace(tzinfo=None) for t in times]


#: The longest line of a figure's message: plotly never wraps an annotation, and a longer
#: one, centred, runs past both edges of the graph on a laptop's screen.
MESSAGE_LINE = 100


def empty_figure(message: str, height: int = 220) -> go.Figure:
    lines = textwrap.wrap(message, MESSAGE_LINE, break_long_words=False,
                          break_on_hyphens=False) or [message]
    fig = go.Figure()
    fig.update_layout(
        height=max(height, 60 + 20 * len(lines)), margin=_MARGIN, font=_FONT,
        xaxis={"visible": False}, yaxis={"visible": False}, plot_bgcolor="white",
        annotations=[{"text": "<br>".join(_plain(line) for line in lines),
                      "showarrow": False, "font": {"size": 14},
                      "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
    )
    return fig


def keep_view(fig: go.Figure, key: str) -> go.Figure:
    """``fig`` drawn over the figure of the same ``key`` as that one was left: a zoom, a
    pan or a legend entry hidden stays when the page refreshes the data; a figure of
    another key (another node, window or filter) starts at its whole extent."""
    fig.update_layout(uirevision=key)
    return fig


def heatmap_colorscale(threshold: float) -> list[list[float | str]]:
    """Grey below the idle threshold, then light to dark blue: a GPU at 6 % is visibly not
    one at 0 %."""
    t = min(max(threshold, 0.0), 0.99)
    return [[0.0, IDLE_GREY], [t, IDLE_GREY], [t, "#c6dbef"], [0.5, "#4292c6"],
            [1.0, "#08306b"]]


def heatmap_figure(h: Heatmap, idle_threshold: float = 0.05) -> go.Figure:
    """Nodes x GPUs, colored by mean utilization over the window; idle and spinning GPUs
    marked, the idle threshold on the color bar."""
    if not h.nodes:
        return empty_figure("No GPUs reported yet")
    spinning = h.spinning or tuple((False,) * len(h.columns) for _ in h.nodes)
    mig = h.mig or tuple(("",) * len(h.columns) for _ in h.nodes)
    absent = h.absent or tuple((False,) * len(h.columns) for _ in h.nodes)

    def label(idle: bool, spin: bool, slices: str) -> str:
        if spin:
            return "spin"
        if slices:
            return "MIG idle" if idle else "MIG"
        return "idle" if idle else ""

    text = [
        [label(i, sp, m) for i, sp, m in zip(irow, srow, mrow, strict=True)]
        for irow, srow, mrow in zip(h.idle, spinning, mig, strict=True)
    ]
    hover = [
        [
            # A cell past a node's last GPU (a 1-GPU node beside 8-GPU ones) is no GPU of
            # it: not one that reports nothing (a lost GPU's "no utilization reported").
            f"{_plain(node)}<br>no GPU {_plain(col)} on this node" if a else
            f"{_plain(node)}<br>GPU {_plain(col)}: "
            + (m if m else "no utilization reported" if z is None else f"{z * 100:.0f}% mean")
            + (" (spinning: busy, no work)" if sp else " (idle)" if i else "")
            for col, z, i, sp, m, a in zip(h.columns, zrow, irow, srow, mrow, arow,
                                          strict=True)
        ]
        for node, zrow, irow, srow, mrow, arow in zip(h.nodes, h.z, h.idle, spinning, mig,
                                                     absent, strict=True)
    ]
    labels = len(h.nodes) <= 150   # node names on the axis
    small = len(h.nodes) <= 60     # "idle"/"spin" written in the cells
    fig = go.Figure(go.Heatmap(
        z=[list(row) for row in h.z],
        x=[f"GPU {c}" for c in h.columns],
        y=list(h.nodes),
        zmin=0.0, zmax=1.0,
        colorscale=heatmap_colorscale(idle_threshold),
        colorbar={"title": {"text": "mean util"}, "thickness": 12,
                  "tickvals": [0.0, idle_threshold, 0.25, 0.5, 0.75, 1.0],
                  "ticktext": ["0%", f"{idle_threshold:.0%} idle below", "25%", "50%", "75%",
                               "100%"]},
        text=text if small else None,
        texttemplate="%{text}" if small else None,
        hovertext=hover,
        hoverinfo="text",
        xgap=2, ygap=2,
    ))
    row = 28 if small else 14 if labels else 6
    summary = heatmap_summary(h)
    top = 10 + 18 * len(summary)
    height = max(240, min(2400, 60 + top + row * len(h.nodes)))
    fig.update_layout(
        height=height, margin={**_MARGIN, "t": top}, font=_FONT, plot_bgcolor="white",
        title={"text": "<br>".join(_plain(line) for line in summary), "x": 0, "y": 0.995,
               "yanchor": "top", "font": {"size": 12}} if summary else None,
        # The names as text on the axis; the values stay the names themselves (a click
        # gives the node's name back: callbacks.pick_node).
        yaxis={"autorange": "reversed", "automargin": True, "showticklabels": labels,
               "tickfont": {"size": 12 if small else 9}, "tickmode": "array",
               "tickvals": list(h.nodes), "ticktext": [_plain(n) for n in h.nodes]},
        xaxis={"side": "top"},
    )
    return fig


def heatmap_summary(h: Heatmap, groups: int = 6) -> list[str]:
    """The lines above a heatmap of a large fleet: how many nodes it draws and which, and
    every node by instance type (the ``groups`` with idle or spinning GPUs first)."""
    if not h.hidden_nodes:
        return []
    lines = [f"Showing {len(h.nodes):,} of {h.total_nodes:,} nodes: idle and spinning GPUs "
             f"first, then the least busy. Any node: the node drill-down below."]
    for g in h.groups[:groups]:
        mean = "n/a" if g.mean_utilization is None else f"{g.mean_utilization:.0%}"
        lines.append(f"{g.name}: {g.nodes:,} nodes, {g.gpus:,} GPUs, {g.idle:,} idle, "
                     f"{g.spinning:,} spinning, mean {mean}")
    if len(h.groups) > groups:
        rest = h.groups[groups:]
        lines.append(f"{len(rest)} more instance types: {sum(g.nodes for g in rest):,} nodes, "
                     f"{sum(g.idle for g in rest):,} idle GPUs")
    return lines


def timeseries_figure(
    series: Mapping[str, Series], title: str, *, unit: str = "ratio", height: int = 280,
    limit_line: float | None = None,
) -> go.Figure:
    """One line per series; ``unit`` ``ratio`` (0..1 shown as %), ``bytes`` (GiB) or
    ``per_second`` (seconds per second, as %). ``limit_line`` draws a dashed line (e.g. the
    power limit at 100 %)."""
    if not series:
        return empty_figure(f"{title}: no data in this window", height)
    fig = go.Figure()
    scale = 2**30 if unit == "bytes" else 1.0
    for name in sorted(series):
        s = series[name]
        fig.add_trace(go.Scatter(
            x=_utc(s.times), y=[v / scale for v in s.values],
            mode="lines", name=_plain(name), connectgaps=False,
        ))
    yaxis: dict[str, object] = {"rangemode": "tozero"}
    if unit in ("ratio", "per_second"):
        top = max([1.0, *(v for s in series.values() for v in s.values)]) * 1.05
        yaxis.update(tickformat=".0%", range=[0, top])
    else:
        yaxis.update(title={"text": "GiB"})
    if limit_line is not None:
        fig.add_hline(y=limit_line, line_dash="dash", line_color="#b03a2e",
                      annotation_text="limit", annotation_position="top left")
    fig.update_layout(
        title=_title(title), height=height, margin=_MARGIN,
        font=_FONT, yaxis=yaxis, xaxis=_TIME_AXIS, legend={"orientation": "h", "y": -0.25},
        plot_bgcolor="#fafafa", hovermode="x unified",
    )
    return fig


def activity_figure(sm: Mapping[str, Series], tensor: Mapping[str, Series],
                    dram: Mapping[str, Series], title: str, height: int = 420) -> go.Figure:
    """SM, tensor and DRAM activity (GPM) of each GPU, one panel each."""
    if not (sm or tensor or dram):
        return empty_figure(f"{title}: no GPM activity (GPM needs Hopper or newer)", 160)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("SM activity", "Tensor activity", "DRAM activity"))
    colors = _palette(sorted(set(sm) | set(tensor) | set(dram)))
    for row, panel in enumerate((sm, tensor, dram), start=1):
        for name in sorted(panel):
            s = panel[name]
            fig.add_trace(go.Scatter(
                x=_utc(s.times), y=list(s.values), mode="lines", name=f"GPU {name}",
                legendgroup=name, showlegend=row == 1, line={"color": colors[name]},
            ), row=row, col=1)
        fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=row, col=1)
    fig.update_layout(title=_title(title), height=height,
                      margin={**_MARGIN, "t": 56}, font=_FONT, plot_bgcolor="#fafafa",
                      legend={"orientation": "h", "y": -0.12}, hovermode="x unified")
    return fig


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
           "#3182bd", "#e6550d")


def _palette(names: Sequence[str]) -> dict[str, str]:
    return {n: _COLORS[i % len(_COLORS)] for i, n in enumerate(names)}


def workload_figure(detail: WorkloadDetail, stragglers: Collection[GpuRef] = (),
                    kinds: Mapping[GpuRef, str] | None = None) -> go.Figure:
    """Every GPU of one workload side by side over time: utilization, SM activity and power
    in three panels, one line per GPU; stragglers drawn thick and red, their peers thin."""
    name = f"{detail.namespace}/{detail.workload}"  # (plain text: _title, empty_figure)
    if not detail.devices:
        return empty_figure(f"{name}: no GPU of it reported in this window", 200)
    kinds = kinds or {}
    panels = [("Utilization", detail.utilization, True), ("SM activity (GPM)", detail.sm, True),
              ("Power (W)", detail.power, False)]
    panels = [p for p in panels if p[1]]
    if not panels:
        # Its GPUs are known (who held them) but none has a point in the window: a store
        # younger than one step of a long window (the 7 d window's 2 h 48 m on its first day).
        return empty_figure(f"{name}: its GPUs have no point in this window yet (a step is "
                            f"{fmt.duration(detail.window.step)})", 200)
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=[p[0] for p in panels])
    for row, (_, data, ratio) in enumerate(panels, start=1):
        for dev in detail.devices:
            s = data.get(dev.ref)
            if s is None:
                continue
            marked = dev.ref in stragglers
            label = f"{_plain(dev.ref.node)} GPU {_plain(dev.gpu)}"
            if marked:
                label = f"★ {label} ({kinds.get(dev.ref, 'straggler')} straggler)"
            fig.add_trace(go.Scatter(
                x=_utc(s.times), y=list(s.values), mode="lines", name=label,
                legendgroup=f"{dev.ref.node}/{dev.ref.uuid}", showlegend=row == 1,
                line={"color": "#c0392b" if marked else "#5b7fa6",
                      "width": 3.5 if marked else 1.2},
                opacity=1.0 if marked else 0.75,
                hovertemplate=f"{label}<br>%{{y:{'.0%' if ratio else '.0f'}}}<extra></extra>",
            ), row=row, col=1)
        if ratio:
            fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=row, col=1)
        else:
            fig.update_yaxes(rangemode="tozero", row=row, col=1)
    fig.update_layout(
        title=_title(f"{name}: {len(detail.devices)} GPU{'s' if len(detail.devices) != 1 else ''}"
                     + (f" of {detail.total_devices}"
                        if detail.total_devices > len(detail.devices) else "")
                     + (", straggler marked ★" if stragglers else ", no straggler")),
        height=160 + 170 * len(panels), margin={**_MARGIN, "t": 60}, font=_FONT,
        plot_bgcolor="#fafafa", legend={"orientation": "h", "y": -0.1},
    )
    return fig

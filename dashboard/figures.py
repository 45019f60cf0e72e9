"""Plotly figures, built from view data only (pure: no Dash, no I/O)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import plotly.graph_objects as go

from gpuscope.dashboard.series import Series
from gpuscope.dashboard.views import Heatmap

_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}
_MARGIN = {"l": 10, "r": 10, "t": 36, "b": 10}


def empty_figure(message: str, height: int = 220) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        height=height, margin=_MARGIN, font=_FONT, xaxis={"visible": False},
        yaxis={"visible": False}, plot_bgcolor="white",
        annotations=[{"text": message, "showarrow": False, "font": {"size": 14},
                      "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
    )
    return fig


def heatmap_figure(h: Heatmap) -> go.Figure:
    """Nodes x GPUs, colored by mean utilization over the window; idle GPUs marked."""
    if not h.nodes:
        return empty_figure("No GPUs reported yet")
    text = [
        [("idle" if idle else "") for idle in row]
        for row in h.idle
    ]
    hover = [
        [
            f"{node}<br>GPU {col}: "
            + ("no utilization reported" if z is None else f"{z * 100:.0f}% mean")
            + (" (idle)" if idle else "")
            for col, z, idle in zip(h.columns, zrow, irow, strict=True)
        ]
        for node, zrow, irow in zip(h.nodes, h.z, h.idle, strict=True)
    ]
    small = len(h.nodes) <= 40
    fig = go.Figure(go.Heatmap(
        z=[list(row) for row in h.z],
        x=[f"GPU {c}" for c in h.columns],
        y=list(h.nodes),
        zmin=0.0, zmax=1.0,
        colorscale="Viridis",
        colorbar={"title": {"text": "util"}, "tickformat": ".0%", "thickness": 12},
        text=text if small else None,
        texttemplate="%{text}" if small else None,
        hovertext=hover,
        hoverinfo="text",
        xgap=2, ygap=2,
    ))
    height = max(240, min(900, 60 + (28 if small else 6) * len(h.nodes)))
    fig.update_layout(
        height=height, margin={**_MARGIN, "t": 10}, font=_FONT, plot_bgcolor="white",
        yaxis={"autorange": "reversed", "automargin": True, "showticklabels": small},
        xaxis={"side": "top"},
    )
    return fig


def timeseries_figure(
    series: Mapping[str, Series], title: str, *, unit: str = "ratio", height: int = 280
) -> go.Figure:
    """One line per series; ``unit`` ``ratio`` (0..1 shown as %) or ``bytes`` (GiB)."""
    if not series:
        return empty_figure(f"{title}: no data in this window", height)
    fig = go.Figure()
    scale = 2**30 if unit == "bytes" else 1.0
    for name in sorted(series):
        s = series[name]
        fig.add_trace(go.Scatter(
            x=[dt.datetime.fromtimestamp(t) for t in s.times],
            y=[v / scale for v in s.values],
            mode="lines", name=name, connectgaps=False,
        ))
    yaxis: dict[str, object] = {"rangemode": "tozero"}
    if unit == "ratio":
        yaxis.update(tickformat=".0%", range=[0, 1.05])
    else:
        yaxis.update(title={"text": "GiB"})
    fig.update_layout(
        title={"text": title, "x": 0, "font": {"size": 13}}, height=height, margin=_MARGIN,
        font=_FONT, yaxis=yaxis, legend={"orientation": "h", "y": -0.2},
        plot_bgcolor="#fafafa", hovermode="x unified",
    )
    return fig

"""Plotly figures (:mod:`gpuscope.dashboard.figures`), pure, without a browser: names that
come from the store (node, pod, workload labels, which nothing checks there) are drawn as
text, never as plotly's little HTML or as a hover template's field."""

from __future__ import annotations

import json

from gpuscope.dashboard.figures import (
    empty_figure,
    heatmap_figure,
    timeseries_figure,
    workload_figure,
)
from gpuscope.dashboard.series import GpuRef, Series, Window, WorkloadDetail, WorkloadDevice
from gpuscope.dashboard.views import Heatmap

HOSTILE = "<a href='https://evil.example/'>node</a>%{y}&"


def no_markup(text: str) -> None:
    assert "<a " not in text and "evil.example/'>" not in text, text
    assert "%{y}&" not in text


def test_a_hostile_node_name_is_text_in_the_heatmap_and_a_click_gives_it_back() -> None:
    h = Heatmap(nodes=(HOSTILE, "n2"), columns=("0",), z=((0.0,), (0.9,)),
                idle=((True,), (False,)))
    fig = heatmap_figure(h, 0.05)
    no_markup(json.dumps([fig.data[0].hovertext, fig.layout.yaxis.ticktext]))
    # The cell's value is the name itself: a click on it opens that node.
    assert list(fig.data[0].y) == [HOSTILE, "n2"]
    assert list(fig.layout.yaxis.tickvals) == [HOSTILE, "n2"]
    assert fig.layout.yaxis.ticktext[0] == (
        "&lt;a href='https://evil.example/'&gt;node&lt;/a&gt;&#37;{y}&amp;")


def test_a_hostile_name_is_text_in_lines_titles_and_the_workload_view() -> None:
    s = Series((0.0, 60.0), (0.5, 0.6))
    fig = timeseries_figure({f"ml/{HOSTILE}/main": s}, f"{HOSTILE}: utilization")
    no_markup(json.dumps([fig.data[0].name, fig.layout.title.text]))
    ref = GpuRef(HOSTILE, "GPU-0")
    w = Window(start=0.0, end=120.0, step=60.0)
    detail = WorkloadDetail("ml", HOSTILE, w, devices=(WorkloadDevice(ref, "0"),),
                            utilization={ref: s})
    fig = workload_figure(detail, stragglers={ref})
    no_markup(json.dumps([fig.data[0].name, fig.data[0].hovertemplate,
                          fig.layout.title.text]))
    # The template's own field is still there.
    assert fig.data[0].hovertemplate.endswith("%{y:.0%}<extra></extra>")


def test_a_long_message_is_wrapped_not_cut_at_the_figures_edges() -> None:
    """A figure's message is one annotation, centred, which plotly never wraps: the pod
    drill-down's line for a MIG pod (about 200 characters) ran past both edges of the graph
    in a 1400-pixel-wide Chromium ("earch/notebook-carol: ... shows the device's activ").
    It comes in lines short enough for a laptop's screen, every word kept."""
    message = ("research/notebook-carol: no per-container utilization (a MIG slice reports "
               "none, nor a CUDA MPS client where the driver reports only the MPS server; the "
               "node drill-down shows the device's activity)")
    [note] = empty_figure(message, 120).layout.annotations
    lines = note.text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= 100 for line in lines), lines
    assert " ".join(lines) == message
    # A short one stays one line.
    [short] = empty_figure("n: no throttling in this window", 80).layout.annotations
    assert short.text == "n: no throttling in this window"

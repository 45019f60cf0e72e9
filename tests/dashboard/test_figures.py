"""Plotly figures (:mod:`gpuscope.dashboard.figures`), pure, without a browser: names that
come from the store (node, pod, workload labels, which nothing checks there) are drawn as
text, never as plotly's little HTML or as a hover template's field."""

from __future__ import annotations

import json

from gpuscope.dashboard.figures import heatmap_figure, timeseries_figure, workload_figure
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

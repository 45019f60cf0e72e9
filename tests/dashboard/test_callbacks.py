"""The dropdowns' options (``callbacks.choice_options``): what is typed narrows them, at most
``MAX_OPTIONS`` are sent (the browser builds each one: a 5,000-node fleet's 13,000 names took
4 of a 5-second page load), and what is picked stays."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dash import Patch, no_update

from gpuscope.dashboard import callbacks
from gpuscope.dashboard.callbacks import (
    MAX_OPTIONS,
    MAX_POD_CHOICES,
    choice_options,
    choices_of,
    shown_choices,
)
from gpuscope.dashboard.figures import empty_figure, timeseries_figure, workload_figure
from gpuscope.dashboard.series import GpuRef, Window, WorkloadDetail, WorkloadDevice
from tests.dashboard.conftest import make_series

NODES = [f"gpu-node-{i:05d}" for i in range(5000)]
PODS = [f"ml/train-{i}" for i in range(300)]
WORKLOADS = ["ml/PyTorchJob/bert", "ml/PyTorchJob/gpt", "vision/Job/resnet"]
CHOICES = {"nodes": NODES, "pods": PODS, "workloads": WORKLOADS}


def values(options: list[dict[str, str]]) -> list[str]:
    return [o["value"] for o in options]


def test_nothing_typed_sends_the_first_names_only() -> None:
    nodes, pods, workloads = choice_options(CHOICES, None, None, None)
    assert values(nodes) == NODES[:MAX_OPTIONS]
    assert values(pods) == PODS[:MAX_OPTIONS]
    assert values(workloads) == WORKLOADS


def test_what_is_typed_finds_any_name_in_any_case() -> None:
    nodes, pods, workloads = choice_options(
        CHOICES, None, None, None, ("NODE-0499", "train-29", " gpt "))
    assert values(nodes) == [f"gpu-node-0499{d}" for d in range(10)]
    assert values(pods) == ["ml/train-29", *[f"ml/train-29{d}" for d in range(10)]]
    assert values(workloads) == ["ml/PyTorchJob/gpt"]
    # Far past the first hundred, and nothing that does not contain it.
    [last] = [values(o) for o in choice_options(CHOICES, None, None, None,
                                                 ("04999", None, None))[:1]]
    assert last == ["gpu-node-04999"]
    assert choice_options(CHOICES, None, None, None, ("nope", "", ""))[0] == []


def test_the_picked_value_stays_whatever_is_typed() -> None:
    nodes, pods, _ = choice_options(CHOICES, "gpu-node-04000", "ml/gone", None,
                                    ("00001", None, None))
    assert values(nodes)[-1] == "gpu-node-04000"
    assert nodes[-1]["label"] == "gpu-node-04000"  # in the window, not among those shown
    assert pods[-1] == {"label": "ml/gone (not in this window)", "value": "ml/gone"}
    assert len(nodes) <= MAX_OPTIONS + 1


def test_bad_input_from_the_page_is_ignored() -> None:
    assert choice_options(None, None, None, None) == (no_update, no_update, no_update)
    nodes, pods, workloads = choice_options(
        {"nodes": [1, None, "a"], "pods": "x", "workloads": None}, 7, ["p"], {},
        searches=[3, {"x": 1}])
    assert values(nodes) == ["a"] and pods == [] and workloads == []
    assert callbacks.choice_options(CHOICES, None, None, None, searches="junk")[0]


class LastViews:
    """Stands in for the service: its last view, and which views were asked for."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.asked: list[tuple[Any, ...]] = []

    def latest(self, window: Any, namespace: Any, cluster: Any = None) -> Any:
        self.asked.append((window, namespace, cluster))
        return self.view


def test_the_names_are_the_shown_views_read_on_the_server() -> None:
    """The page's store says which view it shows (window, namespace, cluster), not its
    names (a 5,000-node fleet's are about 0.5 MB, sent with every page and back with every
    key typed in a dropdown): the options come from the service's last view of it."""
    pods = [f"ml/p-{i:05d}" for i in range(MAX_POD_CHOICES + 10)]
    view = SimpleNamespace(nodes=NODES, pods=pods, workloads=WORKLOADS, starved_rows=(),
                           allocated_idle_rows=(), share_rows=(), spinning_rows=(),
                           straggler_rows=())
    service = LastViews(view)
    got = shown_choices(service, {"window": "6h", "namespace": "ml", "cluster": "prod-a",
                                  "at": 1.0})
    assert service.asked == [("6h", "ml", "prod-a")]
    assert got == choices_of(view) == {"nodes": NODES, "pods": pods[:MAX_POD_CHOICES],
                                       "workloads": WORKLOADS}
    nodes, _, _ = choice_options(got, None, None, None, ("04999", None, None))
    assert values(nodes) == ["gpu-node-04999"]
    # Anything else from the page: the default view's names, or none.
    assert shown_choices(service, {"window": "1y", "namespace": 3, "cluster": ["a"]}) == got
    assert service.asked[-1] == (None, None, None)
    assert shown_choices(service, "junk") is None and len(service.asked) == 2
    assert shown_choices(LastViews(None), {"window": "1h"}) is None
    assert choice_options(shown_choices(LastViews(None), {}), "n", None, None) == (
        no_update, no_update, no_update)


def test_a_window_the_page_does_not_offer_is_corrected_in_the_url() -> None:
    # ?window=bogus shows the default hour, and the URL then says what is shown, keeping
    # the rest of the view.
    synced = callbacks.sync_state(None, "?window=bogus&namespace=ml&node=n1", "1h", None,
                                  None, "", "", "")
    assert synced[0] == "?namespace=ml&node=n1"
    assert synced[1] is no_update and synced[2] == "ml" and synced[4] == "n1"
    # A valid one, or none, leaves the URL as it is.
    assert callbacks.sync_state(None, "?window=6h", "1h", None, None, "", "", "")[:2] == (
        no_update, "6h")
    assert callbacks.sync_state(None, "", "1h", None, None, "", "", "")[0] is no_update


def test_a_workload_whose_gpus_have_no_point_in_the_window_draws_no_error() -> None:
    """Its GPUs known (who held them) but no series point in the window (a store younger
    than one step of the 7 d window, 2 h 48 m): a figure that says so, not a callback error
    (``make_subplots(rows=0)`` raised, the workload view stayed on "Loading...")."""
    w = Window(start=0.0, end=7 * 86400.0, step=10080.0)
    ref = GpuRef("dev/ip-10-1-1-12.ec2.internal", "GPU-0")
    detail = WorkloadDetail("ml-train", "PyTorchJob/gpt-sft", w,
                            devices=(WorkloadDevice(ref, "0"),))
    text = workload_figure(detail).layout.annotations[0].text
    assert "no point in this window yet" in text and "2h 48m" in text


def test_a_refresh_of_the_same_view_keeps_the_users_zoom() -> None:
    """``callbacks.redraw``: a graph that shows another view (or a message where lines come)
    gets the whole figure; one that shows this view a patch of all but its axes' ranges,
    which dcc.Graph keeps at the user's zoom in its figure."""
    lines = timeseries_figure({"GPU 0": make_series([0.1, 0.5, 0.9])}, "n1: GPU utilization")
    first, key = callbacks.redraw(lines, "n1 1h", None)
    assert first is lines and first.layout.uirevision == "n1 1h"
    again, same = callbacks.redraw(lines, "n1 1h", key)
    assert isinstance(again, Patch) and same == key
    sent = again.to_plotly_json()["operations"]
    paths = [op["location"] for op in sent]
    assert ["data"] in paths and ["layout", "title"] in paths
    assert ["layout", "yaxis", "tickformat"] in paths
    assert not any(p[-1] in ("range", "autorange") for p in paths), paths
    # Another node, or the same one with a message instead of lines: the whole figure.
    assert callbacks.redraw(lines, "n2 1h", key)[0] is lines
    message = empty_figure("n1: no data in this window")
    assert callbacks.redraw(message, "n1 1h", key)[0] is message

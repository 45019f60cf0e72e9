"""The dropdowns' options (``callbacks.choice_options``): what is typed narrows them, at most
``MAX_OPTIONS`` are sent (the browser builds each one: a 5,000-node fleet's 13,000 names took
4 of a 5-second page load), and what is picked stays."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dash import Patch, no_update

from gpuscope.dashboard import callbacks, fmt, ids
from gpuscope.dashboard.callbacks import (
    MAX_OPTIONS,
    MAX_POD_CHOICES,
    choice_options,
    choices_of,
    shown_choices,
)
from gpuscope.dashboard.data import DataError
from gpuscope.dashboard.figures import empty_figure, timeseries_figure, workload_figure
from gpuscope.dashboard.layout import FOLDED, GRAPHS
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import (
    FleetData,
    GpuRef,
    NodeDetail,
    PodDetail,
    Window,
    WorkloadDetail,
    WorkloadDevice,
)
from gpuscope.dashboard.service import DashboardService, ReadFailed
from tests.dashboard.conftest import FixedSource, make_series, one_idle_gpu_fleet

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


class _Recorder:
    """Keeps the functions ``register_callbacks`` registers, by name, to call them as Dash
    would (the clientside ones run in the browser only)."""

    def __init__(self) -> None:
        self.funcs: dict[str, Callable[..., Any]] = {}

    def callback(self, *_deps: Any, **_kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            self.funcs.setdefault(func.__name__, func)
            return func
        return register

    def clientside_callback(self, *_args: Any, **_kwargs: Any) -> None:
        pass


class _Drill(FixedSource):
    """One idle node, and a node ``n1``, a pod ``ns/p`` and a run ``ml/Job/train`` to drill
    into; every read fails with the store's error while ``down``."""

    def __init__(self) -> None:
        super().__init__(one_idle_gpu_fleet())
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise DataError("Prometheus http://prom:9090 unreachable: timed out")

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        self._check()
        return self.data

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        self._check()
        series = {"0": make_series([0.5] * 10)} if node == "n1" else {}
        return NodeDetail(node, self.data.window, utilization=series)

    def pod_detail(self, namespace: str, pod: str, window_seconds: float,
                   cluster: str | None = None) -> PodDetail:
        self._check()
        return PodDetail(namespace, pod, self.data.window,
                         utilization={"main@n1/0": make_series([0.5] * 10)})

    def workload_detail(self, namespace: str, workload: str, window_seconds: float,
                        first: Any = (), cluster: str | None = None) -> WorkloadDetail:
        self._check()
        ref = GpuRef("n1", "GPU-1")
        return WorkloadDetail(namespace, workload, self.data.window,
                              (WorkloadDevice(ref, "0", "NVIDIA L4", ("train-0",)),),
                              utilization={ref: make_series([0.5] * 10)}, total_devices=1)


def test_a_failed_read_keeps_a_drill_downs_last_charts_and_says_whose() -> None:
    """``callbacks.last_drawn``: the store down (``ReadFailed``), a drill-down keeps the
    charts it last drew under a banner saying when they were drawn and whose they are, and
    that they are not the view picked now where another is; an answer about what is picked
    (not there, not a name), or nothing drawn yet, keeps nothing."""
    at = 1_800_000_000.0
    drawn = {"node-util-graph": "key", "of": {"node": "n1", "window": "1h"}, "at": at}
    down = ReadFailed("Prometheus http://prom:9090 unreachable: timed out")
    banner = callbacks.last_drawn(down, drawn, {"node": "n1", "window": "1h"})
    assert banner == (f"Prometheus http://prom:9090 unreachable: timed out. Showing the last "
                      f"data, from {fmt.clock(at)}, of node n1, the 1h window.")
    assert callbacks.last_drawn(down, drawn, {"node": "n2", "window": "6h"}).endswith(
        "of node n1, the 1h window, not node n2, the 6h window.")
    # A filter is said where either view has one, as the fleet's banner says it.
    pod = {"of": {"pod": "ns/p", "window": "1h", "cluster": None}, "at": at}
    assert callbacks.last_drawn(down, pod, {"pod": "ns/p", "window": "1h",
                                            "cluster": "dev"}).endswith(
        "of pod ns/p, the 1h window, every cluster, not pod ns/p, the 1h window, cluster dev.")
    # Nothing to keep: an answer, not a failure; nothing drawn; a page's JSON that is no time.
    assert callbacks.last_drawn("No GPU data for node 'n1'", drawn, {"node": "n1"}) is None
    assert callbacks.last_drawn(down, None, {"node": "n1"}) is None
    assert callbacks.last_drawn(down, {"node-util-graph": "key"}, {"node": "n1"}) is None
    for junk in (True, "now", 1e300, float("nan"), -5):
        assert callbacks.last_drawn(down, {**drawn, "at": junk}, {"node": "n1"}) is None


def test_the_drill_downs_keep_their_charts_while_the_store_is_down() -> None:
    """The node, pod and workload callbacks: drawn once, then the store fails; the charts
    are left as they are (no figure sent, the box unfolded) under the banner, and the
    workload view keeps its run. A node that is not there still folds its charts away."""
    source = _Drill()
    service = DashboardService(source, bundled_prices())  # type: ignore[arg-type]
    try:
        app = _Recorder()
        callbacks.register_callbacks(app, service)  # type: ignore[arg-type]
        node, pod, run = (app.funcs[n] for n in ("update_node", "update_pod",
                                                 "update_workload"))
        first = node("n1", "1h", 1, None)
        assert first["box"] == GRAPHS and first["drawn"]["of"] == {"node": "n1", "window": "1h"}
        pod_first = pod("ns/p", "1h", 1, None, None)
        run_first = run("ml/Job/train", "1h", None, None, None, None)
        source.down = True
        kept = node("n1", "1h", 2, first["drawn"])
        assert kept["box"] == GRAPHS and kept["banner_class"] == "banner"
        assert all(kept[g] is no_update for g in ids.NODE_GRAPH_IDS)
        assert "unreachable" in kept["banner"] and kept["banner"].endswith(
            "of node n1, the 1h window.")
        kept = pod("ns/p", "1h", 2, None, pod_first["drawn"])
        assert kept["box"] == GRAPHS and kept["banner"].endswith("of pod ns/p, the 1h window.")
        figure, note, drawn, note_class = run("ml/Job/train", "6h", None, None, None,
                                              run_first[2])
        assert figure is no_update and drawn is no_update and note_class == "banner"
        assert note.endswith("of workload ml/Job/train, the 1h window, not workload "
                             "ml/Job/train, the 6h window."), note
        # Not there: an answer, not a failure: folded with why, whatever was drawn.
        source.down = False
        gone = node("gone", "1h", 3, first["drawn"])
        assert gone["box"] == FOLDED and gone["banner"].startswith("No GPU data for node")
    finally:
        service.close()

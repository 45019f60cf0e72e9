"""The dashboard on GPUs shared by CUDA MPS (issue 31).

On hand-built answers: the MPS GPUs whose clients cannot be judged (the driver reports the
server's utilization only), and the starvation rule against a client's active-thread share
(1/replicas) instead of time-slicing's 1/n.

End to end: two real exporters (simulated source) scraped by the embedded store, each an MPS
node with the server and two client pods on one GPU, one a busy client and one at 5 % of a
busy GPU: where the driver reports the server only, the clients get memory and no
utilization, the page lists the GPU as not judged per client and flags neither client
(never a made-up 0); where it reports each client, the light one is starved, the server is
no one's container, and nothing is listed as not judged."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from gpuscope.dashboard import fmt
from gpuscope.dashboard.data import EmbeddedData, Target
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import ContainerRef, GpuInfo, GpuRef, Series, Window
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.mps import (
    CLIENTS,
    REPLICAS,
    UNREPORTED,
    VERDICT,
    active_thread_shares,
)
from gpuscope.dashboard.verdicts.page import PageContext
from gpuscope.dashboard.verdicts.starvation import starved_rows, timeslice_shares
from gpuscope.dashboard.views import FleetView, build_fleet_view
from tests.conftest import ExporterProcess, stop_all, wait_for
from tests.dashboard.conftest import T0, make_series, make_window

SCENARIOS = Path(__file__).parent.parent / "scenarios"
STEP = 60.0
END = 1_800_003_600.0
WINDOW = Window(END - 3600.0, END, STEP)
T = WINDOW.times()
G = GpuRef("node-a", "GPU-a0")


def lab(ref: GpuRef, **extra: str) -> dict[str, str]:
    return {"node": ref.node, "uuid": ref.uuid, "gpu": "0", **extra}


def series(points: Mapping[float, float]) -> Series:
    times = sorted(points)
    return Series(tuple(times), tuple(points[t] for t in times))


def ctx(namespace: str | None = None) -> PageContext:
    return PageContext(WINDOW, WINDOW.start, gpus={G: GpuInfo("node-a", "0", G.uuid)},
                       node_price={"node-a": 1.006}, gpu_price={"node-a": 1.006},
                       namespace=namespace)


def test_an_mps_gpu_without_per_client_utilization_is_listed_with_its_clients() -> None:
    found = VERDICT.judge({
        UNREPORTED: [(lab(G), series({t: 0.0 for t in T[10:]}))],
        CLIENTS: [(lab(G, namespace="ml", pod="infer-a", container="s"),
                   series({t: 8 * 2**30 for t in T[10:]})),
                  (lab(G, namespace="ml", pod="infer-b", container="s"),
                   series({t: 2 * 2**30 for t in T[10:]}))],
    }, ctx())
    (u,) = found
    assert u.ref == G and u.since == T[10] and u.price_per_hour == pytest.approx(1.006)
    assert [(c.pod, c.memory_bytes) for c in u.clients] == [("ml/infer-a", 8 * 2**30),
                                                            ("ml/infer-b", 2 * 2**30)]
    (row,) = VERDICT.rows(found, ctx(), {})
    assert row["memory"] == "8.0 GiB, 2.0 GiB" and "infer-b/s" in str(row["clients"])
    assert VERDICT.judge({UNREPORTED: []}, ctx()) == ()
    # Only in the namespace of one of its clients.
    assert VERDICT.judge({UNREPORTED: [(lab(G), series({T[-1]: 0.0}))]}, ctx("web")) == ()


def test_the_gpus_price_is_the_pages_even_where_its_devices_were_not_sent() -> None:
    # A node the recording rules summarised comes without its devices: the GPU's share of
    # the node's price is the page's own (PageContext.gpu_price), not counted again here.
    summarised = PageContext(WINDOW, WINDOW.start, gpus={}, node_price={"node-a": 55.04},
                             gpu_price={"node-a": 55.04 / 8})
    (u,) = VERDICT.judge({UNREPORTED: [(lab(G), series({T[-1]: 0.0}))]}, summarised)
    assert u.price_per_hour == pytest.approx(6.88) and u.gpu == "0"


def test_no_longer_unreported_at_the_latest_step_is_not_listed() -> None:
    assert VERDICT.judge({UNREPORTED: [(lab(G), series({t: 0.0 for t in T[:30]}))]},
                         ctx()) == ()


def test_starvation_under_mps_is_judged_against_the_active_thread_share() -> None:
    # Two clients on a GPU advertised as 10 MPS replicas: each may use 10 % of the threads.
    # The light one has 8 % of the clients' work: below half of 1/2 (time-slicing would call
    # it starved), above half of 1/10 (under MPS it is not).
    w = make_window(3600)
    busy = make_series([0.95] * 61)
    a = ContainerRef("node-a", "ml", "infer-a", "s", G.uuid)
    b = ContainerRef("node-a", "ml", "infer-b", "s", G.uuid)
    containers = {a: make_series([0.69] * 61), b: make_series([0.06] * 61)}
    sliced = {v.ref: v for v in timeslice_shares(containers, {G: busy}, w, T0)}
    assert sliced[b].starved and sliced[b].fair_share == 0.5
    shares = active_thread_shares({REPLICAS: [(lab(G), series({T[-1]: 10.0}))]})
    assert shares == {G: 0.1}
    mps = {v.ref: v for v in timeslice_shares(containers, {G: busy}, w, T0,
                                              fair_shares=shares)}
    assert not mps[b].starved and mps[b].fair_share == 0.1
    # At 4 % of the work it is starved under MPS too.
    containers[b] = make_series([0.03] * 61)
    verdicts = timeslice_shares(containers, {G: busy}, w, T0, fair_shares=shares)
    assert {v.ref: v for v in verdicts}[b].starved
    # Its row names what the 10 % is: it read "fair share 10% (2 containers)", as if 1/n.
    rows = starved_rows(verdicts, (), ctx(), lambda ref: ("GPU", None))
    assert [r.pod for r in rows] == ["infer-b"]
    assert "vs fair share 10% (MPS active-thread share, 1/10 replicas; 2 containers)" in (
        rows[0].detail)
    sliced_rows = starved_rows(timeslice_shares(containers, {G: busy}, w, T0), (), ctx(),
                               lambda ref: ("GPU", None))
    assert "vs fair share 50% (2 containers)" in sliced_rows[0].detail
    # Two replicas and two clients: 1/2 either way, and still the MPS share (it read as
    # time-slicing's 1/n, the basis guessed from the numbers).
    two = active_thread_shares({REPLICAS: [(lab(G), series({T[-1]: 2.0}))]})
    rows = starved_rows(timeslice_shares(containers, {G: busy}, w, T0, fair_shares=two), (),
                        ctx(), lambda ref: ("GPU", None))
    assert "vs fair share 50% (MPS active-thread share, 1/2 replicas; 2 containers)" in (
        rows[0].detail)


@pytest.fixture(scope="module")
def views() -> Iterator[dict[str, FleetView]]:
    nodes = ("mps-unreported", "mps-reported")
    exporters = {n: ExporterProcess(["--source", "simulated", "--scenario",
                                     str(SCENARIOS / f"{n}.yaml"), "--interval", "0.5"])
                 for n in nodes}
    store: EmbeddedData | None = None
    try:
        for e in exporters.values():
            e.wait_ready()
        store = EmbeddedData([Target(f"{e.url}/metrics", n) for n, e in exporters.items()],
                             interval=1.0, extra_metrics=registry.step_metrics())
        store.start()
        began = time.monotonic()
        wait_for(lambda: time.monotonic() - began > 12, 30, "12 s of scrapes")
        fleet = store.fleet(900)
        view = build_fleet_view(fleet, bundled_prices(),
                                steps=store.step_series(registry.step_queries(), 900))
        yield {n: view for n in nodes}
    finally:
        if store is not None:
            store.close()
        stop_all(exporters.values())


def test_the_page_says_which_mps_gpus_it_cannot_judge(views: dict[str, FleetView]) -> None:
    view = views["mps-unreported"]
    (u,) = view.findings[VERDICT.name]
    assert u.ref.node == "mps-unreported" and u.gpu == "0"
    assert [c.pod for c in u.clients] == ["ml/infer-a", "ml/infer-b"]
    assert [round(c.memory_bytes / 2**30) for c in u.clients] == [8, 2]
    assert u.price_per_hour == pytest.approx(1.006)  # a g5.xlarge's one GPU


def test_clients_without_utilization_are_not_judged(views: dict[str, FleetView]) -> None:
    view = views["mps-unreported"]
    on_it = {r.pod for r in view.starved_rows if r.node == "mps-unreported"}
    on_it |= {r.pod for r in view.allocated_idle_rows if r.node == "mps-unreported"}
    on_it |= {r.pod for r in view.share_rows if r.node == "mps-unreported"}
    assert on_it == set()


def test_reported_clients_are_judged_and_the_server_is_no_container(
        views: dict[str, FleetView]) -> None:
    view = views["mps-reported"]
    starved = {(r.kind, r.pod) for r in view.starved_rows if r.node == "mps-reported"}
    assert starved == {("time-slice", "infer-b")}
    shares = {r.pod: r for r in view.share_rows if r.node == "mps-reported"}
    assert set(shares) == {"infer-a", "infer-b"}  # the server is no one's container
    assert not [u for u in view.findings[VERDICT.name] if u.ref.node == "mps-reported"]
    assert not [r for r in view.allocated_idle_rows if r.node == "mps-reported"]


def test_since_is_never_before_the_history_the_page_has() -> None:
    # As the GPU-health rows: a 7-day window (steps of 1h 24m) over a store of 62 minutes,
    # an MPS GPU unreported from the store's first step is since the history's start "or
    # earlier"; it read 22 minutes before the store held any data, with no "or earlier".
    week = Window(END - 7 * 86400.0, END, 5040.0)
    began = END - 3720.0
    c = PageContext(week, began, gpus={G: GpuInfo("node-a", "0", G.uuid)},
                    gpu_price={"node-a": 1.006})
    [row] = VERDICT.rows(VERDICT.judge({UNREPORTED: [(lab(G), series({END: 0.0}))]}, c), c, {})
    assert row["since"] == f"{fmt.clock(began)} or earlier"
    # Where the history is longer than the window: the window's start, "or earlier".
    [row] = VERDICT.rows(VERDICT.judge(
        {UNREPORTED: [(lab(G), series({t: 0.0 for t in T}))]}, ctx()), ctx(), {})
    assert row["since"] == f"{fmt.clock(WINDOW.start)} or earlier"
    # Unreported from within the history: the start of its first step.
    [row] = VERDICT.rows(VERDICT.judge(
        {UNREPORTED: [(lab(G), series({t: 0.0 for t in T[30:]}))]}, ctx()), ctx(), {})
    assert row["since"] == fmt.clock(T[29])

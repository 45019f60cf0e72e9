"""Step queries (:mod:`gpuscope.dashboard.data.steps`): a verdict's series declared as data and
answered by every store. The same samples of a small, mostly healthy fleet are loaded into
the embedded store (``ingest()`` on a fake clock), a real Prometheus (TSDB blocks from
promtool) and a real VictoriaMetrics (its import API), through ``tests.stores``; the three
flag the same devices at the same steps, and a healthy device answers with nothing. Then the
PromQL text, the validation of every field that reaches it, and the embedded store's
bounds.

A query restricted by ``on`` to the devices other queries flag (which containers held a
broken GPU while it was broken) is checked on the same three stores: the same containers
at the same steps, none of a healthy GPU, none that left the GPU before it broke.

The Prometheus store sends a list of step queries as one range query, each query tagged with
its position (``label_replace``) and the texts joined with ``or``: on both real stores its
answers are the very answers of one query each (the private per-query path), and it sends
one query for any number of step queries within a query's size (several over it)."""

from __future__ import annotations

import itertools
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import FrozenInstanceError, dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from gpuscope.dashboard.data import DataError, EmbeddedData, StepQuery
from gpuscope.dashboard.data.prometheus import EDGE, MAX_QUERY_BYTES
from gpuscope.dashboard.data.recorded import RULES
from gpuscope.dashboard.data.steps import EDGE as STEPS_EDGE
from gpuscope.dashboard.data.steps import STEP_LABEL, combined, promql
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.series import GpuRef, Series
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.spinning import work_means
from tests.conftest import free_port
from tests.dashboard.test_backends import spy
from tests.stores import Store, fleet_in_both

INTERVAL = 15.0   # every store holds the same samples, 15 s apart
STEP = 60.0       # a one-hour window in 60 steps on every store (embedded: max_points=60)
WINDOW = 3600.0
OFFSET = 7.0      # samples 7 s before each quarter-minute: none on a step's boundary
HISTORY = WINDOW + 600.0

LOST = StepQuery("gpu_up", "min", "<", 1.0)
XID = StepQuery("gpu_xid_errors_total", "increase", ">", 0.0, by=("gpu", "uuid", "xid"))
XID_ANY = StepQuery("gpu_xid_errors_total", "increase", ">", 0.0)  # summed over the codes
REMAP = StepQuery("gpu_row_remap_pending", "max", ">", 0.0)
#: Throttle seconds per second, for two of the reasons only (``match``).
THROTTLE = StepQuery("gpu_throttle_seconds_total", "rate", ">=", 0.2,
                     by=("gpu", "uuid", "reason"), match=(("reason", ("power", "thermal")),))
QUERIES = (LOST, XID, XID_ANY, REMAP, THROTTLE)
EXTRA = ("gpu_up", "gpu_xid_errors_total", "gpu_row_remap_pending")

# When each planted fault shows, in seconds before the data's end (sample times).
DOWN_FROM = 1507.0                 # node-a GPU 1: gpu_up 0 from then to the end
# node-b GPU 0: xid 79 +1, then +2; the second rise early in its step (its sample before is
# more than two embedded intervals before the next step: that step sees it on Prometheus and
# VictoriaMetrics, whose range reaches a minute back, not on the embedded store).
XID_AT = (2707.0, 937.0)
REMAP_FROM, REMAP_TO = 2407.0, 1207.0  # node-b GPU 1: a row remap pending, then done
RESET_AT = 3007.0                  # node-a GPU 0: its exporter restarts (xid 13's 5 -> 0)
FIRST_XID = 607.0                  # node-b GPU 1: xid 48's series appears, at 1
# node-a GPU 0: thermal throttling at 0.5 s/s between these (its counter grows 7.5 a
# sample); idle clocks (low_utilization) at 1 s/s and power at 0.1 s/s throughout.
THROTTLE_FROM, THROTTLE_TO = 2107.0, 907.0

# Which container holds which GPU (``container_gpu_allocated``, as the exporter labels it:
# namespace, pod, container, uuid): (pod, uuid, first, last), in seconds before the end
# (sample times, both included; None: from the history's start).
ALLOCATED = (
    ("train-0", "GPU-a1", 1687.0, 0.0),    # both hold node-a GPU 1 through its loss
    ("train-1", "GPU-a1", 1687.0, 0.0),
    ("gone", "GPU-a1", None, 1567.0),      # left it in the step before the loss's step
    ("leaving", "GPU-a1", 2002.0, 1522.0),  # left 15 s before the loss, in the loss's step
    ("healthy", "GPU-a0", None, 0.0),      # a healthy GPU throughout
    ("victim", "GPU-b0", None, 0.0),       # node-b GPU 0: its XIDs
    ("sliced", "MIG-a0-1", None, 0.0),     # a slice of node-a GPU 0 (throttled)
)
ALLOC = StepQuery("container_gpu_allocated", "max", ">", 0.0,
                  by=("namespace", "pod", "container", "uuid"))
#: The containers on a lost GPU or one with an XID, at the steps it was so: ``on`` of two
#: queries with different label sets (XID's has ``xid``).
HELD = StepQuery("container_gpu_allocated", "max", ">", 0.0,
                 by=("namespace", "pod", "container", "uuid"), on=(LOST, XID))

#: node-s GPU 0's power (watts) while it spins, and its power limit (watts) before and
#: after the cap is raised halfway through the window.
SPIN_WATTS, SPIN_LIMITS = 90.0, (400.0, 700.0)

GPUS = (("node-a", "0", "GPU-a0"), ("node-a", "1", "GPU-a1"),
        ("node-b", "0", "GPU-b0"), ("node-b", "1", "GPU-b1"))
#: A MIG slice of node-a GPU 0 (the throttled one), stated by ``gpu_info`` throughout:
#: (node, uuid, its GPU's uuid).
SLICES = (("node-a", "MIG-a0-1", "GPU-a0"),)
#: Where each device is.
NODES = {uuid: node for node, *_, uuid in (*GPUS, *((n, u) for n, u, _ in SLICES))}

Point = tuple[float, float]


def plant(end: float) -> list[tuple[str, dict[str, str], list[Point]]]:
    """The fleet's series: name, labels (with ``node``) and samples. Everything healthy
    besides the planted faults; node-a GPU 0 healthy throughout (an XID counter that stays
    flat, and is reset once by an exporter restart). node-b GPU 1's first XID 48 makes its
    series appear at 1 (as the exporter shows a code's first XID): no increase for
    Prometheus (two samples in the range) nor the embedded store, one for VictoriaMetrics
    (it counts a new series' small first value from 0)."""
    times = [end - OFFSET - INTERVAL * k for k in range(int(HISTORY // INTERVAL), -1, -1)]

    def ago(t: float) -> float:
        return end - t

    out: list[tuple[str, dict[str, str], list[Point]]] = []
    for node, gpu, uuid in GPUS:
        lab = {"node": node, "gpu": gpu, "uuid": uuid}
        down = uuid == "GPU-a1"
        out.append(("gpu_up", lab, [(t, 0.0 if down and ago(t) <= DOWN_FROM else 1.0)
                                    for t in times]))
        pending = uuid == "GPU-b1"
        out.append(("gpu_row_remap_pending", lab, [
            (t, 1.0 if pending and REMAP_TO <= ago(t) <= REMAP_FROM else 0.0) for t in times]))
    out.append(("gpu_xid_errors_total", {"node": "node-a", "gpu": "0", "uuid": "GPU-a0",
                                         "xid": "13"},
                [(t, 5.0 if ago(t) > RESET_AT else 0.0) for t in times]))
    out.append(("gpu_xid_errors_total", {"node": "node-b", "gpu": "0", "uuid": "GPU-b0",
                                         "xid": "79"},
                [(t, float((ago(t) <= XID_AT[0]) + 2 * (ago(t) <= XID_AT[1]))) for t in times]))
    out.append(("gpu_xid_errors_total", {"node": "node-b", "gpu": "0", "uuid": "GPU-b0",
                                         "xid": "13"},
                [(t, 2.0) for t in times]))
    out.append(("gpu_xid_errors_total", {"node": "node-b", "gpu": "1", "uuid": "GPU-b1",
                                         "xid": "48"},
                [(t, 1.0) for t in times if ago(t) <= FIRST_XID]))
    a0 = {"node": "node-a", "gpu": "0", "uuid": "GPU-a0"}
    out.append(("gpu_throttle_seconds_total", {**a0, "reason": "thermal"}, [
        (t, 0.5 * max(0.0, THROTTLE_FROM - max(ago(t), THROTTLE_TO))) for t in times]))
    out.append(("gpu_throttle_seconds_total", {**a0, "reason": "low_utilization"},
                [(t, 1.0 * (t - times[0])) for t in times]))
    out.append(("gpu_throttle_seconds_total", {**a0, "reason": "power"},
                [(t, 0.1 * (t - times[0])) for t in times]))
    # node-s GPU 0 (no GPM) spinning at every minute of the history as the recording rules
    # record it (a sample a minute, 23 s before each minute), at 90 W, its power limit
    # raised from 400 W to 700 W halfway (the raw gauge, scraped).
    s0 = {"node": "node-s", "gpu": "0", "uuid": "GPU-s0"}
    minutes = [end - 23.0 - 60.0 * k for k in range(int(WINDOW // 60) - 1, -1, -1)]
    out.append((RULES["spin"], s0, [(t, 1.0) for t in minutes]))
    out.append((RULES["power"], s0, [(t, SPIN_WATTS) for t in minutes]))
    out.append(("gpu_power_limit_watts", s0, [
        (t, SPIN_LIMITS[0] if ago(t) > WINDOW / 2 else SPIN_LIMITS[1]) for t in times]))
    for node, uuid, parent in SLICES:
        out.append(("gpu_info", {"node": node, "gpu": "0/1", "uuid": uuid,
                                 "parent_uuid": parent, "mig_profile": "3g.40gb"},
                    [(t, 1.0) for t in times]))
    for pod, uuid, first, last in ALLOCATED:
        lab = {"node": NODES[uuid], "namespace": "ml", "pod": pod, "container": "main",
               "uuid": uuid}
        out.append(("container_gpu_allocated", lab, [
            (t, 1.0) for t in times if (first is None or ago(t) <= first) and ago(t) >= last]))
    return out


@dataclass
class Planted:
    """:func:`plant`'s series in the two formats ``tests.stores.fleet_in_both`` loads (the
    interface of ``bench.fleet.Fleet`` it uses), as a real scrape labels them (``job``,
    ``instance``: left out of every ``by``)."""

    end: float
    rows: list[tuple[str, dict[str, str], list[Point]]] = field(default_factory=list)
    series: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        self.rows = plant(self.end)
        self.shape = SimpleNamespace(end=self.end)

    def scraped(self) -> Iterator[tuple[str, dict[str, str], list[Point]]]:
        for name, lab, points in self.rows:
            yield name, {**lab, "job": "gpuscope", "instance": f"{lab['node']}:9463"}, points

    def extra(self) -> tuple[str, ...]:
        """The metrics the embedded store keeps beside its own (``extra_metrics``)."""
        return EXTRA

    def openmetrics(self) -> Iterator[str]:
        self.series = self.samples = 0
        rows = sorted(self.scraped(), key=lambda r: r[0])
        for family in sorted({name for name, _, _ in rows}):
            base, kind = ((family.removesuffix("_total"), "counter")
                          if family.endswith("_total") else (family, "gauge"))
            yield f"# TYPE {base} {kind}\n"
            for name, lab, points in rows:
                if name != family:
                    continue
                text = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
                self.series += 1
                self.samples += len(points)
                yield "".join(f"{name}{{{text}}} {v!r} {t:.3f}\n" for t, v in points)
        yield "# EOF\n"

    def vm_json_lines(self) -> Iterator[bytes]:
        self.series = self.samples = 0
        for name, lab, points in self.scraped():
            self.series += 1
            self.samples += len(points)
            yield (json.dumps({"metric": {"__name__": name, **lab},
                               "values": [v for _, v in points],
                               "timestamps": [round(t * 1000) for t, _ in points]})
                   + "\n").encode()

    def embedded(self, **kw: Any) -> EmbeddedData:
        """An embedded store that scraped these samples (a fake clock at the end), keeping
        :meth:`extra` too."""
        store = EmbeddedData([], interval=INTERVAL, max_points=int(WINDOW // STEP),
                             clock=lambda: self.end, extra_metrics=self.extra(), **kw)
        scrapes: dict[tuple[str, float], list[tuple[str, dict[str, str], float]]] = {}
        for name, lab, points in self.rows:
            bare = {k: v for k, v in lab.items() if k != "node"}
            for t, v in points:
                scrapes.setdefault((lab["node"], t), []).append((name, bare, v))
        for (node, t), samples in sorted(scrapes.items(), key=lambda kv: kv[0][1]):
            store.ingest(node, samples, t)
        return store


@dataclass
class Stores:
    planted: Planted
    prometheus: Store
    victoriametrics: Store


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    # The data ends on a minute (the window's grid on every store), 5 minutes before now
    # (older than VictoriaMetrics' 30 s latency offset).
    planted = Planted((time.time() // 60 - 5) * 60)
    with fleet_in_both(planted, tmp_path_factory.mktemp("steps")) as (prom, vm):
        yield Stores(planted, prom, vm)


Answers = dict[StepQuery, list[tuple[dict[str, str], Series]]]


def exact(answer: Answers) -> str:
    """An answer, byte for byte: each query's series in order, each one's labels in order,
    its times and values (``repr``: ``-0.0`` and ``0.0`` differ)."""
    return repr([(q, [(list(lab.items()), s.times, s.values) for lab, s in rows])
                 for q, rows in answer.items()])


def answers(stores: Stores, queries: tuple[StepQuery, ...] = QUERIES) -> dict[str, Answers]:
    """Each store's answer to ``queries``; on Prometheus and VictoriaMetrics sent as one
    range query, and one more for the queries with ``on`` where their ``on`` flagged a
    device (:meth:`PrometheusData.step_series`): the very answer of one query each."""
    end = stores.planted.end
    out = {}
    embedded = stores.planted.embedded()
    try:
        assert embedded.window(WINDOW).step == STEP and embedded.window(WINDOW).end == end
        out["embedded"] = embedded.step_series(queries, WINDOW)
    finally:
        embedded.close()
    for store in (stores.prometheus, stores.victoriametrics):
        prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
        try:
            assert prom.window(WINDOW).step == STEP and prom.window(WINDOW).end == end
            sent = spy(prom, "range")
            out[store.kind] = prom.step_series(queries, WINDOW)
            second = any(q.on for q in queries)  # the planted faults flag devices
            assert len(sent) == 1 + second and all(STEP_LABEL in q for q in sent), sent
            assert exact(out[store.kind]) == exact(prom._step_series_each(queries, WINDOW))
        finally:
            prom.close()
    return out


def keyed(rows: list[tuple[dict[str, str], Series]]) -> dict[tuple[str, ...], Series]:
    keys = {tuple(sorted(lab.items())): s for lab, s in rows}
    assert len(keys) == len(rows), "one series per key"
    return keys


def test_three_stores_flag_the_same_steps(stores: Stores) -> None:
    end = stores.planted.end
    seen = answers(stores)

    def key(node: str, gpu: str, uuid: str, **more: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"node": node, "gpu": gpu, "uuid": uuid, **more}.items()))

    # The planted faults, as (first, last) flagged step before the end: the step holding
    # the first sample that shows the fault, and the step holding its last sample (for an
    # increase: the step holding the rise, or the one after it, as the range reaches a
    # minute back into the step before: ``steps``' docstring).
    def step_of(ago: float) -> float:
        return math.floor(ago / STEP) * STEP

    want = {
        LOST: {key("node-a", "1", "GPU-a1"): (step_of(DOWN_FROM), 0.0)},
        XID: {key("node-b", "0", "GPU-b0", xid="79"): (step_of(XID_AT[0]),
                                                        step_of(XID_AT[1]))},
        XID_ANY: {key("node-b", "0", "GPU-b0"): (step_of(XID_AT[0]), step_of(XID_AT[1]))},
        REMAP: {key("node-b", "1", "GPU-b1"): (step_of(REMAP_FROM), step_of(REMAP_TO))},
        # Thermal only: idle clocks are not asked for, power is below the ratio.
        THROTTLE: {key("node-a", "0", "GPU-a0", reason="thermal"): (step_of(THROTTLE_FROM),
                                                                    step_of(THROTTLE_TO))},
    }
    grid = {end - STEP * k for k in range(int(WINDOW // STEP) + 1)}
    first_xid = {key("node-b", "1", "GPU-b1", xid="48"), key("node-b", "1", "GPU-b1")}
    for kind, answer in seen.items():
        assert set(answer) == set(QUERIES), kind
        for q in QUERIES:
            rows = keyed(answer[q])
            if kind == "victoriametrics" and q in (XID, XID_ANY):
                # Where VictoriaMetrics differs: the new series' first XID, in the steps
                # whose range holds its first sample (none of the others see it).
                new = {k: rows.pop(k) for k in set(rows) & first_xid}
                for s in new.values():
                    assert {end - t for t in s.times} <= {step_of(FIRST_XID) - STEP * i
                                                          for i in range(3)}, s.times
            # The same devices on every store, and only the faulty one: a healthy device
            # (node-a GPU 0 throughout, whose XID counter was reset) answers with nothing.
            assert set(rows) == set(want[q]), (kind, q, sorted(rows))
            for k, (first, last) in want[q].items():
                s = rows[k]
                assert s.times and set(s.times) <= grid, (kind, q, s.times)
                assert list(s.times) == sorted(s.times)
                assert all(q.passes(v) for v in s.values), (kind, q, s.values)
                # Within a step of the planted times (an increase's echo in the step after).
                assert abs((end - s.times[0]) - first) <= STEP, (kind, q, end - s.times[0])
                assert abs((end - s.times[-1]) - last) <= STEP, (kind, q, end - s.times[-1])
    # Across stores: the same keys, first and last flagged steps within a step; gauges
    # (min, max) exactly the same steps.
    base = seen["embedded"]
    for kind in ("prometheus", "victoriametrics"):
        for q in QUERIES:
            ours, theirs = keyed(base[q]), keyed(seen[kind][q])
            if q in (XID, XID_ANY):
                for k in first_xid:
                    theirs.pop(k, None)
            assert set(ours) == set(theirs)
            for k in ours:
                a, b = ours[k], theirs[k]
                assert abs(a.times[0] - b.times[0]) <= STEP, (kind, q, a.times, b.times)
                assert abs(a.times[-1] - b.times[-1]) <= STEP, (kind, q, a.times, b.times)
                if q.reduce not in ("increase", "rate"):
                    assert a.times == b.times, (kind, q)
                    assert a.values == b.values, (kind, q)
    # A rate: the steps wholly inside the throttling read its rate on every store.
    for kind, answer in seen.items():
        thermal = keyed(answer[THROTTLE])[key("node-a", "0", "GPU-a0", reason="thermal")]
        inside = [v for t, v in zip(thermal.times, thermal.values, strict=True)
                  if THROTTLE_TO + 2 * STEP < end - t < THROTTLE_FROM - 3 * STEP]
        assert len(inside) >= 15 and all(v == pytest.approx(0.5, rel=0.02) for v in inside), (
            kind, inside)
    # The gauges' flagged steps are exactly the planted ones on the embedded store.
    lost = keyed(base[LOST])[key("node-a", "1", "GPU-a1")]
    assert lost.times[0] == end - step_of(DOWN_FROM) and lost.times[-1] == end
    assert len(lost.times) == step_of(DOWN_FROM) // STEP + 1
    remap = keyed(base[REMAP])[key("node-b", "1", "GPU-b1")]
    assert (remap.times[0], remap.times[-1]) == (end - step_of(REMAP_FROM),
                                                  end - step_of(REMAP_TO))
    assert len(remap.times) == (step_of(REMAP_FROM) - step_of(REMAP_TO)) // STEP + 1
    # The increase: each rise in its own step (and perhaps the one after), by how much it
    # rose there (the embedded store does not extrapolate; Prometheus scales to its range).
    xid = keyed(base[XID])[key("node-b", "0", "GPU-b0", xid="79")]
    rises = {end - step_of(a) for a in XID_AT}
    assert rises <= set(xid.times) <= rises | {t + STEP for t in rises}
    assert {v for t, v in zip(xid.times, xid.values, strict=True) if t in rises} == {1.0, 2.0}


def test_the_containers_on_the_flagged_devices(stores: Stores) -> None:
    """``on``: the containers that held a GPU at the steps LOST or XID flagged it, on every
    store. Per step: a container is returned at a step where it held the GPU (a sample in
    the step) and the GPU was flagged (likewise), whatever their order within the step."""
    end = stores.planted.end
    seen = answers(stores, (HELD, ALLOC, LOST, XID))

    def pod(name: str, uuid: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"node": NODES[uuid], "namespace": "ml", "pod": name,
                             "container": "main", "uuid": uuid}.items()))

    lost_steps = tuple(end - STEP * k for k in range(int(DOWN_FROM // STEP), -1, -1))
    for kind, answer in seen.items():
        held, alloc = keyed(answer[HELD]), keyed(answer[ALLOC])
        # Unrestricted, every container answers (the healthy GPU's and the one gone too)...
        assert set(alloc) == {pod(p, u) for p, u, _, _ in ALLOCATED}, kind
        # ... restricted, those on a flagged GPU at the flagged steps: exactly the steps of
        # this store's own LOST and XID answers, with ALLOC's values (``and`` keeps them).
        flagged = {(lab["node"], lab["uuid"], t) for q in (LOST, XID)
                   for lab, s in answer[q] for t in s.times}
        want = {}
        for k, s in alloc.items():
            lab = dict(k)
            on = [(t, v) for t, v in zip(s.times, s.values, strict=True)
                  if (lab["node"], lab["uuid"], t) in flagged]
            if on:
                want[k] = (tuple(t for t, _ in on), tuple(v for _, v in on))
        assert {k: (s.times, s.values) for k, s in held.items()} == want, kind
        # Who: the two on the lost GPU through its loss; the one that left it in the loss's
        # step at that one step (its last sample, 15 s before gpu_up's first 0, and that 0
        # fall in the same step: the step is the unit); the one on node-b GPU 0 at its XID
        # steps. Not the healthy GPU's, nor the one that left a step before the loss.
        assert set(held) == {pod("train-0", "GPU-a1"), pod("train-1", "GPU-a1"),
                             pod("leaving", "GPU-a1"), pod("victim", "GPU-b0")}, kind
        for name in ("train-0", "train-1"):
            assert held[pod(name, "GPU-a1")].times == lost_steps, kind
        assert held[pod("leaving", "GPU-a1")].times == (lost_steps[0],), kind
        assert held[pod("leaving", "GPU-a1")].values == (1.0,), kind
        assert alloc[pod("gone", "GPU-a1")].times[-1] == lost_steps[0] - STEP, kind
        [(_, xid)] = [(lab, s) for lab, s in answer[XID] if lab["uuid"] == "GPU-b0"]
        assert held[pod("victim", "GPU-b0")].times == xid.times, kind
    # Across stores: the same containers; on the lost GPU (a gauge) the same steps; on
    # node-b GPU 0 an XID's steps, which may differ by a step (``steps``' docstring).
    base = keyed(seen["embedded"][HELD])
    for kind in ("prometheus", "victoriametrics"):
        theirs = keyed(seen[kind][HELD])
        assert set(theirs) == set(base), kind
        for k, s in base.items():
            if dict(k)["uuid"] == "GPU-a1":
                assert (theirs[k].times, theirs[k].values) == (s.times, s.values), kind
            else:
                assert abs(theirs[k].times[0] - s.times[0]) <= STEP, kind
                assert abs(theirs[k].times[-1] - s.times[-1]) <= STEP, kind
    # On a healthy fleet's devices (the restriction by LOST alone: node-b has none) nothing.
    # ``on`` of queries with the same labels: where both flag a device, ``or`` keeps the
    # first's series only, and the device is there all the same (``down`` flags the lost GPU
    # at every step LOST does but the loss's first, where its max is still 1).
    only_lost = StepQuery(ALLOC.metric, "max", ">", 0.0, by=ALLOC.by, on=(LOST,))
    down = StepQuery("gpu_up", "max", "<", 1.0)
    both = StepQuery(ALLOC.metric, "max", ">", 0.0, by=ALLOC.by, on=(down, LOST))
    for kind, answer in answers(stores, (only_lost, both, down)).items():
        assert {dict(k)["node"] for k in keyed(answer[only_lost])} == {"node-a"}, kind
        assert {dict(k)["pod"] for k in keyed(answer[only_lost])} == {
            "train-0", "train-1", "leaving"}, kind
        [(_, d)] = answer[down]
        assert d.times == lost_steps[1:], kind
        assert ({k: (s.times, s.values) for k, s in keyed(answer[both]).items()}
                == {k: (s.times, s.values) for k, s in keyed(answer[only_lost]).items()}), kind


def test_the_containers_on_the_flagged_gpus_slices(stores: Stores) -> None:
    """``slices``: the containers on a flagged GPU, and those on its MIG slices at the steps
    it was flagged (labelled with its ``parent_uuid``), on every store; without it, none on
    its slices (which nothing flags)."""
    own = StepQuery(ALLOC.metric, "max", ">", 0.0, by=ALLOC.by, on=(THROTTLE,))
    both = StepQuery(ALLOC.metric, "max", ">", 0.0, by=ALLOC.by, on=(THROTTLE,), slices=True)
    sliced = {"node": "node-a", "namespace": "ml", "pod": "sliced", "container": "main",
              "uuid": "MIG-a0-1", "parent_uuid": "GPU-a0"}
    for kind, answer in answers(stores, (own, both, THROTTLE)).items():
        [throttled] = [s for lab, s in answer[THROTTLE] if lab["uuid"] == "GPU-a0"]
        assert {dict(k)["pod"] for k in keyed(answer[own])} == {"healthy"}, kind
        got = keyed(answer[both])
        [key] = set(got) - set(keyed(answer[own]))
        assert dict(key) == sliced, kind
        assert (got[key].times, got[key].values) == (
            throttled.times, (1.0,) * len(throttled.times)), kind
        assert {k: (s.times, s.values) for k, s in got.items() if k != key} == {
            k: (s.times, s.values) for k, s in keyed(answer[own]).items()}, kind


def test_a_summarised_spinning_runs_share_of_its_limit_is_each_minutes(stores: Stores
                                                                        ) -> None:
    """(``FleetData.read_spinning``, the spinning rows of runs the recording rules
    summarised; here for this module's stores.) node-s GPU 0 spins at every recorded
    minute without GPM, at 90 W, its cap raised from 400 W to 700 W halfway: "of its limit"
    is the mean of each minute's power over that minute's limit, about 0.18, on both stores
    and for both forms (the run over the whole history, and a run up to the end). It was
    the mean power over the last step's highest limit, 0.129."""
    end = stores.planted.end
    ref = GpuRef("node-s", "GPU-s0")
    want = sum(SPIN_WATTS / lim for lim in SPIN_LIMITS) / 2
    for store in (stores.prometheus, stores.victoriametrics):
        prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
        try:
            window = prom.window(WINDOW)
            for whole, trailing in ((["node-s"], []), ([], ["node-s"])):
                means = prom.read_spinning(window, window.start, whole, trailing)
                found = work_means(means[ref])
                assert found["signal"] == "power", (store.kind, means)
                assert found["power_ratio"] == pytest.approx(want, abs=0.01), (
                    store.kind, trailing, means)
        finally:
            prom.close()


def distinct(n: int) -> tuple[StepQuery, ...]:
    """``n`` different step queries of every shape (with ``on`` too): the registry's, this
    module's, and more of them at other thresholds."""
    out = dict.fromkeys((*registry.step_queries(), *QUERIES, ALLOC, HELD))
    k = 0
    while len(out) < n:
        k += 1
        for q in (LOST, XID, REMAP, HELD):
            out.setdefault(StepQuery(q.metric, q.reduce, q.keep, q.threshold + k * 0.25,
                                     by=q.by, on=q.on))
    return tuple(out)[:n]


@pytest.mark.parametrize("n", [0, 1, 2, len(registry.step_queries()), 40])
def test_one_range_query_for_any_number_of_step_queries(stores: Stores, n: int) -> None:
    """However many step queries (within a query's size), one range query: one HTTP
    request; and one more for the queries with ``on`` whose ``on`` flagged a device, asked
    of those devices only. The answers are those of one query each, byte for byte."""
    queries = distinct(n)
    assert len(set(queries)) == n
    end = stores.planted.end
    for store in (stores.prometheus, stores.victoriametrics):
        prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
        try:
            # Whether the recording rules are loaded (for the queries with a recorded form)
            # is asked once per window length and kept: asked here first.
            assert prom.rules_loaded(prom.window(WINDOW)) is False
            # The window the page is served (where the store has data: its newest sample,
            # kept for the window), asked here first too.
            assert prom.served(prom.window(WINDOW)) == prom.window(WINDOW)
            ons = prom._step_series_each([o for q in queries for o in q.on], WINDOW)
            flagging = [q for q in queries if q.on and any(ons[o] for o in q.on)]
            rounds = min(n, 1) + bool(flagging)
            before = prom.queries_total
            ranged, requests = spy(prom, "range"), spy(prom, "_api")
            got = prom.step_series(queries + queries[:3], WINDOW)  # a query twice: once
            assert len(ranged) == len(requests) == rounds, (store.kind, ranged)
            assert prom.queries_total - before == rounds
            assert list(got) == list(queries)
            assert exact(got) == exact(prom._step_series_each(queries, WINDOW)), store.kind
            if n:
                assert all(len(q.encode()) <= MAX_QUERY_BYTES for q in ranged)
                # The first round: every query without ``on`` and every ``on``'s queries.
                first = {*(q for q in queries if not q.on), *(o for q in queries for o in q.on)}
                assert ranged[0].count(f'"{STEP_LABEL}"') == len(first)
                assert sum(map(len, got.values())) > 0  # some answer: not all empty
            assert all(STEP_LABEL not in lab for rows in got.values() for lab, _ in rows)
        finally:
            prom.close()


def test_more_than_a_query_holds_is_sent_in_parts(stores: Stores) -> None:
    """Step queries whose combined text is over :data:`MAX_QUERY_BYTES` go out in parts
    (halves, as the node lists), each within it, every query in exactly one; the answers
    the same, byte for byte."""
    queries = distinct(120)
    whole = combined({i: promql(q, STEP) for i, q in enumerate(queries)})
    assert len(whole.encode()) > MAX_QUERY_BYTES
    end = stores.planted.end
    for store in (stores.prometheus, stores.victoriametrics):
        prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
        try:
            ranged = spy(prom, "range")
            got = prom.step_series(queries, WINDOW)
            assert 2 <= len(ranged) <= 2 * len(whole.encode()) // MAX_QUERY_BYTES + 1, len(ranged)
            assert all(len(q.encode()) <= MAX_QUERY_BYTES for q in ranged)
            # The first round (no ``uuid=~`` of flagged devices): every query without ``on``
            # and every ``on``'s queries, each in exactly one part.
            first = list(dict.fromkeys([*(q for q in queries if not q.on),
                                        *(o for q in queries for o in q.on)]))
            tags = [int(t) for q in ranged if 'uuid=~"' not in q
                    for t in re.findall(rf'"{STEP_LABEL}", "(\d+)"', q)]
            assert tags == list(range(len(first)))
            assert exact(got) == exact(prom._step_series_each(queries, WINDOW)), store.kind
        finally:
            prom.close()


def test_one_failing_part_fails_them_all() -> None:
    """An error of the store (or an answer not tagged as sent) is a DataError for every
    query, as when one of several queries failed; a part of several as well."""
    for bad in ("error", "untagged", "unknown"):
        prom = PrometheusData("http://127.0.0.1:1", clock=lambda: 1_800_000_000.0)

        def fake_range(text: str, window: Any, bad: str = bad) -> list[tuple[dict[str, str],
                                                                              Series]]:
            if bad == "error" and '"0", "", ""' not in text:  # the first part answers
                raise DataError("Prometheus: bad_data: query timed out")
            if bad == "error" and 'uuid=~"' in text:  # a second round's part fails too
                raise DataError("Prometheus: bad_data: query timed out")
            tag = {"untagged": {}, "unknown": {STEP_LABEL: "999"}}.get(bad, {STEP_LABEL: "0"})
            return [({"node": "n", "uuid": "U", **tag}, Series((window.end,), (1.0,)))]

        prom.range = fake_range  # type: ignore[method-assign]
        prom._check_rules = lambda window: (False, 0)  # type: ignore[method-assign]
        try:
            with pytest.raises(DataError, match="timed out" if bad == "error" else STEP_LABEL):
                prom.step_series(distinct(120 if bad == "error" else 3), WINDOW)
        finally:
            prom.close()


def test_an_empty_answer_and_a_failing_store() -> None:
    store = EmbeddedData([], interval=INTERVAL, clock=lambda: 1e9, extra_metrics=EXTRA)
    assert store.step_series((*QUERIES, HELD), WINDOW) == {q: [] for q in (*QUERIES, HELD)}
    store.close()
    prom = PrometheusData(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(DataError, match="unreachable"):
        prom.step_series(QUERIES, WINDOW)
    prom.close()
    with pytest.raises(DataError, match="closed"):
        prom.step_series(QUERIES, WINDOW)


# -- the PromQL ------------------------------------------------------------------------------

def test_promql_text() -> None:
    assert promql(LOST, 60.0) == "min by (node, gpu, uuid) (min_over_time(gpu_up[59999ms])) < 1.0"
    assert promql(REMAP, 60.0) == (
        "max by (node, gpu, uuid) (max_over_time(gpu_row_remap_pending[59999ms])) > 0.0")
    # increase: summed over what ``by`` leaves out; its range reaches a lookback further back.
    assert promql(XID, 60.0) == ("sum by (node, gpu, uuid, xid) "
                                 "(increase(gpu_xid_errors_total[119999ms])) > 0.0")
    assert promql(XID_ANY, 300.0) == ("sum by (node, gpu, uuid) "
                                      "(increase(gpu_xid_errors_total[359999ms])) > 0.0")
    # A step shorter than the lookback: the lookback (as the fleet page's gauges).
    assert promql(LOST, 15.0) == "min by (node, gpu, uuid) (min_over_time(gpu_up[59999ms])) < 1.0"
    assert promql(LOST, 15.0, lookback=0.0).endswith("(gpu_up[14999ms])) < 1.0")
    q = StepQuery("DCGM_FI_DEV_XID_ERRORS", "max", ">=", -1.5e-3, by=("Hostname", "gpu"))
    assert promql(q, 90.0, lookback=30.0) == (
        "max by (node, Hostname, gpu) (max_over_time(DCGM_FI_DEV_XID_ERRORS[89999ms])) >= -0.0015")
    assert STEPS_EDGE == EDGE
    with pytest.raises(ValueError):
        promql(LOST, 0.0)


def test_promql_text_on() -> None:
    """``on``: this query's text ``and on (node, uuid)`` the ``or`` of its ``on``'s texts, each
    at the same step and lookback."""
    assert promql(HELD, 60.0) == (
        "(max by (node, namespace, pod, container, uuid) "
        "(max_over_time(container_gpu_allocated[59999ms])) > 0.0) and on (node, uuid) "
        "(min by (node, gpu, uuid) (min_over_time(gpu_up[59999ms])) < 1.0 or "
        "sum by (node, gpu, uuid, xid) (increase(gpu_xid_errors_total[119999ms])) > 0.0)")
    one = StepQuery(ALLOC.metric, "max", ">", 0.0, by=ALLOC.by, on=(REMAP,))
    assert promql(one, 300.0, lookback=30.0) == (
        f"({promql(ALLOC, 300.0, lookback=30.0)}) and on (node, uuid) "
        f"({promql(REMAP, 300.0, lookback=30.0)})")
    assert promql(HELD.bare, 60.0) == promql(ALLOC, 60.0)
    # Frozen and hashable, ``on`` part of its identity.
    assert HELD.bare == ALLOC and HELD != ALLOC and hash(HELD) != hash(ALLOC)
    same = StepQuery("container_gpu_allocated", "max", ">", 0.0,
                     by=("namespace", "pod", "container", "uuid"), on=(LOST, XID))
    assert same == HELD and hash(same) == hash(HELD) and len({HELD, same, ALLOC}) == 2
    # The order of ``on`` is part of its identity, not of its meaning.
    assert StepQuery(ALLOC.metric, "max", ">", 0.0, by=ALLOC.by, on=(XID, LOST)) != HELD
    with pytest.raises(FrozenInstanceError):
        HELD.on = ()  # type: ignore[misc]
    assert HELD.metrics == {"container_gpu_allocated", "gpu_up", "gpu_xid_errors_total"}
    assert LOST.metrics == {"gpu_up"} and LOST.bare is LOST


@pytest.mark.parametrize("bad", [
    dict(on=[LOST]),                       # a list: not hashable
    dict(on=LOST),
    dict(on=("gpu_up",)),
    dict(on=(("gpu_up", "min", "<", 1.0),)),
    dict(on=(HELD,)),                      # one level only
    dict(on=(StepQuery("gpu_up", "min", "<", 1.0, by=("gpu",)),)),  # no uuid to match
    dict(on=(StepQuery("gpu_up", "min", "<", 1.0, by=()),)),
    dict(on=(LOST,), by=("gpu",)),         # this query without uuid
    dict(on=(LOST,), by=()),
])
def test_on_is_validated(bad: dict[str, Any]) -> None:
    fields: dict[str, Any] = dict(metric="container_gpu_allocated", reduce="max", keep=">",
                                  threshold=0.0, by=ALLOC.by)
    with pytest.raises(ValueError, match=r"on|uuid"):
        StepQuery(**{**fields, **bad})
    StepQuery(**{**fields, "on": ()})  # empty: no restriction
    StepQuery(**{**fields, "by": ("uuid",), "on": (LOST, XID, XID_ANY, REMAP)})


@pytest.mark.parametrize("bad", [
    dict(slices=True),                                         # no on: no GPU flagged
    dict(slices=1, on=(LOST,)),
    dict(slices=True, on=(LOST,), by=("parent_uuid", "uuid")),  # the label it adds
])
def test_slices_is_validated(bad: dict[str, Any]) -> None:
    fields: dict[str, Any] = dict(metric="container_gpu_allocated", reduce="max", keep=">",
                                  threshold=0.0, by=ALLOC.by)
    with pytest.raises(ValueError, match="slices"):
        StepQuery(**{**fields, **bad})
    q = StepQuery(**{**fields, "on": (LOST,), "slices": True})
    assert q.bare == ALLOC and q != StepQuery(**{**fields, "on": (LOST,)})
    assert promql(q, 60.0) == (
        f"(({promql(ALLOC, 60.0)}) and on (node, uuid) ({promql(LOST, 60.0)})) or "
        f"(({promql(ALLOC, 60.0)}) * on (node, uuid) group_left (parent_uuid) "
        f"group by (node, uuid, parent_uuid) "
        f'(max_over_time(gpu_info{{parent_uuid!=""}}[59999ms])) and on (node, parent_uuid) '
        f'label_replace({promql(LOST, 60.0)}, "parent_uuid", "$1", "uuid", "(.*)"))')


@pytest.mark.parametrize("bad", [
    dict(metric="gpu up"), dict(metric='gpu_up{node="x"}'), dict(metric="1gpu"),
    dict(metric=""), dict(metric='gpu_up"}) or vector(1'), dict(metric="gpu-up"),
    dict(reduce="avg"), dict(reduce="min_over_time"), dict(keep="=="), dict(keep="!="),
    dict(keep="> 0 or vector(1) >"),
    dict(threshold=math.nan), dict(threshold=math.inf), dict(threshold=True),
    dict(threshold="1 or vector(1)"),
    dict(by=("gpu", "a-b")), dict(by=("gpu) or vector(1",)), dict(by=("__name__",)),
    dict(by=("node",)), dict(by=("gpu", "gpu")), dict(by="gpu"), dict(by=["gpu"]),
    dict(by=("",)), dict(by=("1gpu",)), dict(by=(STEP_LABEL,)), dict(by=("gpu", STEP_LABEL)),
])
def test_every_field_is_validated(bad: dict[str, Any]) -> None:
    fields: dict[str, Any] = dict(metric="gpu_up", reduce="min", keep="<", threshold=1.0)
    with pytest.raises(ValueError):
        StepQuery(**{**fields, **bad})


def test_only_the_querys_fields_reach_the_store() -> None:
    """The PromQL is built from the query's validated fields and the window's step alone
    (no parameter takes a name from the page), and has one shape; the store sends just it."""
    by = r"\(node(, [A-Za-z_][A-Za-z0-9_]*)*\)"
    sel = (r'[A-Za-z_:][A-Za-z0-9_:]*'
           r'(\{[a-z_]+=~"[A-Za-z0-9_|.\\-]+"(, [a-z_]+=~"[A-Za-z0-9_|.\\-]+")*\})?\[\d+m?s\]')
    # (a rate: each exporter pod's increase, summed over the pods, over the range)
    rate = (rf"\(sum by {by} \(max by \(node(, [A-Za-z_][A-Za-z0-9_]*)*, instance\) "
            rf"\(increase\({sel}\)\)\) / \d+\.\d+\)")
    gauge = rf"(min|max|sum) by {by} \((min_over_time|max_over_time|increase)\({sel}\)\)"
    shape = re.compile(rf"^({gauge}|{rate}) (<|>|<=|>=) -?\d+\.\d+(e[+-]\d+)?$")
    for q in QUERIES:
        for step in (1.0, 15.0, 60.0, 86.4, 3600.0):
            assert shape.match(promql(q, step)), promql(q, step)
    # With ``on``: that shape, ``and on (node, uuid)``, and that shape or'ed.
    plain = shape.pattern.strip("^$")
    on = re.compile(rf"^\({plain}\) and on \(node, uuid\) \({plain}( or {plain})*\)$")
    for step in (1.0, 15.0, 60.0, 86.4, 3600.0):
        assert on.match(promql(HELD, step)), promql(HELD, step)
        assert not shape.match(promql(HELD, step))
    # Sent together: each of those tagged with its position, or'ed.
    tagged = rf'label_replace\(({plain}|{on.pattern.strip("^$")}), "{STEP_LABEL}", "\d+", "", ""\)'
    together = re.compile(rf"^{tagged}( or {tagged})*$")
    prom = PrometheusData("http://127.0.0.1:1", clock=lambda: 1_800_000_000.0)
    sent: list[str] = []

    def fake_range(text: str, window: Any) -> list[tuple[dict[str, str], Series]]:
        sent.append(text)
        return [({"node": "n", "gpu": "0", "uuid": "U", STEP_LABEL: i},
                 Series((window.end,), (float(i) + len(sent),)))
                for i in re.findall(rf'"{STEP_LABEL}", "(\d+)"', text)[::-1]]

    prom.range = fake_range  # type: ignore[method-assign]
    try:
        got = prom.step_series([LOST, XID, LOST, HELD], WINDOW)
    finally:
        prom.close()
    # Each query once: the first round LOST and XID (HELD's ``on`` among them), the second
    # HELD on the device they flagged, its node and UUID as matchers.
    assert sent[0] == combined({0: promql(LOST, STEP), 1: promql(XID, STEP)})
    assert together.match(sent[0]), sent[0]
    assert sent[0] == (
        f'label_replace({promql(LOST, STEP)}, "gpuscope_step_query", "0", "", "") or '
        f'label_replace({promql(XID, STEP)}, "gpuscope_step_query", "1", "", "")')
    among = {"node": '=~"n"', "cluster": '=~""', "uuid": '=~"U"'}
    assert sent[1:] == [combined({0: promql(HELD.bare, STEP, among=among)})]
    assert tagged and shape.pattern  # (the shapes above; the second round's has matchers)
    # Split back by the position, the label removed; HELD kept at the flagged step.
    assert list(got) == [LOST, XID, HELD]
    for q, value in ((LOST, 1.0), (XID, 2.0), (HELD, 2.0)):
        [(lab, s)] = got[q]
        assert lab == {"node": "n", "gpu": "0", "uuid": "U"} and s.values == (value,), q


# -- the embedded store ----------------------------------------------------------------------

def test_embedded_keeps_the_extra_metrics_within_its_bounds() -> None:
    with pytest.raises(ValueError, match="extra_metrics"):
        EmbeddedData([], extra_metrics="gpu_up")
    for bad in ("gpu up", "gpu_info"):
        with pytest.raises(ValueError):
            EmbeddedData([], extra_metrics=[bad])
    plain = EmbeddedData([], interval=INTERVAL, clock=lambda: 1000.0)
    plain.ingest("n", [("gpu_up", {"uuid": "U"}, 0.0)], 990.0)
    assert not plain._rings  # not asked for: not kept
    with pytest.raises(ValueError, match="gpu_up"):  # a query it cannot answer is an error
        plain.step_series([LOST], 60.0)
    with pytest.raises(ValueError, match="gpu_up"):  # ... also through ``on``
        plain.step_series([StepQuery(ALLOC.metric, "max", ">", 0.0, by=ALLOC.by,
                                     on=(LOST,))], 60.0)
    plain.close()
    few = EmbeddedData([], interval=INTERVAL, clock=lambda: 1000.0, max_series=2,
                       extra_metrics=EXTRA)
    few.ingest("n", [("gpu_up", {"uuid": str(i)}, 0.0) for i in range(3)], 990.0)
    assert len(few._rings) == 2 and few.dropped_series == 1
    few.close()


def test_embedded_increase_and_gaps() -> None:
    """A counter's drop is a reset (counting from 0 again), an increase needs two samples in
    its range (a counter that appears with its count shows none), and a step without a
    sample has no point."""
    end = 1_800_000_000.0
    store = EmbeddedData([], interval=INTERVAL, max_points=60, clock=lambda: end,
                         extra_metrics=EXTRA)
    samples = {
        # 2 -> 3 -> reset to 0 -> 1: two errors in the step.
        ("gpu_xid_errors_total", "79"): [(end - 52, 2.0), (end - 37, 3.0), (end - 22, 0.0),
                                         (end - 7, 1.0)],
        # Appears at 1 (its first XID) and stays: no increase anywhere.
        ("gpu_xid_errors_total", "48"): [(end - 127 + 15 * k, 1.0) for k in range(9)],
    }
    for (name, xid), points in samples.items():
        for t, v in points:
            store.ingest("n", [(name, {"gpu": "0", "uuid": "U", "xid": xid}, v)], t)
    # gpu_up: samples over the last 10 minutes but for 3 minutes (ages 120-300 s).
    for k in range(39, -1, -1):  # oldest first (the store keeps each series in order)
        t = end - 7 - 15 * k
        if not 120 < end - t < 300:
            store.ingest("n", [("gpu_up", {"gpu": "0", "uuid": "U"}, 1.0)], t)
    every = StepQuery("gpu_up", "min", ">=", 0.0)
    assert store.window(WINDOW).step == STEP
    got = store.step_series([XID, every], WINDOW)
    store.close()
    assert [(lab, s.times, s.values) for lab, s in got[XID]] == [
        ({"node": "n", "gpu": "0", "uuid": "U", "xid": "79"}, (end,), (2.0,))]
    [(lab, up)] = got[every]
    assert lab == {"node": "n", "gpu": "0", "uuid": "U"}
    assert [end - t for t in up.times] == [540, 480, 420, 360, 300, 60, 0]


class _Rollout(Planted):
    """One GPU throttled (thermal) at 0.3 s/s throughout, its exporter rolled out half-way:
    the old pod's last sample ``ROLLOUT_GAP`` before the new pod's first, which is on a new
    address with its counter from 0."""

    def __post_init__(self) -> None:
        times = [self.end - HISTORY + OFFSET + INTERVAL * i
                 for i in range(int(HISTORY // INTERVAL))]
        cut = self.end - WINDOW / 2
        lab = {"node": "node-r", "gpu": "0", "uuid": "GPU-r0", "reason": "thermal"}
        old = [(t, 0.3 * (t - times[0])) for t in times if t <= cut - ROLLOUT_GAP]
        new = [(t, 0.3 * (t - cut)) for t in times if t >= cut]
        self.rows = [("gpu_throttle_seconds_total", {**lab, "pod": "old"}, old),
                     ("gpu_throttle_seconds_total", {**lab, "pod": "new"}, new)]
        self.shape = SimpleNamespace(end=self.end)

    def scraped(self) -> Iterator[tuple[str, dict[str, str], list[Point]]]:
        for name, lab, points in self.rows:
            address = "10.0.0.1" if lab["pod"] == "old" else "10.0.0.2"
            bare = {k: v for k, v in lab.items() if k != "pod"}
            yield name, {**bare, "job": "gpuscope", "instance": f"{address}:9463"}, points


ROLLOUT_GAP = 15.0


def test_a_rate_is_summed_over_the_exporter_pods_across_a_rollout(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # Throttled at 0.3 throughout: each pod's rate covers only its part of the steps around
    # the rollout, and the largest of the two read below 0.2 there (the GPU left the
    # throttled verdict for a step, its run began again); summed, every step is flagged.
    q = StepQuery("gpu_throttle_seconds_total", "rate", ">=", 0.2,
                  by=("gpu", "uuid", "reason"))
    planted = _Rollout((time.time() // 60 - 5) * 60)
    with fleet_in_both(planted, tmp_path_factory.mktemp("rollout")) as (prom, vm):
        for store in (prom, vm):
            source = PrometheusData(store.url, clock=lambda: planted.end, timeout=60)
            try:
                [(lab, s)] = source.step_series((q,), WINDOW)[q]
            finally:
                source.close()
            assert lab["uuid"] == "GPU-r0"
            # Every step of the window (the first one or two may lack a full range).
            assert len(s.times) >= WINDOW // STEP - 1, (store.kind, s.times)
            assert all(b - a == STEP for a, b in itertools.pairwise(s.times)), (
                store.kind, [planted.end - t for t in s.times])
            # At the rollout both stores read the rate less the missed scrape's part (their
            # summed rates: 0.6 on VictoriaMetrics there), elsewhere the rate.
            near = {round(planted.end - t): v for t, v in zip(s.times, s.values, strict=True)
                    if abs(planted.end - t - WINDOW / 2) <= 2 * STEP}
            assert all(0.2 <= v <= 0.31 for v in near.values()), (store.kind, near)

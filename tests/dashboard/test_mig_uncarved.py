"""A GPU in MIG mode with no MIG slice carved (the MIG manager's layout not applied, or every
slice destroyed) runs nothing: NVML gives it no utilization and it has no slice to be judged
by. The exporter says its mode (``gpu_sharing_info{sharing="mig"}``); the page judges it idle
(a whole GPU of idle time, by the signal ``mig``) at the steps it is in MIG mode with no
slice, so a node of such GPUs is an idle node, in the embedded store and in Prometheus and
VictoriaMetrics, raw and with the recording rules.

The fleet: three nodes of ``bench/fleet.py``'s templates, the series of some GPUs rewritten
as an exporter serves a GPU in MIG mode with nothing carved (no utilization, no busy
counter, no work signals, no container series; ``gpu_sharing_info{sharing="mig"}``):

- ``gpu-node-00000`` (a ``busy`` DGX, priced as a p4d): all 8 GPUs so: an idle node, 8
  unallocated GPUs;
- ``gpu-node-00001`` (another ``busy`` DGX): GPU 0 alone: idle, its node busy;
- ``gpu-node-00002`` (``near-miss``): untouched, busy."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bench.fleet as F
from gpuscope.dashboard.data import EmbeddedData
from gpuscope.dashboard.data.reduce import uncarved
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import GpuRef
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.views import FleetView, page_view
from tests.dashboard.test_node_presence import page_with_the_rules, store_page
from tests.stores import Store, backfill_rules, fleet_in_both, replay_rules, start_prometheus

WINDOW = 3600.0
STEP = 60.0
ALL_MIG, ONE_MIG, BUSY = "gpu-node-00000", "gpu-node-00001", "gpu-node-00002"
#: What an exporter no longer serves for a GPU in MIG mode (NVML: not supported on it), and
#: the containers' series (nothing runs on it).
GONE = frozenset({
    "gpu_utilization_ratio", "gpu_busy_seconds_total", "gpu_sm_active_seconds_total",
    "gpu_tensor_active_seconds_total", "gpu_dram_active_seconds_total",
    "container_gpu_allocated", "container_gpu_utilization_ratio",
    "container_gpu_memory_used_bytes",
})

pytestmark = pytest.mark.timeout(600)


class _Uncarved(F.Fleet):
    """The fleet with the GPUs of :meth:`uncarved` in MIG mode, no slice carved."""

    families = F.KEEP | {"gpu_sharing_info"}

    @staticmethod
    def uncarved(lab: dict[str, str]) -> bool:
        return lab["node"] == ALL_MIG or (lab["node"] == ONE_MIG and lab.get("gpu") == "0")

    def _gpu_uuids(self) -> set[tuple[str, str]]:
        return {(lab["node"], lab["uuid"]) for _, lab, _, _ in super().series_of("gpu_info")
                if self.uncarved(lab)}

    def series_of(self, family: str | None = None):  # type: ignore[no-untyped-def]
        mig = self._gpu_uuids()
        asked = "gpu_utilization_ratio" if family == "gpu_sharing_info" else family
        for name, lab, values, ks in super().series_of(asked):
            device = (lab["node"], lab.get("uuid", ""))
            if name == "gpu_utilization_ratio" and family in (None, "gpu_sharing_info"):
                # Each GPU's mode, where it says its utilization (or would).
                yield ("gpu_sharing_info",
                       {**lab, "sharing": "mig" if device in mig else "exclusive"},
                       [1.0 if v == v else v for v in values], ks)
                if family == "gpu_sharing_info":
                    continue
            if name in GONE and device in mig:
                continue
            yield name, lab, values, ks


def uncarved_fleet(end: float) -> F.Fleet:
    nodes = F.layout({"busy": 2, "near-miss": 1})
    assert [n.name for n in nodes] == [ALL_MIG, ONE_MIG, BUSY]
    return _Uncarved(F.Shape(3, STEP, WINDOW, end), nodes)


def judged(view: FleetView, what: str) -> None:
    """The node of 8 uncarved GPUs is idle, unallocated, at its p4d price; the GPU of the
    other node is idle (not "no data") and its node is not; nothing else changes."""
    price = bundled_prices().node_price("p4d.24xlarge", "on-demand").per_hour
    assert price is not None
    rows = {r.node: r for r in view.idle_rows}
    assert set(rows) == {ALL_MIG}, what
    row = rows[ALL_MIG]
    assert (row.gpus, row.allocated_gpus, row.spinning_gpus) == (8, 0, 0), what
    assert row.price_per_hour == pytest.approx(price), what
    assert row.idle_seconds == pytest.approx(view.history_seconds, abs=STEP), what
    assert row.wasted == pytest.approx(price * view.history_seconds / 3600, rel=0.02), what
    assert row.wasted_allocated == 0.0, what
    k = view.kpis
    assert k.idle_nodes == 1, what
    # 8 + 8 + 1 GPUs: the 9 uncarved idle, none without data.
    assert (k.gpus, k.idle, k.no_data, k.spinning) == (17, 9, 0, 0), what
    assert k.burning_per_hour == pytest.approx(price), what
    assert not view.slice_rows, what
    assert not view.allocated_idle_rows, what


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[F.Fleet, Path, float, dict[str, Store]]]:
    end = (time.time() // 60 - 5) * 60 - 23.0
    fleet = uncarved_fleet(end)
    work = tmp_path_factory.mktemp("uncarved")
    with fleet_in_both(fleet, work) as stores:
        yield fleet, work / "tsdb", end, {s.kind: s for s in stores}


def embedded_page(end: float) -> tuple[FleetView, Any]:
    fleet = uncarved_fleet(end)
    store = EmbeddedData([], interval=STEP, max_points=int(WINDOW // STEP),
                         max_series=1 << 20, clock=lambda: end,
                         extra_metrics=registry.step_metrics())
    try:
        for t, node, samples in F.scrapes(fleet):
            store.ingest(node, samples, t)
        data = store.fleet(WINDOW)
        return page_view(store, WINDOW, bundled_prices()), data
    finally:
        store.close()


def test_the_steps_in_mig_mode_with_no_slice() -> None:
    # Steps at 60..600 s; GPU g in MIG mode throughout, its slice there up to 300 s (then
    # destroyed); GPU h in MIG mode with a utilization of its own at 600 s; GPU e
    # exclusive; the slice's own mode is not a GPU's.
    evals = [60.0 * k for k in range(1, 11)]
    ts = list(evals)
    one = [1.0] * len(ts)
    infos = [{"node": "n", "uuid": "g", "gpu": "0"}, {"node": "n", "uuid": "h", "gpu": "1"},
             {"node": "n", "uuid": "e", "gpu": "2"},
             {"node": "n", "uuid": "MIG-g1", "gpu": "0/1", "parent_uuid": "g"}]
    modes = [({"node": "n", "uuid": u, "gpu": "", "sharing": m}, ts, one)
             for u, m in (("g", "mig"), ("h", "mig"), ("e", "exclusive"), ("MIG-g1", "mig"))]
    g, h = GpuRef("n", "g"), GpuRef("n", "h")
    out = uncarved(modes, {h: (600.0,)}, {GpuRef("n", "MIG-g1"): tuple(evals[:5])}, infos,
                   evals, 60.0)
    assert set(out) == {g, h}
    assert out[g].times == tuple(evals[5:]) and set(out[g].values) == {0.0}
    assert out[h].times == tuple(evals[:-1])


def test_in_the_embedded_store() -> None:
    end = (time.time() // 60 - 5) * 60 - 23.0
    view, data = embedded_page(end)
    judged(view, "embedded")
    # Judged by its mode: 0 at every step, the signal "mig".
    ref = next(r for r, info in data.gpus.items() if r.node == ONE_MIG and info.gpu == "0")
    assert data.idle_signal[ref] == "mig"
    assert set(data.gpu_busy_max[ref].values) == {0.0}


def test_a_gpu_with_slices_is_judged_by_them_in_the_embedded_store() -> None:
    # MIG mode with slices (the "mixed" template's GPUs 6 and 7): its own mode does not make
    # it idle; its slices do, or not, as before.
    end = (time.time() // 60 - 5) * 60 - 23.0
    fleet = F.Fleet(F.Shape(1, STEP, WINDOW, end), F.layout({"mixed": 1}))
    store = EmbeddedData([], interval=STEP, max_points=int(WINDOW // STEP),
                         max_series=1 << 20, clock=lambda: end,
                         extra_metrics=registry.step_metrics())
    try:
        for t, node, samples in F.scrapes(fleet):
            parents = {lab["parent_uuid"] for name, lab, _ in samples
                       if name == "gpu_info" and lab.get("parent_uuid")}
            samples = [*samples, *(("gpu_sharing_info", {"gpu": "6", "uuid": u,
                                                         "sharing": "mig"}, 1.0)
                                   for u in parents)]
            store.ingest(node, samples, t)
        data = store.fleet(WINDOW)
    finally:
        store.close()
    parents = {GpuRef(i.node, i.parent_uuid) for i in data.gpus.values() if not i.is_physical}
    assert parents
    assert not parents & set(data.gpu_busy_max)


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics"])
def test_in_prometheus_and_victoriametrics(
        stored: tuple[F.Fleet, Path, float, dict[str, Store]], kind: str) -> None:
    _, _, end, stores = stored
    judged(store_page(stores[kind].url, end, rules=False), kind)


def test_with_the_recording_rules_in_prometheus(
        stored: tuple[F.Fleet, Path, float, dict[str, Store]], tmp_path: Path) -> None:
    fleet, tsdb, end, _ = stored
    blocks = tmp_path / "tsdb"
    shutil.copytree(tsdb, blocks, copy_function=lambda s, d: Path(d).hardlink_to(s))
    backfill_rules(blocks, fleet.shape.start, end, tmp_path)
    with start_prometheus(blocks, copy=False) as store:
        view = page_with_the_rules(store.url, end)
        # The recorded flag says by what it was judged; the GPU is not "silent".
        flagged = store.query('uuid:gpu_idle_activity:ratio1m{node="gpu-node-00001"}', end)
        assert {(r["metric"]["gpu"], r["metric"]["signal"]) for r in flagged} == {("0", "mig")}
        assert not store.query('uuid:gpu_silent:info1m', end)
    judged(view, "prometheus, rules")


def test_with_the_recording_rules_in_victoriametrics(
        stored: tuple[F.Fleet, Path, float, dict[str, Store]], tmp_path: Path) -> None:
    fleet, _, end, stores = stored
    vm = stores["victoriametrics"]
    replay_rules(vm, fleet.shape.start, end, tmp_path)
    judged(page_with_the_rules(vm.url, end), "victoriametrics, rules")

"""The verdicts' runs as the rules record them minute by minute
(``dashboard/verdicts/runs.py``): read back (:class:`RecordedRun`), by Prometheus' own rule
engine (``promtool test rules``) on flags drawn by hand, and on a 60-node bench fleet in a
real VictoriaMetrics, equal to the verdicts the page judges from the
raw series, with devices and containers reshaped so that runs begin within the hour, begin
with their data, or are cut by a gap."""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import fleet as F
from bench.fleet import build_blocks, import_victoriametrics
from gpuscope.dashboard import ids
from gpuscope.dashboard.data.recorded import CBY, RULE_R, RULES
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.plan.entities import bounded, devices_of, entities_of, entity_queries
from gpuscope.dashboard.plan.rules import RUNS
from gpuscope.dashboard.prices import load_prices
from gpuscope.dashboard.series import ContainerRef, FleetData, GpuRef
from gpuscope.dashboard.verdicts import Thresholds, allocated, idle, spinning, stragglers
from gpuscope.dashboard.verdicts.mig import physical_gpus, slice_share_promql, slice_shares
from gpuscope.dashboard.verdicts.runs import RecordedRun, RunRule, read_runs
from gpuscope.dashboard.verdicts.totals import (
    Entities,
    Found,
    IdleGpus,
    States,
    allocated_nodes,
    fleet_totals,
    open_nodes,
    shown_nodes,
)
from gpuscope.dashboard.views import build_fleet_view, with_details
from tests.dashboard.test_backends import STEP, WINDOW
from tests.stores import (
    Store,
    backfill_rules,
    binary,
    record_runs,
    record_runs_in_blocks,
    replay_rules,
    start_prometheus,
    start_victoriametrics,
)

# --- read back --------------------------------------------------------------------------


def test_a_run_within_the_history_starts_a_minute_before_its_first_minute() -> None:
    run = RecordedRun(since=1_000_200.0, fresh=False, at=1_001_400.0, sums={"x": 10.0},
                      before={})
    assert run.start(1_000_000.0) == 1_000_140.0
    assert run.seconds(1_000_000.0) == 1_260.0
    assert run.minutes_in(1_000_000.0) == 21
    assert run.mean("x", 1_000_000.0) == pytest.approx(10 / 21)


def test_a_run_older_than_the_history_is_the_historys_and_its_mean_the_historys_part(
        ) -> None:
    # Began 10 minutes before the history; the sums then (at the history's start) are
    # taken off: the mean is over the minutes after the history's start.
    run = RecordedRun(since=1_000_000.0, fresh=False, at=1_003_600.0, sums={"x": 61.0},
                      before={"x": 11.0})
    assert run.start(1_000_600.0) == 1_000_600.0
    assert run.seconds(1_000_600.0) == 3_000.0
    assert run.minutes_in(1_000_600.0) == 50
    assert run.mean("x", 1_000_600.0) == pytest.approx(50 / 50)


def test_a_fresh_run_within_two_steps_of_the_history_gets_all_of_it() -> None:
    fresh = RecordedRun(since=1_000_180.0, fresh=True, at=1_003_600.0, sums={}, before={})
    assert fresh.start(1_000_000.0) == 1_000_000.0
    # Not fresh (the device had data and was busy a minute before): its own start.
    assert RecordedRun(1_000_180.0, False, 1_003_600.0, {}, {}).start(1_000_000.0) \
        == 1_000_120.0
    # Fresh but three steps in: its own start.
    assert RecordedRun(1_000_240.0, True, 1_003_600.0, {}, {}).start(1_000_000.0) \
        == 1_000_180.0


# --- Prometheus' rule engine ------------------------------------------------------------

def test_prometheus_records_runs_as_it_evaluates(tmp_path: Path) -> None:
    """``promtool test rules`` evaluates the group every minute, each rule reading what
    the ones before it (and its own evaluation a minute before) wrote. Device a: data at
    minutes 2-6 and 8-11, idle at 3-6 and 8-11 (the gap at 7 ends its first run), held at
    minutes 4 and 9. Device b: data and idle from minute 5, never held (no held sum)."""
    rule = idle.run_rule()
    flag, data, held = RULES["idle"], RULES["util_max"], RULES["idle_held"]
    a = 'node="n1", gpu="0", uuid="GPU-a"'
    b = 'node="n1", gpu="1", uuid="GPU-b"'
    # (input series: one value a minute from minute 0; "_" none.)
    series = [
        (f"{data}{{{a}}}", "_ _ 0 0 0 0 0 _ 0 0 0 0"),
        (f"{flag}{{{a}, signal=\"utilization\"}}", "_ _ _ 0 0 0 0 _ 0 0 0 0"),
        (f"{held}{{node=\"n1\", uuid=\"GPU-a\"}}", "_ _ _ _ 1 _ _ _ _ 1 _ _"),
        (f"{data}{{{b}}}", "_ _ _ _ _ 0 0 0 0 0 0 0"),
        (f"{flag}{{{b}, signal=\"utilization\"}}", "_ _ _ _ _ 0 0 0 0 0 0 0"),
    ]

    def sample(record: str, labels: str, value: float) -> dict[str, Any]:
        return {"labels": f"{record}{{{labels}}}", "value": value}

    since, minutes, held_sum = (RULES[f"idle_run_{p}"]
                                for p in ("since", "minutes", "held_sum"))
    tests = {"rule_files": ["runs.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [
            {"expr": since, "eval_time": "6m",
             "exp_samples": [sample(since, a, 3 * 60), sample(since, b, 5 * 60)]},
            {"expr": held_sum, "eval_time": "6m",
             "exp_samples": [sample(held_sum, a, 1)]},
            {"expr": minutes, "eval_time": "6m",
             "exp_samples": [sample(minutes, a, 4), sample(minutes, b, 2)]},
            {"expr": since, "eval_time": "7m", "exp_samples": [sample(since, b, 5 * 60)]},
            {"expr": since, "eval_time": "11m",
             "exp_samples": [sample(since, a, 8 * 60), sample(since, b, 5 * 60)]},
            {"expr": minutes, "eval_time": "11m",
             "exp_samples": [sample(minutes, a, 4), sample(minutes, b, 7)]},
            {"expr": held_sum, "eval_time": "11m",
             "exp_samples": [sample(held_sum, a, 1)]},
        ],
    }]}
    # The run rules alone, in the group's order, over the flags given as input.
    group = {"groups": [{"name": "runs", "interval": "1m", "rules": [
        {"record": r, "expr": e} for r, e in rule.rules()]}]}
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump(group, width=1 << 20))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(tests, width=1 << 20))
    run = subprocess.run([binary("promtool"), "test", "rules", "test.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


# --- the fleet ---------------------------------------------------------------------------


@dataclass
class Recorded:
    vm: Store
    end: float
    at: float  # the last rule evaluation
    data: FleetData  # the page's series, raw
    reshaped: dict[str, Any]


def _page(vm: Store, end: float) -> FleetData:
    """The fleet page's series from the raw series (the rules not read)."""
    raw = PrometheusData(vm.url, clock=lambda: end, timeout=120)
    raw._check_rules = lambda window: (False, 0)  # type: ignore[method-assign]
    try:
        return raw.fleet(WINDOW)
    finally:
        raw.close()


def _busy_until(v: float, t: float, until: float, busy: float) -> float:
    return busy if t < until else v


def _idle(data: FleetData, th: Thresholds) -> dict[GpuRef, idle.GpuIdle]:
    spin = spinning.spinning_steps(data.signals, th.spin_rule, None)
    return idle.idle_gpus(data.gpu_busy_max, data.window, data.history_start,
                          allocated=data.allocated, spinning=spin, signal=data.idle_signal,
                          known_from=spinning.spin_begins(data.signals, spin, None),
                          threshold=th.idle_utilization, duration=th.idle_duration)


def _allocated(data: FleetData, th: Thresholds) -> list[allocated.AllocatedIdle]:
    return list(allocated.allocated_idle(
        data.held_usage, data.held_signal, data.window, data.history_start,
        threshold=th.allocated_idle_utilization, duration=th.allocated_idle_duration))


def _stragglers(data: FleetData, th: Thresholds) -> Any:
    return stragglers.stragglers(
        data.containers, data.pods, data.window, data.history_start, gpus=data.gpus,
        signals=data.signals, factor=th.straggler_factor, duration=th.straggler_duration,
        slow_factor=th.slow_factor, slow_busy=th.slow_busy)


# The module's fixture builds the fleet in each store and replays the rules into it; the
# first test's setup is charged with it. On a loaded 2-core machine that passed the suite's 120 s
# per test (a slow machine, not a hang): the module's tests have 360 s each.
pytestmark = pytest.mark.timeout(360)

#: The fleet's size: enough nodes for every verdict the reshaping picks (six idle GPUs on six
#: nodes, two allocated-idle containers, a stalled straggler and a whole idle node elsewhere)
#: and for each table's findings; the 200-node agreement is test_embedded_and_stores.py's.
NODES = 60


@pytest.fixture(scope="module", params=["victoriametrics", "prometheus"])
def recorded(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """The fleet over 90 minutes (the page's hour, and runs that began before it), its flags
    recorded by the rules and its runs minute by minute after them: in VictoriaMetrics
    (vmalert's replay, :func:`record_runs`), reshaped first (below); in Prometheus as the
    fleet is (promtool's backfill, :func:`record_runs_in_blocks`)."""
    work = tmp_path_factory.mktemp("runs")
    end = (time.time() // 60 - 5) * 60 - 23.0
    shape = F.Shape(NODES, STEP, 1.5 * WINDOW, end)
    fleet = F.Fleet(shape)
    if request.param == "prometheus":
        blocks = work / "tsdb"
        build_blocks(fleet, blocks)
        backfill_rules(blocks, shape.start, end, work)
        record_runs_in_blocks(blocks, shape.start, end, work)
        with start_prometheus(blocks, copy=False) as prom:
            at = max(float(r["value"][1]) for r in prom.query(
                f"timestamp({RULES['idle_run_since']})", end))
            yield Recorded(prom, end, at, _page(prom, end), {})
        return
    with start_victoriametrics() as vm:
        import_victoriametrics(fleet, vm)
        yield _reshaped(vm, shape, work)


def _reshaped(vm: Store, shape: F.Shape, work: Path) -> Recorded:
    """Devices and containers of the fleet in ``vm`` reshaped so that runs begin within the
    hour, with their data, or after a gap; the rules replayed and the runs recorded."""
    th = Thresholds()
    end = shape.end
    before = _page(vm, end)
    w0 = end - WINDOW
    idle0 = sorted((r for r, v in _idle(before, th).items()
                    if v.idle_seconds and r.uuid.startswith("GPU-")),
                   key=lambda r: (r.node, r.uuid))
    # Six idle GPUs on six nodes: busy the first 20 minutes; one busy sample at minute 45;
    # a 3-minute gap from minute 30; data only from minute 10, 2 and 4.
    picked: list[GpuRef] = []
    for ref in idle0:
        if ref.node not in {p.node for p in picked}:
            picked.append(ref)
    picked = picked[:6]
    shapes: list[Callable[[float, float], float | None]] = [
        lambda v, t: 0.9 if t < w0 + 20 * 60 else v,
        lambda v, t: 0.9 if abs(t - (w0 + 45 * 60)) < 30 else v,
        lambda v, t: None if w0 + 30 * 60 <= t < w0 + 33 * 60 else v,
        lambda v, t: None if t < w0 + 10 * 60 else v,
        lambda v, t: None if t < w0 + 2 * 60 else v,
        lambda v, t: None if t < w0 + 4 * 60 else v,
    ]
    for ref, change in zip(picked, shapes, strict=True):
        assert vm.rewrite(f'gpu_utilization_ratio{{uuid="{ref.uuid}"}}', change)
    # Two allocated-idle containers elsewhere made busy the first 20 and 40 minutes.
    taken = {p.node for p in picked}
    held = sorted((a.ref for a in _allocated(before, th)
                   if a.ref.node not in taken and a.ref.uuid.startswith("GPU-")),
                  key=lambda c: (c.node, c.pod, c.container))[:2]
    for c, minutes in zip(held, (20, 40), strict=True):
        assert vm.rewrite(f'container_gpu_utilization_ratio{{pod="{c.pod}",'
                          f'container="{c.container}",uuid="{c.uuid}"}}',
                          partial(_busy_until, until=w0 + minutes * 60, busy=0.9))
    # One stalled straggler made to work with its peers the first 20 minutes.
    stalled = sorted((s for s in _stragglers(before, th).stragglers
                      if s.kind == "stalled" and s.gpu.node not in taken),
                     key=lambda s: (s.gpu.node, s.gpu.uuid))[:1]
    for s in stalled:
        pods = [c.pod for c in before.containers
                if c.node == s.gpu.node and c.uuid == s.gpu.uuid]
        assert vm.rewrite(f'container_gpu_utilization_ratio{{pod="{pods[0]}",'
                          f'uuid="{s.gpu.uuid}"}}',
                          partial(_busy_until, until=w0 + 20 * 60, busy=0.93))
    # A whole idle node elsewhere busy the first 20 minutes: its runs all began within the
    # hour.
    nodes = idle.idle_nodes(before.gpus, _idle(before, th))
    # (Not a spinning node: its spinning GPUs' verdict reads power and GPM, not utilization.)
    node = min(n for n, v in nodes.items() if not v.mig_gpus and not v.spinning_gpu_seconds
               and n not in taken
               and n not in {c.node for c in held} | {s.gpu.node for s in stalled})
    for ref, info in before.gpus.items():
        if info.node == node:
            assert vm.rewrite(f'gpu_utilization_ratio{{uuid="{ref.uuid}"}}',
                              partial(_busy_until, until=w0 + 20 * 60, busy=0.9))
    data = _page(vm, end)
    replay_rules(vm, shape.start, end, work)
    record_runs(vm, shape.start, end)
    at = max(float(r["value"][1]) for r in vm.query(
        f"tlast_over_time({RULES['idle_run_since']}[{RULE_R}])", end))
    return Recorded(vm, end, at, data, {"idle": picked, "held": held,
                                        "stalled": [s.gpu for s in stalled], "node": node})


def _runs(rec: Recorded, rule: RunRule) -> dict[tuple[str, ...], RecordedRun]:
    def instant(q: str, t: float) -> list[tuple[dict[str, str], float]]:
        return [(r["metric"], float(r["value"][1])) for r in rec.vm.query(q, t)]
    runs = read_runs(instant, rule, rec.end, rec.data.history_start)
    assert {run.at for run in runs.values()} == {rec.at}
    assert all(run.is_current(rec.data.window.end, rec.data.window.step) for run in runs.values())
    return runs


def _signals(rec: Recorded, key: str, by: str) -> dict[tuple[str, ...], str]:
    """The ``signal`` label of a flag's series at the end, by ``by``."""
    labels = [x.strip() for x in by.split(",")]
    return {tuple(r["metric"].get(x, "") for x in labels): r["metric"].get("signal", "")
            for r in rec.vm.query(f"max by ({by}, signal) (last_over_time({RULES[key]}"
                                  f"[{RULE_R}]))", rec.end)}


def _same(want: Any, got: Any) -> bool:
    """Two findings equal, their floats to 1e-9 (a mean from running sums)."""
    if type(want) is not type(got):
        return False
    for f in fields(want):
        a, b = getattr(want, f.name), getattr(got, f.name)
        if isinstance(a, float) and isinstance(b, float):
            if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9):
                return False
        elif a != b:
            return False
    return True


def _differ(want: dict[Any, Any], got: dict[Any, Any]) -> dict[Any, Any]:
    return {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
            if k not in want or k not in got or not _same(want[k], got[k])}


def test_idle_findings_are_the_pages(recorded: Recorded) -> None:
    """Every idle or spinning device's :class:`~idle.GpuIdle` (its run, and the parts a
    container held it and it spun in), from its recorded run."""
    data, th = recorded.data, Thresholds()
    want = {r: v for r, v in _idle(data, th).items() if v.idle_seconds}
    runs = _runs(recorded, RUNS[0])
    # (Most runs began before the page's hour: their sums are taken at its start too.)
    assert sum(1 for run in runs.values() if run.since <= data.history_start) > len(runs) / 2
    assert any(run.before for run in runs.values())
    signal = _signals(recorded, "idle", "node, gpu, uuid")
    got = {GpuRef(node, uuid): idle.gpu_idle_of(
        GpuRef(node, uuid), run, data.window, data.history_start,
        signal=signal.get((node, gpu, uuid)) or "utilization", duration=th.idle_duration)
        for (node, gpu, uuid), run in runs.items()}
    assert want and not _differ(want, got)
    # The reshaped devices' runs are what their shapes make them: busy until minute 20
    # (40), one busy sample at 45 (14), a gap from 30 to 33 (27), and the three that
    # begin with their data.
    if recorded.reshaped:
        shaped = [round(want[r].idle_seconds / 60) for r in recorded.reshaped["idle"]]
        assert shaped[:3] == [40, 14, 27], shaped
        assert len({round(v.idle_seconds) for v in want.values()}) > 3
        assert any(run.fresh for run in runs.values())
    assert any(v.allocated_seconds for v in want.values())
    assert any(v.spinning_seconds for v in want.values())


def test_spinning_findings_are_the_pages(recorded: Recorded) -> None:
    """Every spinning device's :class:`~spinning.Spinning` (its run and mean utilization;
    the other signals' means are the rows' to read)."""
    data, th = recorded.data, Thresholds()
    found = spinning.spinning_gpus(data.signals, data.window, data.history_start,
                                   rule=th.spin_rule, duration=th.spin_duration)
    want = {r: replace(s, sm=None, tensor=None, dram=None, power_ratio=None)
            for r, s in found.items()}
    got = {GpuRef(node, uuid): spinning.spinning_of(
        GpuRef(node, uuid), run, data.window, data.history_start,
        gpm=GpuRef(node, uuid) in data.signals.gpm, duration=th.spin_duration)
        for (node, _, uuid), run in _runs(recorded, RUNS[1]).items()}
    assert want and not _differ(want, got)
    assert any(s.spinning for s in want.values())


def test_allocated_idle_findings_are_the_pages(recorded: Recorded) -> None:
    data, th = recorded.data, Thresholds()
    want = {a.ref: a for a in _allocated(data, th)}
    runs = _runs(recorded, RUNS[2])
    assert any(run.before for run in runs.values())
    signal = _signals(recorded, "held_idle", CBY)
    got = {}
    for k, run in runs.items():
        ref = ContainerRef(*k)
        found = allocated.allocated_idle_of(
            ref, run, data.window, data.history_start, signal=signal.get(k) or "utilization",
            duration=th.allocated_idle_duration)
        if found is not None:
            got[ref] = found
    assert want and not _differ(want, got)
    if recorded.reshaped:
        held = recorded.reshaped["held"]
        assert held[0] in got and held[1] not in got
        assert round(got[held[0]].seconds) == 40 * 60


def test_straggler_findings_are_the_pages(recorded: Recorded) -> None:
    data, th = recorded.data, Thresholds()
    rep = _stragglers(data, th)
    groups = {g.key: g for g in stragglers.workload_groups(data.containers, data.pods,
                                                            data.gpus)}
    for kind, rule in (("stalled", RUNS[3]), ("slow", RUNS[4])):
        want = {s.gpu: s for s in rep.stragglers if s.kind == kind}
        got = {}
        for k, run in _runs(recorded, rule).items():
            node, uuid, namespace, workload, model = k[:5]
            gpu = GpuRef(node, uuid)
            found = stragglers.straggler_of(
                groups[("", namespace, workload, model)], gpu, run, data.window,
                data.history_start, kind=kind, signal=k[5] if kind == "slow" else
                "utilization", duration=th.straggler_duration)
            if found is not None:
                got[gpu] = found
        assert want and not _differ(want, got), kind
    if recorded.reshaped:
        ref = recorded.reshaped["stalled"][0]
        assert [s.seconds for s in rep.stragglers if s.gpu == ref] == [40 * 60.0]


def _entities(rec: Recorded) -> Entities:
    """What the run records say per entity at the end (:func:`entity_queries`)."""
    data = rec.data
    store = PrometheusData(rec.vm.url, clock=lambda: rec.end, timeout=120)
    try:
        assert bounded(data.window, data.history_start, Thresholds())
        return entities_of(store._submit(entity_queries(
            data.window, data.history_start, Thresholds()), data.window)["entities"])
    finally:
        store.close()


def test_idle_nodes_from_their_numbers_are_the_pages(recorded: Recorded) -> None:
    """The idle nodes without MIG from each node's recorded numbers (:func:`node_idle_of`),
    where every run began by the history's start or after its first steps: the page's
    :class:`~idle.NodeIdle` (less the held and spinning GPUs' counts, its rows' to read of
    the GPUs). The others are the nodes a reshaped GPU's run began in between."""
    data, th = recorded.data, Thresholds()
    python = {n: replace(v, allocated_gpus=0, spinning_gpus=0)
              for n, v in idle.idle_nodes(data.gpus, _idle(data, th)).items()
              if not v.mig_gpus}
    runs = _entities(recorded).node_runs
    # Every idle node has its numbers (a node with numbers may be idle for too short).
    assert python and set(python) <= set(runs)
    got = {n: idle.node_idle_of(n, r, data.window, data.history_start,
                                duration=th.idle_duration) for n, r in runs.items()}
    derived = {n: v for n, v in got.items() if v is not None}
    assert not _differ({n: python[n] for n in derived if n in python},
                       {n: v for n, v in derived.items() if n in python})
    assert set(derived) <= set(python)
    left = set(python) - set(derived)
    assert len(left) <= 6, left
    if recorded.reshaped:
        node = recorded.reshaped["node"]
        assert node in derived and derived[node].idle_since > data.history_start
        assert {r.node for r in recorded.reshaped["idle"]} & left


def test_the_store_says_since_when_the_runs_are_recorded(recorded: Recorded) -> None:
    """``gpuscope:dashboard_runs:since_seconds``: the rules' first minute (they ran every
    minute since), as the page reads it; none before the rules ran."""
    data = PrometheusData(recorded.vm.url, clock=lambda: recorded.end, timeout=120)
    try:
        since = data.runs_recorded_since(recorded.data.window)
        first = min(float(r["value"][1]) for r in recorded.vm.query(
            f"min_over_time({RULES['idle_run_since']}[{round(2 * WINDOW)}s])", recorded.end))
        assert since is not None and since <= first
        assert since >= recorded.end - 1.5 * WINDOW - 15 * 60  # (the data: 90 min and a lead)
        assert data.runs_recorded_since(replace(
            recorded.data.window, end=recorded.end - 2 * WINDOW)) is None
    finally:
        data.close()


def test_straggler_groups_gpus_are_the_pages(recorded: Recorded) -> None:
    """``workload:gpu_straggler_group_gpus:sum1h``: each straggler's group's devices per
    node in whole GPUs (a MIG slice its share), as the page's groups have them: what its
    row's "GPUs' $/hour" adds up."""
    data, th = recorded.data, Thresholds()
    shares = slice_shares(data.gpus)
    groups = {g.key: g for g in stragglers.workload_groups(data.containers, data.pods,
                                                            data.gpus)}
    want: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in _stragglers(data, th).stragglers:
        per: dict[str, float] = {}
        for gpu in groups[s.key].devices:
            per[gpu.node] = per.get(gpu.node, 0.0) + shares.get(gpu, 1.0)
        want[s.key[1:]] = per
    got: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in recorded.vm.query(f"max by (namespace, workload, model, node) (last_over_time("
                               f"{RULES['group_gpus']}[{RULE_R}]))", recorded.end):
        m = r["metric"]
        got.setdefault((m["namespace"], m["workload"], m.get("model", "")), {})[m["node"]] = \
            float(r["value"][1])
    differ = {k: (v, got.get(k)) for k, v in want.items()
              if set(v) != set(got.get(k, {}))
              or any(not math.isclose(x, got[k][n], rel_tol=1e-9) for n, x in v.items())}
    assert want and not differ, sorted(differ.items())[:3]
    assert sum(len(v) for v in want.values()) > len(want)  # (groups over several nodes)


def test_allocated_idle_shares_are_the_pages(recorded: Recorded) -> None:
    """``container:gpu_allocated_idle_share:ratio1h``: each allocated-idle container's share
    of its GPU's price as its row prices it (a MIG slice's share, else 1 / the device's
    users: a time-slice)."""
    data, th = recorded.data, Thresholds()
    shares = slice_shares(data.gpus)
    users: dict[GpuRef, set[ContainerRef]] = {}
    for c in [*data.containers, *data.held_usage]:
        if c.namespace:
            users.setdefault(c.gpu, set()).add(c)
    want = {}
    for a in _allocated(data, th):
        info = data.gpus.get(a.ref.gpu)
        if info is not None and not info.is_physical:
            want[a.ref] = shares.get(a.ref.gpu, 0.0)
        else:
            want[a.ref] = 1 / max(1, sum(1 for u in users.get(a.ref.gpu, ()) if u.container))
    got = {ContainerRef(*(r["metric"][k] for k in ("node", "namespace", "pod", "container",
                                                    "uuid"))): float(r["value"][1])
           for r in recorded.vm.query(f"max by ({CBY}) (last_over_time("
                                      f"{RULES['alloc_share']}[{RULE_R}]))", recorded.end)}
    differ = {k: (v, got.get(k)) for k, v in want.items()
              if k not in got or not math.isclose(v, got[k], rel_tol=1e-9)}
    assert want and not differ, sorted(differ.items())[:5]
    assert {round(v, 6) for v in want.values()} > {1.0}  # (slices or time-slices among them)


def test_mig_slices_shares_in_promql_are_the_pages(recorded: Recorded) -> None:
    """Every MIG slice's share of its GPU (``slice_share_promql`` over the recorded compute
    slices) as ``slice_shares`` gives it."""
    shares = slice_shares(recorded.data.gpus)
    known = (f"max by (node, uuid, parent_uuid) (last_over_time({RULES['mig_slices']}"
             f"[{RULE_R}]))")
    got = {GpuRef(r["metric"]["node"], r["metric"]["uuid"]): float(r["value"][1])
           for r in recorded.vm.query(slice_share_promql(known), recorded.end)}
    assert shares and set(got) == set(shares)
    assert all(math.isclose(got[r], v, rel_tol=1e-9) for r, v in shares.items())
    assert len({round(v, 6) for v in shares.values()}) > 1


def test_the_fleets_totals_from_the_records_are_the_pages(recorded: Recorded) -> None:
    """The KPIs and each table's size from the numbers per entity and, for the nodes they
    leave open (and those with MIG slices), their devices' runs: the page's own from the
    raw series; and the nodes each table's first rows are on."""
    data, th = recorded.data, Thresholds()
    view = build_fleet_view(data, load_prices(), th)
    entities = _entities(recorded)
    opened = open_nodes(entities, data.window, data.history_start)
    assert entities.mig_nodes
    if recorded.reshaped:  # (a reshaped GPU's run began within the hour on an idle node)
        assert opened - entities.mig_nodes
    store = PrometheusData(recorded.vm.url, clock=lambda: recorded.end, timeout=120)
    try:
        devices = devices_of(store.instant, data.window, data.history_start, opened,
                             data.gpus, th)
    finally:
        store.close()
    assert devices.nodes == opened
    ctx = view.context
    assert ctx is not None
    whole = {n: len(infos) for n, infos in physical_gpus(data.gpus).items()}
    totals = fleet_totals(entities, devices, data.window, data.history_start,
                          ctx.node_price, whole, th.idle_duration)
    k = view.kpis
    assert totals.states == States(k.idle, k.spinning, k.no_data)
    report = totals.report
    assert len(report.nodes) == k.idle_nodes and len(report.slices) == k.idle_slices
    for name in ("burning_per_hour", "wasted", "wasted_unallocated", "wasted_allocated",
                 "wasted_spinning"):
        assert math.isclose(getattr(report, name), getattr(k, name), rel_tol=1e-9), name
    assert report.unpriced_nodes == k.unpriced_idle_nodes
    assert totals.allocated_idle == k.allocated_idle
    assert math.isclose(totals.allocated_idle_per_hour, k.allocated_idle_per_hour,
                        rel_tol=1e-9)
    assert k.idle_nodes and k.idle_slices and k.spinning and k.allocated_idle
    # The first rows of the idle and allocated-idle tables are on the nodes the page reads,
    # chosen from the numbers alone (the heatmap's left out here: no node summaries).
    rows = 5
    assert view.idle_rows and view.allocated_idle_rows
    assert {r.node for r in view.idle_rows[:rows]} <= shown_nodes(
        entities, data.window, data.history_start, ctx.node_price, whole, {}, rows,
        th.idle_duration)
    assert {r.node for r in view.allocated_idle_rows[:rows]} <= allocated_nodes(
        entities, ctx.node_price, whole, rows)


def _rows_differ(want: Any, got: Any) -> list[tuple[Any, Any]]:
    """The rows (dataclasses) of two tables that differ (floats to 1e-9), in order."""
    if len(want) != len(got):
        return [(len(want), len(got))]
    return [(a, b) for a, b in zip(want, got, strict=True) if not _same(a, b)]


def test_the_page_from_the_records_is_the_pages(recorded: Recorded) -> None:
    """The fleet page where the run records cover its history (the idle devices, nodes
    and slices and the allocated-idle containers from them: ``FleetData.found``) shows
    what the page judged from the raw series shows: the KPIs, the idle nodes', slices',
    allocated-idle and spinning tables, the heatmap."""
    data, th, prices = recorded.data, Thresholds(), load_prices()
    want = build_fleet_view(data, prices, th)
    store = PrometheusData(recorded.vm.url, clock=lambda: recorded.end, timeout=120,
                           prices=prices)
    store.read_records = True
    try:
        page = store.fleet(WINDOW)
        assert isinstance(page.found, Found)
        got = build_fleet_view(page, prices, th)
        # (The heatmap draws all the nodes here, so every idle node's devices came with
        # the page: the rows after the first three as if from their numbers alone, read
        # when shown.)
        first = {r.node for r in got.idle_rows[:3]}
        assert any(r.allocated_gpus for r in got.idle_rows[3:])
        got = replace(got, idle_rows=tuple(
            r if r.node in first else replace(r, allocated_gpus=0, spinning_gpus=0)
            for r in got.idle_rows), row_details={
                **got.row_details,
                ids.IDLE_NODES_TABLE: IdleGpus(partial(store.read_idle_nodes, page.window,
                                                       page.history_start), first)})
        # Every row as "Show all rows" reads it (the idle rows' held and spinning GPUs, the
        # spinning rows' signals, the stragglers' evidence: read for the first rows on
        # their own).
        for table in (ids.IDLE_NODES_TABLE, ids.SPINNING_GPUS_TABLE, ids.STRAGGLERS_TABLE):
            got, problem = with_details(got, table, 1 << 30)
            assert problem is None
    finally:
        store.close()
    assert _same(want.kpis, got.kpis), (want.kpis, got.kpis)
    # (A straggler's evidence, the same path in both, is read from the recorded
    # throttling on one and the raw series on the other: its medians differ in the 4th
    # digit.)
    want = replace(want, straggler_rows=tuple(replace(r, evidence=None)
                                              for r in want.straggler_rows))
    got = replace(got, straggler_rows=tuple(replace(r, evidence=None)
                                            for r in got.straggler_rows))
    for table in ("idle_rows", "slice_rows", "allocated_idle_rows", "spinning_rows",
                  "straggler_rows"):
        differ = _rows_differ(getattr(want, table), getattr(got, table))
        assert not differ, (table, [{f.name: (getattr(a, f.name), getattr(b, f.name))
                                     for f in fields(a) if getattr(a, f.name) != getattr(
                                         b, f.name)} for a, b in differ[:3]])
    # The heatmap as the page with the rules draws it without the run records (the nodes'
    # recorded means order it; the raw page's means differ in the last digits).
    store = PrometheusData(recorded.vm.url, clock=lambda: recorded.end, timeout=120)
    try:
        assert store.fleet(WINDOW).found is None
        rules = build_fleet_view(store.fleet(WINDOW), prices, th)
    finally:
        store.close()
    assert rules.heatmap == got.heatmap
    assert any(any(row) for row in got.heatmap.idle)
    assert want.idle_rows and want.allocated_idle_rows and want.slice_rows

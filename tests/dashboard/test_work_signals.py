"""The verdicts on the work signals, on hand-built series: spinning GPUs (GPM and the power
rule), slow and stalled stragglers compared like with like, throttled GPUs, allocated-idle
containers, MIG slices in idle nodes and waste. Each flag exactly where DESIGN.md's
definitions put it, and not on the near misses."""

from __future__ import annotations

import pytest

from gpuscope.dashboard.series import (
    ContainerRef,
    GpuInfo,
    GpuRef,
    PodInfo,
    Series,
    WorkSignals,
)
from gpuscope.dashboard.verdicts.allocated import allocated_idle, held_usage
from gpuscope.dashboard.verdicts.idle import idle_gpus, idle_nodes, idle_slices
from gpuscope.dashboard.verdicts.mig import compute_slices, slice_shares
from gpuscope.dashboard.verdicts.spinning import SpinningRow, spinning_gpus, spinning_steps
from gpuscope.dashboard.verdicts.stragglers import stragglers
from gpuscope.dashboard.verdicts.throttle import throttled_gpus
from gpuscope.dashboard.verdicts.waste import waste
from tests.dashboard.conftest import T0, make_series, make_window

HOUR = 3600.0
N = 61  # one point a minute over the hour, both ends included
G = GpuRef("node-a", "GPU-0")


def flat(value: float, n: int = N) -> Series:
    return make_series([value] * n)


def gpm(util: float, sm: float, tensor: float, dram: float, ref: GpuRef = G,
        n: int = N) -> WorkSignals:
    return WorkSignals(utilization={ref: flat(util, n)}, sm={ref: flat(sm, n)},
                       tensor={ref: flat(tensor, n)}, dram={ref: flat(dram, n)},
                       power={ref: flat(300.0, n)}, power_limit={ref: 700.0},
                       gpm=frozenset({ref}))


def no_gpm(util: float, power: float, limit: float = 400.0, n: int = N) -> WorkSignals:
    return WorkSignals(utilization={G: flat(util, n)}, power={G: flat(power, n)},
                       power_limit={G: limit})


def spins(signals: WorkSignals, window: float = HOUR, history: float | None = None) -> bool:
    w = make_window(window)
    hs = w.start if history is None else T0 - history
    verdict = spinning_gpus(signals, w, hs).get(G)
    return verdict is not None and verdict.spinning


# -- spinning ---------------------------------------------------------------------------------


def test_a_hung_collective_spins_with_gpm() -> None:
    # 100 % "utilization"; NCCL keeps a few SMs polling; no tensor or DRAM work.
    w = make_window(HOUR)
    v = spinning_gpus(gpm(1.0, 0.08, 0.0, 0.01), w, w.start)[G]
    assert v.spinning and v.signal == "gpm"
    assert v.seconds == pytest.approx(HOUR)
    assert (v.utilization, v.sm, v.tensor, v.dram) == pytest.approx((1.0, 0.08, 0.0, 0.01))
    assert v.required_seconds == 30 * 60


@pytest.mark.parametrize(("util", "sm", "tensor", "dram", "spinning"), [
    (1.0, 0.1, 0.0, 0.5, False),    # near miss: memory-bound job (DRAM 0.5, no tensor work)
    (1.0, 0.9, 0.0, 0.01, False),   # near miss: FP32 compute job (SM 0.9, no tensor pipes)
    (1.0, 0.29, 0.019, 0.019, True),
    (1.0, 0.3, 0.0, 0.0, False),    # SM activity exactly at the threshold: strict "<"
    (1.0, 0.1, 0.02, 0.0, False),
    (1.0, 0.1, 0.0, 0.02, False),
    (0.5, 0.1, 0.0, 0.0, True),     # utilization exactly 0.5: ">="
    (0.49, 0.1, 0.0, 0.0, False),   # not busy: idle or light, not spinning
])
def test_the_gpm_rule_and_its_near_misses(util: float, sm: float, tensor: float, dram: float,
                                          spinning: bool) -> None:
    assert spins(gpm(util, sm, tensor, dram)) is spinning


@pytest.mark.parametrize(("power", "spinning"), [
    (0.24 * 400, True),
    (0.26 * 400, False),   # near miss: 0.26 x the limit without GPM
    (0.25 * 400, False),   # exactly a quarter: strict "<"
])
def test_the_power_rule_without_gpm(power: float, spinning: bool) -> None:
    assert spins(no_gpm(1.0, power)) is spinning
    if spinning:
        w = make_window(HOUR)
        v = spinning_gpus(no_gpm(1.0, power), w, w.start)[G]
        assert v.signal == "power" and v.sm is None
        assert v.power_ratio == pytest.approx(power / 400)


@pytest.mark.parametrize("aligned", [True, False])
def test_each_step_is_judged_against_its_own_power_limit(aligned: bool) -> None:
    # A power cap of 300 W lifted to 700 W 15 minutes ago; the GPU at 100 % draws 120 W:
    # 0.4 of its limit under the cap (not spinning), 0.17 since (spinning). Judged against
    # the latest limit alone, the hour spun and the GPU was listed: 15 minutes is too short.
    # (Not aligned: the power series lacks the first step, so the steps are read by time.)
    limits = make_series([300.0] * 45 + [700.0] * 16)
    power = flat(120.0) if aligned else make_series([120.0] * 60)
    s = WorkSignals(utilization={G: flat(1.0)}, power={G: power},
                    power_limit={G: 700.0}, power_limits={G: limits})
    assert spinning_steps(s)[G] == set(limits.times[45:])
    w = make_window(HOUR)
    v = spinning_gpus(s, w, w.start)[G]
    assert not v.spinning and v.seconds == pytest.approx(16 * 60)
    # Capped for the last 15 minutes instead: the 45 minutes before spun.
    capped = WorkSignals(utilization={G: flat(1.0)}, power={G: power}, power_limit={G: 300.0},
                         power_limits={G: make_series([700.0] * 45 + [300.0] * 16)})
    assert not spins(capped)


def _embedded_spinning_rows(low: float, high: float, lifted_at: float | None,
                            watts: float) -> list[SpinningRow]:
    """The spinning rows of an embedded page over an hour of one GPU at 100 % drawing
    ``watts``, its power limit ``low`` W until ``lifted_at`` seconds in and ``high`` W from
    then on (``high`` all hour where None), scraped every 15 s."""
    from gpuscope.dashboard.data import EmbeddedData
    from gpuscope.dashboard.prices import bundled_prices
    from gpuscope.dashboard.verdicts import registry
    from gpuscope.dashboard.views import page_view

    interval, n = 15.0, 240
    end = T0 + (n - 1) * interval
    store = EmbeddedData([], interval=interval, clock=lambda: end + 1.0,
                         extra_metrics=registry.step_metrics())
    lab = {"gpu": "0", "uuid": "GPU-0"}
    for k in range(n):
        t = k * interval
        limit = high if lifted_at is None or t >= lifted_at else low
        store.ingest("node-a", [
            ("gpu_info", {**lab, "model": "NVIDIA A10G", "parent_uuid": "",
                          "mig_profile": ""}, 1.0),
            ("gpu_node_info", {"instance_type": "g5.xlarge"}, 1.0),
            ("gpu_utilization_ratio", lab, 1.0),
            ("gpu_busy_seconds_total", lab, t),
            ("gpu_power_limit_watts", lab, limit),
            ("gpu_power_watts", lab, watts),
            ("gpu_energy_joules_total", lab, watts * t),
        ], T0 + t)
    return list(page_view(store, HOUR, bundled_prices()).spinning_rows)


def test_an_embedded_page_judges_a_lifted_power_cap_step_by_step() -> None:
    # The same through the embedded store and the page.
    def page(lifted_at: float | None) -> list[tuple[str, float]]:
        return [(r.gpu, r.seconds)
                for r in _embedded_spinning_rows(300.0, 700.0, lifted_at, 120.0)]

    assert [g for g, _ in page(None)] == ["0"]  # 120 of 700 W all hour: spinning
    assert page(45 * 60.0) == []  # 120 of 300 W until 15 minutes ago


def test_the_share_of_its_limit_is_each_steps_power_over_that_steps_limit() -> None:
    # A cap of 400 W raised to 700 W halfway through the hour; the GPU at 100 % draws 90 W:
    # 0.225 of its limit before (spinning), 0.129 since (spinning). The run's "of its limit"
    # is the mean of the steps' shares, about 0.18: it was the mean power over the latest
    # limit alone, 0.129, as if the cap had been 700 W all along.
    [row] = _embedded_spinning_rows(400.0, 700.0, 30 * 60.0, 90.0)
    assert row.seconds == pytest.approx(HOUR, abs=120)
    assert row.signal == "power"
    assert row.power_ratio == pytest.approx((90 / 400 + 90 / 700) / 2, abs=0.01)
    # The same cap all hour: the share is the one power over the one limit.
    [steady] = _embedded_spinning_rows(400.0, 700.0, None, 90.0)
    assert steady.power_ratio == pytest.approx(90 / 700)
    # On steps read by position (one query's series) and by time (a power series that lacks
    # the first step) alike.
    limits = make_series([400.0] * 30 + [700.0] * 31)
    for power in (flat(90.0), make_series([90.0] * 60)):
        s = WorkSignals(utilization={G: flat(1.0)}, power={G: power},
                        power_limit={G: 700.0}, power_limits={G: limits})
        w = make_window(HOUR)
        v = spinning_gpus(s, w, w.start)[G]
        shares = [90 / lim for t, lim in zip(limits.times, limits.values, strict=True)
                  if t in power.at() and t - w.step >= v.since]  # the run's steps
        assert v.power_ratio == pytest.approx(sum(shares) / len(shares))
        assert v.power_ratio > 90 / 700 + 0.03


def test_with_gpm_power_does_not_decide() -> None:
    # Low power, but the GPM signals show tensor work: not spinning.
    s = gpm(1.0, 0.2, 0.4, 0.3)
    s = WorkSignals(utilization=s.utilization, sm=s.sm, tensor=s.tensor, dram=s.dram,
                    power={G: flat(50.0)}, power_limit={G: 700.0}, gpm=s.gpm)
    assert not spins(s)


def test_a_missing_signal_is_not_spinning() -> None:
    # A GPM device without its tensor series (that metric unsupported): never spinning.
    s = gpm(1.0, 0.05, 0.0, 0.0)
    assert not spins(WorkSignals(utilization=s.utilization, sm=s.sm, dram=s.dram,
                                 power_limit=s.power_limit, gpm=s.gpm))
    # No power limit without GPM: the power rule cannot be applied.
    assert not spins(WorkSignals(utilization={G: flat(1.0)}, power={G: flat(10.0)}))


def test_spinning_needs_30_minutes_or_the_history_there_is() -> None:
    busy = [1.0] * N
    sm = [0.9] * 32 + [0.05] * 29  # spinning for the last 29 steps (29 min)
    s = WorkSignals(utilization={G: make_series(busy)}, sm={G: make_series(sm)},
                    tensor={G: flat(0.0)}, dram={G: flat(0.0)}, gpm=frozenset({G}))
    w = make_window(HOUR)
    v = spinning_gpus(s, w, w.start)[G]
    assert not v.spinning and v.seconds == pytest.approx(29 * 60)
    sm = [0.9] * 30 + [0.05] * 31
    s = WorkSignals(utilization=s.utilization, sm={G: make_series(sm)}, tensor=s.tensor,
                    dram=s.dram, gpm=s.gpm)
    assert spinning_gpus(s, w, w.start)[G].spinning
    # Ten minutes of history, all of it spinning: enough.
    assert spins(gpm(1.0, 0.05, 0.0, 0.0, n=11), history=600)


def test_a_spinning_node_is_an_idle_node_and_waste() -> None:
    gpus = {GpuRef("n", f"GPU-{i}"): GpuInfo("n", str(i), f"GPU-{i}", "H100") for i in range(2)}
    refs = list(gpus)
    signals = WorkSignals(
        utilization={r: flat(1.0) for r in refs}, sm={r: flat(0.1) for r in refs},
        tensor={r: flat(0.0) for r in refs}, dram={r: flat(0.0) for r in refs},
        gpm=frozenset(refs))
    w = make_window(HOUR)
    steps = spinning_steps(signals)
    assert set(steps) == set(refs)
    # Utilization 1.0 in every step: idle only because it spins.
    verdicts = idle_gpus({r: flat(1.0) for r in refs}, w, w.start, spinning=steps)
    assert all(v.idle for v in verdicts.values())
    assert verdicts[refs[0]].spinning_seconds == pytest.approx(HOUR)
    node = idle_nodes(gpus, verdicts)["n"]
    assert node.spinning_gpus == 2 and node.spinning_gpu_seconds == pytest.approx(2 * HOUR)
    report = waste({"n": node}, {"n": 55.04})
    assert report.wasted == pytest.approx(55.04)
    assert report.wasted_spinning == pytest.approx(55.04)
    # Half spinning, half idle (a hung job killed 30 minutes ago): one idle run of an hour.
    half = {G: make_series([1.0] * 31 + [0.0] * 30)}
    early = T0 - 30 * 60  # the first 31 steps of the hour

    def first(v: float) -> Series:
        return make_series([v] * 31, end=early)

    sig = WorkSignals(utilization={G: first(1.0)}, sm={G: first(0.1)}, tensor={G: first(0.0)},
                      dram={G: first(0.0)}, gpm=frozenset({G}))
    v = idle_gpus(half, w, w.start, spinning=spinning_steps(sig))[G]
    assert v.idle and v.idle_seconds == pytest.approx(HOUR)
    # 30 of the run's 60 steps (its first point, at the window's start, covers time before it)
    assert v.spinning_seconds == pytest.approx(HOUR / 2)


# -- throttling -------------------------------------------------------------------------------


def test_throttled_by_reason() -> None:
    w = make_window(HOUR)
    throttle = {
        G: {"thermal": flat(0.45), "power": flat(0.19), "low_utilization": flat(0.9)},
        GpuRef("node-a", "GPU-1"): {"power": make_series([0.0] * 50 + [0.3] * 11)},
        GpuRef("node-a", "GPU-2"): {"power": make_series([0.0] * 52 + [0.2] * 9)},
    }
    got = {(t.ref.uuid, t.reason): t for t in throttled_gpus(throttle, w, w.start)}
    # 0.19 is a near miss; idle clocks (low_utilization) are not a fault; 9 min is too short.
    assert set(got) == {("GPU-0", "thermal"), ("GPU-1", "power")}
    assert got[("GPU-0", "thermal")].ratio == pytest.approx(0.45)
    assert got[("GPU-1", "power")].seconds == pytest.approx(11 * 60)


# -- stragglers -------------------------------------------------------------------------------


def job(values: dict[str, float], *, models: dict[str, str] | None = None,
        sm: dict[str, float] | None = None, power: dict[str, float] | None = None,
        util: dict[str, float] | None = None):  # type: ignore[no-untyped-def]
    """A workload with one container per GPU: the container's utilization, and the GPUs'
    work signals."""
    containers, pods, gpus = {}, {}, {}
    for name, v in values.items():
        ref = ContainerRef("node-a", "ml", f"ddp-{name}", "t", f"GPU-{name}")
        containers[ref] = flat(v)
        pods[ref.pod_key] = PodInfo("node-a", "ml", ref.pod, "PyTorchJob/ddp")
        gpus[ref.gpu] = GpuInfo("node-a", name, ref.uuid, (models or {}).get(name, "H100"))
    refs = {name: GpuRef("node-a", f"GPU-{name}") for name in values}
    signals = WorkSignals(
        utilization={refs[n]: flat((util or {}).get(n, v)) for n, v in values.items()},
        sm={refs[n]: flat(x) for n, x in (sm or {}).items()},
        power={refs[n]: flat(x) for n, x in (power or {}).items()},
        gpm=frozenset(refs[n] for n in (sm or {})),
    )
    w = make_window(HOUR)
    return stragglers(containers, pods, w, w.start, gpus=gpus, signals=signals)


def test_slow_rank_by_sm_activity_while_its_peers_spin() -> None:
    # Every rank at ~100 % utilization; the slow one works (SM 0.9), the others spin (0.15).
    report = job({str(i): 1.0 for i in range(8)},
                 sm={str(i): (0.9 if i == 5 else 0.15) for i in range(8)})
    [s] = report.stragglers
    assert (s.kind, s.signal, s.gpu.uuid, s.pods) == ("slow", "sm", "GPU-5", ("ddp-5",))
    assert s.value == pytest.approx(0.9) and s.median == pytest.approx(0.15)
    assert s.ratio == pytest.approx(6.0)


@pytest.mark.parametrize(("slow", "flagged"), [(1.2, False), (1.3, True)])
def test_a_rank_at_1_2_times_the_median_is_not_slow(slow: float, flagged: bool) -> None:
    report = job({str(i): 0.95 for i in range(4)},
                 sm={"0": 0.5 * slow, "1": 0.5, "2": 0.5, "3": 0.5})
    assert [s.kind for s in report.stragglers] == (["slow"] if flagged else [])


def test_slow_needs_every_gpu_busy() -> None:
    # One peer below 0.8 utilization: the job is not in lock-step; no slow verdict.
    report = job({"0": 0.95, "1": 0.95, "2": 0.95, "3": 0.79},
                 sm={"0": 0.9, "1": 0.2, "2": 0.2, "3": 0.2})
    assert report.stragglers == ()


def test_slow_by_power_without_gpm() -> None:
    report = job({str(i): 1.0 for i in range(4)},
                 power={"0": 380.0, "1": 110.0, "2": 100.0, "3": 105.0})
    [s] = report.stragglers
    assert (s.kind, s.signal, s.gpu.uuid) == ("slow", "power", "GPU-0")
    assert s.median == pytest.approx(107.5)


def test_a_workload_mixing_gpu_models_compares_like_with_like() -> None:
    # Two A100s and two H100s in one job: the A100s draw less power and do less per step.
    # Within each model the ranks are even: no straggler. Across models (all four against
    # one median), both kinds would flag the other model.
    models = {"0": "A100", "1": "A100", "2": "H100", "3": "H100"}
    report = job({"0": 0.3, "1": 0.3, "2": 0.9, "3": 0.9}, models=models,
                 util={"0": 0.95, "1": 0.95, "2": 0.95, "3": 0.95},
                 power={"0": 150.0, "1": 150.0, "2": 600.0, "3": 600.0})
    assert report.stragglers == ()
    assert report.workloads_checked == 2
    assert {g.key[3] for g in report.groups} == {"A100", "H100"}  # (cluster, ns, wl, model)
    # Within one model, the odd one out is still found.
    models["4"] = "H100"
    report = job({"0": 0.3, "1": 0.3, "2": 0.9, "3": 0.9, "4": 0.2}, models=models)
    assert [(s.kind, s.gpu.uuid) for s in report.stragglers] == [("stalled", "GPU-4")]


def test_stalled_keeps_its_kind() -> None:
    report = job({"0": 0.9, "1": 0.92, "2": 0.3})
    [s] = report.stragglers
    assert (s.kind, s.signal, s.gpu.uuid) == ("stalled", "utilization", "GPU-2")


# -- allocated-idle containers ----------------------------------------------------------------


def held_by(ref: ContainerRef) -> dict[ContainerRef, Series]:
    return {ref: flat(1.0)}


def test_allocated_idle_on_a_busy_node_by_each_signal() -> None:
    w = make_window(HOUR)
    notebook = ContainerRef("node-a", "research", "jupyter", "nb", "GPU-0")
    worker = ContainerRef("node-a", "ml", "train", "t", "GPU-1")
    slice_pod = ContainerRef("node-a", "serving", "mig-api", "s", "MIG-1")
    slice_busy = ContainerRef("node-a", "serving", "mig-busy", "s", "MIG-2")
    gpm_pod = ContainerRef("node-a", "serving", "h100-api", "s", "GPU-3")
    held = {**held_by(notebook), **held_by(worker), **held_by(slice_pod),
            **held_by(slice_busy), **held_by(gpm_pod)}
    util = {notebook: flat(0.0), worker: flat(0.95), gpm_pod: flat(0.6)}
    memory = {slice_pod: flat(0.0), slice_busy: flat(4e9), notebook: flat(2e9)}
    sm = {GpuRef("node-a", "GPU-3"): flat(0.01)}
    slices = {GpuRef("node-a", "MIG-1"), GpuRef("node-a", "MIG-2")}
    usage, signal = held_usage(held, util, memory, sm, {GpuRef("node-a", "GPU-3")}, slices)
    assert signal == {notebook: "utilization", worker: "utilization", slice_pod: "process",
                      slice_busy: "process", gpm_pod: "sm"}
    found = {a.ref.pod: a for a in allocated_idle(usage, signal, w, w.start)}
    # The notebook (0 % of its GPU), the MIG slice with no process, and the container whose
    # GPM device does nothing (SM 1 %) although its per-process samples read 60 %.
    assert set(found) == {"jupyter", "mig-api", "h100-api"}
    assert found["mig-api"].signal == "process" and found["mig-api"].usage == 0.0
    assert found["jupyter"].seconds == pytest.approx(HOUR)


def test_allocated_idle_uses_the_container_share_on_a_shared_gpm_gpu() -> None:
    # Two containers time-slice a GPM GPU: the device's SM activity is not either one's.
    # Each holds half of it: a's 2 % of the GPU is 4 % of its half.
    w = make_window(HOUR)
    a = ContainerRef("node-a", "serving", "a", "s", "GPU-0")
    b = ContainerRef("node-a", "serving", "b", "s", "GPU-0")
    usage, signal = held_usage({**held_by(a), **held_by(b)}, {a: flat(0.02), b: flat(0.5)},
                               {}, {G: flat(0.5)}, {G}, set())
    assert signal == {a: "utilization", b: "utilization"}
    [idle] = allocated_idle(usage, signal, w, w.start)
    assert idle.ref.pod == "a" and idle.usage == pytest.approx(0.04)


def test_a_starved_time_slice_is_not_allocated_idle() -> None:
    # Three containers share a busy GPU; one gets 3 % of it: 9 % of its third. Starved (the
    # starvation table says so), not idle.
    w = make_window(HOUR)
    refs = [ContainerRef("node-a", "serving", p, "s", "GPU-0") for p in ("x", "y", "z")]
    held = {r: flat(1.0) for r in refs}
    util = dict(zip(refs, (flat(0.55), flat(0.36), flat(0.03)), strict=True))
    usage, signal = held_usage(held, util, {}, {}, set(), set())
    assert allocated_idle(usage, signal, w, w.start) == []
    assert usage[refs[2]].values[0] == pytest.approx(0.09)


def test_allocated_idle_needs_30_minutes_and_a_threshold_below_005() -> None:
    w = make_window(HOUR)
    a = ContainerRef("node-a", "research", "a", "nb", "GPU-0")
    b = ContainerRef("node-a", "research", "b", "nb", "GPU-1")
    c = ContainerRef("node-a", "research", "c", "nb", "GPU-2")
    usage = {a: make_series([0.5] * 32 + [0.0] * 29), b: flat(0.05), c: flat(0.049)}
    signal = dict.fromkeys(usage, "utilization")
    assert [x.ref.pod for x in allocated_idle(usage, signal, w, w.start)] == ["c"]


# -- MIG --------------------------------------------------------------------------------------


def mig_node(slice_values: dict[str, float], *, node: str = "mig-node"
             ) -> tuple[dict[GpuRef, GpuInfo], dict[GpuRef, Series]]:
    """One H100 in MIG mode with the given slices (profile -> SM activity) and one whole
    busy H100."""
    parent = GpuInfo(node, "0", "GPU-P", "NVIDIA H100 80GB HBM3")
    whole = GpuInfo(node, "1", "GPU-W", "NVIDIA H100 80GB HBM3")
    gpus = {parent.ref: parent, whole.ref: whole}
    activity = {whole.ref: flat(0.0)}
    for i, (profile, value) in enumerate(slice_values.items(), start=1):
        info = GpuInfo(node, f"0/{i}", f"MIG-{i}", "NVIDIA H100 80GB HBM3 MIG " + profile,
                       parent_uuid="GPU-P", mig_profile=profile.split("#")[0])
        gpus[info.ref] = info
        activity[info.ref] = flat(value)
    return gpus, activity


def test_compute_slice_shares() -> None:
    assert [compute_slices(p) for p in ("3g.40gb", "1g.10gb", "7g.80gb", "1c.3g.40gb",
                                        "1g.10gb+me", "4g.24gb", "odd")] == [3, 1, 7, 1, 1, 4,
                                                                              None]
    gpus, _ = mig_node({"3g.40gb": 0.0, "4g.40gb": 0.0})
    shares = slice_shares(gpus)
    assert shares[GpuRef("mig-node", "MIG-1")] == pytest.approx(3 / 7)
    assert shares[GpuRef("mig-node", "MIG-2")] == pytest.approx(4 / 7)
    a30 = {GpuRef("n", "P"): GpuInfo("n", "0", "P", "NVIDIA A30"),
           GpuRef("n", "M"): GpuInfo("n", "0/1", "M", "NVIDIA A30 MIG 2g.12gb",
                                     parent_uuid="P", mig_profile="2g.12gb")}
    assert slice_shares(a30)[GpuRef("n", "M")] == pytest.approx(0.5)


def test_an_idle_mig_slice_beside_a_busy_one_leaves_the_node_busy_but_counts_its_waste() -> None:
    gpus, activity = mig_node({"3g.40gb": 0.0, "4g.40gb": 0.6})
    w = make_window(HOUR)
    signal = {GpuRef("mig-node", "MIG-1"): "sm", GpuRef("mig-node", "MIG-2"): "sm"}
    verdicts = idle_gpus(activity, w, w.start, signal=signal)
    assert verdicts[GpuRef("mig-node", "MIG-1")].idle
    assert verdicts[GpuRef("mig-node", "MIG-1")].signal == "sm"
    assert not verdicts[GpuRef("mig-node", "MIG-2")].idle
    nodes = idle_nodes(gpus, verdicts)
    assert nodes == {}
    slices = idle_slices(gpus, verdicts, nodes)
    assert [s.ref.uuid for s in slices] == ["MIG-1"]
    report = waste(nodes, {"mig-node": 55.04}, slices=slices, gpus_per_node={"mig-node": 2})
    [row] = report.slices
    # A 3g.40gb is 3/7 of one of the node's two GPUs.
    assert row.price_per_hour == pytest.approx(55.04 / 2 * 3 / 7)
    assert report.wasted == pytest.approx(55.04 / 2 * 3 / 7)
    assert report.burning_per_hour == pytest.approx(55.04 / 2 * 3 / 7)


def test_a_mig_node_is_idle_when_every_slice_is() -> None:
    gpus, activity = mig_node({"3g.40gb": 0.0, "4g.40gb": 0.01})
    w = make_window(HOUR)
    verdicts = idle_gpus(activity, w, w.start)
    node = idle_nodes(gpus, verdicts)["mig-node"]
    assert node.gpus == 2 and node.mig_gpus == 1
    # The whole GPU's hour plus 3/7 + 4/7 of the MIG GPU's hour.
    assert node.idle_gpu_seconds == pytest.approx(2 * HOUR)
    assert waste({"mig-node": node}, {"mig-node": 10.0}).wasted == pytest.approx(10.0)
    # A MIG GPU whose slices cannot be judged (no verdict) keeps the node busy.
    del activity[GpuRef("mig-node", "MIG-2")]
    assert idle_nodes(gpus, idle_gpus(activity, w, w.start)) == {}


def test_an_idle_mig_gpu_with_capacity_not_carved_into_slices_wastes_the_whole_gpu() -> None:
    # Slices cover 3 of the GPU's 7 compute slices (the rest was never carved): the node is
    # idle and burns its whole price, yet its hour's waste counted only the slices' 3/7 of
    # the MIG GPU; the 4/7 nothing can use is idle and held by nobody.
    gpus, activity = mig_node({"3g.40gb": 0.0})
    w = make_window(HOUR)
    verdicts = idle_gpus(activity, w, w.start)
    node = idle_nodes(gpus, verdicts)["mig-node"]
    assert node.idle_gpu_seconds == pytest.approx(2 * HOUR)
    assert node.allocated_gpu_seconds == 0.0
    report = waste({"mig-node": node}, {"mig-node": 10.0})
    assert report.burning_per_hour == pytest.approx(10.0)
    assert report.wasted == pytest.approx(10.0)
    assert report.wasted_unallocated == pytest.approx(10.0)


def test_a_mig_slice_without_gpm_is_idle_when_no_process_runs_on_it() -> None:
    # The activity of a slice without GPM: 1 in a step with a process on it, else 0.
    gpus, _ = mig_node({"3g.40gb": 0.0, "4g.40gb": 0.0})
    w = make_window(HOUR)
    activity = {GpuRef("mig-node", "GPU-W"): flat(0.0),
                GpuRef("mig-node", "MIG-1"): flat(0.0),
                GpuRef("mig-node", "MIG-2"): make_series([0.0] * 40 + [1.0] + [0.0] * 20)}
    verdicts = idle_gpus(activity, w, w.start)
    assert verdicts[GpuRef("mig-node", "MIG-1")].idle
    # A process ran 20 minutes ago: not idle for 30 minutes.
    assert not verdicts[GpuRef("mig-node", "MIG-2")].idle
    assert idle_nodes(gpus, verdicts) == {}


def test_a_workload_view_of_a_large_job_draws_its_stragglers_and_a_bounded_rest() -> None:
    from gpuscope.dashboard.series import MAX_WORKLOAD_DEVICES, WorkloadDevice, pick_devices

    devices = [WorkloadDevice(GpuRef(f"node-{n:03d}", f"GPU-{n}-{g}"), str(g))
               for n in range(250) for g in range(8)]
    slow = GpuRef("node-200", "GPU-200-3")
    shown = pick_devices(devices, {slow})
    assert len(shown) == MAX_WORKLOAD_DEVICES and slow in {d.ref for d in shown}
    assert [d.ref.node for d in shown] == sorted(d.ref.node for d in shown)
    assert pick_devices(devices[:16], {slow}) == tuple(devices[:16])

"""The data layer without a server: PromQL escaping and validation, target parsing,
windows, and the embedded store's bounds and bucketing."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import pytest

from gpuscope.dashboard.data import (
    DataError,
    EmbeddedData,
    InvalidFilter,
    Target,
    escape_label_value,
    make_window,
    parse_targets,
    selector,
    validate_namespace,
    validate_node,
)
from gpuscope.dashboard.data.prometheus import MAX_QUERY_BYTES, index_queries
from gpuscope.dashboard.data.promql import any_of, labelled
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.plan.runs import FollowUp, _groups, _StragglerRuns, _summaries
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import (
    ContainerRef,
    GpuInfo,
    GpuRef,
    NodeSummary,
    PodInfo,
    PodKey,
    Runs,
    Series,
    Window,
    WorkSignals,
)
from gpuscope.dashboard.verdicts.starvation import timeslice_shares
from gpuscope.dashboard.verdicts.stragglers import stragglers
from gpuscope.dashboard.views import build_fleet_view
from tests.dashboard.conftest import make_series
from tests.dashboard.conftest import make_window as hand_window

INJECTION = '"}) or vector(1) or up{x="'


@pytest.mark.parametrize(("raw", "escaped"), [
    ("ml", "ml"),
    ('a"b', 'a\\"b'),
    ("a\\b", "a\\\\b"),
    ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
    ("\x00\x1f\x7f", "\\u0000\\u001f\\u007f"),
    ("ünïcode", "ünïcode"),
    (INJECTION, '\\"}) or vector(1) or up{x=\\"'),
])
def test_escape_label_value(raw: str, escaped: str) -> None:
    assert escape_label_value(raw) == escaped


def test_selector_quotes_every_value() -> None:
    q = selector("container_gpu_utilization_ratio", {"namespace": '!=""'}, pod=INJECTION)
    assert q == ('container_gpu_utilization_ratio{namespace!="", '
                 'pod="\\"}) or vector(1) or up{x=\\""}')
    with pytest.raises(ValueError):
        selector("bad name")
    with pytest.raises(ValueError):
        selector("x", **{"bad-label": "v"})


def test_labelled_sets_a_constant_label_escaped() -> None:
    assert labelled("up", "stat", "gpus") == 'label_replace(up, "stat", "gpus", "", "")'
    assert labelled("up", "stat", 'a"b\\') == 'label_replace(up, "stat", "a\\"b\\\\", "", "")'


def test_regex_matchers_escape_regex_then_string() -> None:
    prom = PrometheusData("http://127.0.0.1:1")
    w = make_window(3600, 10_000.0, min_step=15, max_points=60)
    queries = prom.second_round(
        w, FollowUp(idle_nodes=["ip-10-0-1-1.ec2.internal", 'odd"node\\']))
    # '.' and '\\' are regex-escaped first, then backslashes and the quote are escaped for the
    # string literal; '-' is no metacharacter outside "[...]" and stays bare (Prometheus then
    # reads the list from its index: dashboard/data/promql.py).
    expected = r'node=~"ip-10-0-1-1\\.ec2\\.internal|odd\"node\\\\"'
    assert expected in queries["allocated"]
    assert set(queries) == {"allocated"}
    assert set(prom.second_round(w, FollowUp(shared=["n1"], input=["n2"]), "ml")) == {
        "shared", "shared_containers", "stats"}
    # Each singled-out set is asked about, and only it.
    every = FollowUp(idle=["a"], idle_nodes=["n"], shared=["b"], input=["c"], spinning=["d"],
                     held=["f"], candidates=["g"], slow=["h"],
                     evidence_seconds=600)
    assert set(prom.second_round(w, every)) == {
        "idle_steps", "allocated", "shared", "containers", "shared_containers", "stats",
        "spinning", "held_idle", "workload_signals", "evidence"}
    # With the recording rules, the sparse histories need no node list at all.
    ruled = prom.second_round(w, every, rules=True)
    for role in ("idle_steps", "held_idle"):
        assert "node=~" not in ruled[role], role
    prom.close()


def test_the_drill_downs_read_gpu_info_on_their_nodes_only() -> None:
    """The pod and workload drill-downs read the devices' index and model on the nodes
    their series name, in bounded ``node=~`` lists (escaped: the names come from the store),
    never every device's ``gpu_info``."""
    nodes = [f"ip-10-{i // 250}-{i % 250}-{i % 7}.ec2.internal" for i in range(5000)]
    queries = index_queries([*nodes, *nodes[:10]])
    assert len(queries) > 1
    assert max(len(q.encode()) for q in queries) <= MAX_QUERY_BYTES
    named = [n for q in queries for n in re.fullmatch(
        r'max by \(node, uuid, gpu, model\) \(gpu_info\{node=~"(.*)", cluster=~""\}\)',
        q)[1].split("|")]
    assert named == sorted(any_of([n]) for n in nodes)
    assert index_queries([]) == []
    assert index_queries(['a|b"c']) == [
        'max by (node, uuid, gpu, model) (gpu_info{node=~"a\\\\|b\\"c", cluster=~""})']
    # A node key of a cluster: its name and its cluster, each escaped.
    assert index_queries(['prod/n1', 'n2']) == [
        'max by (node, uuid, gpu, model) (gpu_info{node=~"n1|n2", cluster=~"|prod"})']
    # Over a drill-down's window: a node gone before its end still has its devices' index.
    assert index_queries(['n1'], within=3600) == [
        'max by (node, uuid, gpu, model) (last_over_time(gpu_info{node=~"n1", cluster=~""}'
        '[3600s]))']
    prom = PrometheusData("http://127.0.0.1:1")
    w = make_window(3600, 10_000.0, min_step=15, max_points=60)
    try:
        for q in [*prom.pod_queries("ml", "p", w).values(),
                  *prom.workload_queries("ml", "Job/j", w).values()]:
            assert "gpu_info" not in q
    finally:
        prom.close()


def test_long_node_lists_are_split_into_queries_of_bounded_size() -> None:
    """5,000 nodes singled out: every query stays under VictoriaMetrics' default 16 KB
    (``-search.maxQueryLen``), each node (each input candidate's pod) is asked about exactly
    once per role, and no fleet query names a device."""
    prom = PrometheusData("http://127.0.0.1:1")
    w = make_window(3600, 10_000.0, min_step=15, max_points=60)
    nodes = [f"ip-10-{i // 250}-{i % 250}-{i % 7}.ec2.internal" for i in range(5000)]
    ask = FollowUp(idle=nodes, idle_nodes=nodes, shared=nodes, spinning=nodes,
                   held=nodes, candidates=nodes, slow=nodes, input=nodes,
                   evidence_seconds=600)
    for rules in (False, True):
        queries = prom.second_round(w, ask, rules=rules)
        assert max(len(q.encode()) for q in queries.values()) <= MAX_QUERY_BYTES < 16 * 1024
        roles: dict[str, list[str]] = {}
        for name, q in queries.items():
            roles.setdefault(name.partition("#")[0], []).append(q)
        escaped = sorted(any_of([n]) for n in nodes)
        for role, parts in roles.items():
            # Each query names its nodes in one list (repeated in each selector); the input
            # candidates' statistics, their pods (``input`` here: the same names).
            label = "pod" if role == "stats" else "node"
            assert role != "stats" or "node=~" not in "".join(parts)
            lists = [set(re.findall(label + r'=~"((?:[^"\\]|\\.)*)"', q)) for q in parts]
            assert all(len(one) <= 1 for one in lists), role
            named = [n for one in lists for body in one for n in body.split("|")]
            if role in ("idle_steps", "held_idle") and rules:
                assert named == [] and len(parts) == 1, role
            else:
                assert sorted(named) == escaped, role
    for q in prom.fleet_queries(w, "ml").values():
        assert "uuid=~" not in q and "node=~" not in q and len(q) < 16 * 1024
    prom.close()


def test_namespace_and_node_validation() -> None:
    assert validate_namespace(" ml-train ") == "ml-train"
    for bad in (INJECTION, "ML", "a_b", "-a", "a" * 64, ""):
        with pytest.raises(InvalidFilter):
            validate_namespace(bad)
    for good in ("ip-10-0-1-11.ec2.internal", "10.0.0.5", "::1", "GPU-Node_1"):
        assert validate_node(good) == good
    for bad in (INJECTION, "a b", 'x"y', ""):
        with pytest.raises(InvalidFilter):
            validate_node(bad)


def test_parse_targets() -> None:
    assert parse_targets("http://10.0.0.5:9463/metrics, gpu-b=http://10.0.0.6:9463") == (
        Target("http://10.0.0.5:9463/metrics", "10.0.0.5", named=False),
        Target("http://10.0.0.6:9463/metrics", "gpu-b"),
    )
    # A query string with '=' is not a node hint.
    assert parse_targets("http://h:1/metrics?a=b")[0].node == "h"
    for bad in ("", "10.0.0.5:9463", "ftp://h/metrics", "http://h:99999/", 'a"b=http://h:1/',
                "http://h:1/m,http://h:1/m"):
        with pytest.raises(ValueError):
            parse_targets(bad)


def test_window_step_divides_the_window() -> None:
    w = make_window(3600, 10_000.0, min_step=15, max_points=120)
    assert (w.step, w.start, w.end) == (30.0, 6400.0, 10_000.0)
    assert len(w.times()) == 121 and w.times()[0] == w.start and w.times()[-1] == w.end
    assert make_window(900, 0.0, min_step=15, max_points=120).step == 15.0
    assert make_window(7 * 86400, 0.0, min_step=15, max_points=120).step == 5040.0


def test_injection_through_the_data_layer_is_rejected_before_any_query(
    recording_prometheus: tuple[str, list[str]],
) -> None:
    url, queries = recording_prometheus
    # (A clock that stands still: a second page on another step would ask the served
    # window again.)
    prom = PrometheusData(url, clock=lambda: 1_800_000_000.0)
    with pytest.raises(InvalidFilter):
        prom.fleet(3600, namespace=INJECTION)
    with pytest.raises(InvalidFilter):
        prom.pod_detail(INJECTION, "p", 3600)
    with pytest.raises(InvalidFilter):
        prom.node_detail(INJECTION, 3600)
    assert queries == []
    # A valid filter is sent, quoted, and every query is a fixed set.
    data = prom.fleet(3600, namespace="ml")
    # Whether the rules recorded the window's last minute (none) and the exporters' newest
    # sample (none: asked again over the hour before), the recording rules looked for
    # (none), the first round, when the data begins (none at the window's first step),
    # nothing for a second round. (Who held what: two queries, held and used.)
    assert data.queries == len(queries) == 16
    # A second page: the rules known missing (for a minute), so not looked for again.
    queries.clear()
    assert prom.fleet(3600, namespace="ml").queries == len(queries) == 13
    assert any('namespace="ml"' in q for q in queries)
    prom.close()


def test_label_values_from_the_backend_are_escaped_in_drill_downs(
    recording_prometheus: tuple[str, list[str]],
) -> None:
    # Node names come back from Prometheus; whatever they hold, they are quoted when sent.
    url, queries = recording_prometheus
    prom = PrometheusData(url)
    prom.node_detail("node:with.odd-chars", 900)
    assert all('node="node:with.odd-chars"' in q for q in queries)
    prom.close()


def test_prometheus_unreachable_is_a_data_error() -> None:
    prom = PrometheusData("http://127.0.0.1:1", timeout=2)
    with pytest.raises(DataError, match="unreachable"):
        prom.fleet(900)
    prom.close()


def exposition(util: float, *, uuid: str = "GPU-1", pods: bool = True) -> str:
    lines = [
        f'gpu_info{{gpu="0",uuid="{uuid}",model="A10G",driver_version="1",pci_bus_id="",'
        f'parent_uuid="",mig_profile=""}} 1',
        f'gpu_utilization_ratio{{gpu="0",uuid="{uuid}"}} {util}',
        'gpu_node_info{instance_type="g5.xlarge",zone="z",capacity_type="on-demand"} 1',
    ]
    if pods:
        lines += [
            f'container_gpu_allocated{{namespace="ml",pod="p",container="c",uuid="{uuid}"}} 1',
            f'container_gpu_utilization_ratio{{namespace="ml",pod="p",container="c",'
            f'uuid="{uuid}"}} {util}',
            f'container_gpu_memory_used_bytes{{namespace="ml",pod="p",container="c",'
            f'uuid="{uuid}"}} 1024',
            'gpu_pod_info{namespace="ml",pod="p",uid="u",workload="Job/j"} 1',
        ]
    return "\n".join(lines) + "\n"


def test_embedded_store_adds_node_label_and_buckets_like_prometheus() -> None:
    now = [1000.0]
    store = EmbeddedData([], interval=10, clock=lambda: now[0])
    for i in range(30):  # 300 s of samples every 10 s
        store.ingest_text("node-a", exposition(0.0 if i < 20 else 0.5), 700.0 + i * 10)
    now[0] = 990.0
    data = store.fleet(300)
    ref = GpuRef("node-a", "GPU-1")
    assert data.history_start == 700.0
    assert data.gpus[ref].gpu == "0"
    assert data.nodes["node-a"].instance_type == "g5.xlarge"
    busy = data.gpu_busy_max[ref]
    assert busy.times[-1] == 990.0
    # Each point is the max over (t - 20 s, t]: the range is at least 2 scrape intervals.
    assert busy.values[-1] == 0.5
    # Without a busy counter, the mean of each step's mean gauge: 10 of the 30 steps in
    # (690, 990] saw 0.5 (the 20-second range of the step at 890 sees no 0.5 yet).
    assert data.gpu_mean[ref] == pytest.approx(
        sum(data.signals.utilization[ref].values) / len(data.signals.utilization[ref]))
    assert data.gpu_mean[ref] == pytest.approx((0.25 + 9 * 0.5) / 30)
    cref = ContainerRef("node-a", "ml", "p", "c", "GPU-1")
    assert data.container_stats[cref].samples == 30
    assert data.container_stats[cref].memory_bytes == 1024
    assert data.pods[cref.pod_key].workload == "Job/j"
    store.close()


def test_embedded_time_slicing_is_judged_on_who_uses_a_gpu_not_who_holds_it() -> None:
    """Two containers run on one busy GPU, one without the kubelet allocating it (a pod
    that sees every GPU): the GPU is time-sliced between them, as the Prometheus path's
    ``members`` say (the devices two containers or more used), so the starved one is
    flagged in embedded mode too."""
    end = 1_800_000_000.0

    def scrape(allocated_b: bool) -> str:
        lines = [
            'gpu_info{gpu="0",uuid="GPU-1",model="A10G",driver_version="1",pci_bus_id="",'
            'parent_uuid="",mig_profile=""} 1',
            'gpu_utilization_ratio{gpu="0",uuid="GPU-1"} 0.95',
            'container_gpu_allocated{namespace="ml",pod="a",container="c",uuid="GPU-1"} 1',
            'container_gpu_utilization_ratio{namespace="ml",pod="a",container="c",'
            'uuid="GPU-1"} 0.9',
            'container_gpu_utilization_ratio{namespace="ml",pod="b",container="c",'
            'uuid="GPU-1"} 0.02',
        ]
        if allocated_b:
            lines.append('container_gpu_allocated{namespace="ml",pod="b",container="c",'
                         'uuid="GPU-1"} 1')
        return "\n".join(lines) + "\n"

    for allocated_b in (True, False):
        store = EmbeddedData([], interval=60, clock=lambda: end)
        for i in range(61):
            store.ingest_text("node-a", scrape(allocated_b), end - 3600 + i * 60)
        data = store.fleet(3600)
        store.close()
        assert GpuRef("node-a", "GPU-1") in data.gpu_step_mean
        found = {v.ref.pod: v for v in timeslice_shares(
            data.containers, data.gpu_step_mean, data.window, data.history_start)}
        assert found["b"].starved and not found["a"].starved
        assert found["b"].gpu_utilization == pytest.approx(0.95)


def test_embedded_store_is_bounded_by_count_age_and_series() -> None:
    store = EmbeddedData([], interval=1, capacity=100, max_age=50, max_series=3,
                         clock=lambda: 1000.0)
    for i in range(400):
        store.ingest_text("n", exposition(0.1), 600.0 + i)
    ring = next(iter(store._rings.values()))
    assert len(ring.times) <= 100 + 100 // 8
    store.expire(1000.0)
    assert ring.times[0] >= 950.0
    # Three series fit; the others of the exposition are dropped and counted.
    assert len(store._rings) == 3
    assert store.dropped_series > 0
    assert any("dropped" in n for n in store.target_notes(1000.0))
    store.close()


def test_embedded_keys_are_remembered_within_a_bound() -> None:
    # The same labels in another order, and the stated node name, give the same key; label
    # sets that change every scrape (pids, churning pods) never grow what is remembered
    # past twice the series bound.
    store = EmbeddedData([], interval=1, max_series=5)
    a = store._key({"gpu": "0", "uuid": "GPU-1"}, "n")
    b = store._key({"uuid": "GPU-1", "node_name": "other", "gpu": "0"}, "n")
    assert a == b == (("gpu", "0"), ("node", "n"), ("uuid", "GPU-1"))
    assert store._key({"gpu": "0", "uuid": "GPU-1"}, "m") != a
    for i in range(100):
        store.ingest("n", [("gpu_utilization_ratio", {"gpu": "0", "pid": str(i)}, 0.5)],
                     float(i))
        assert len(store._keys) <= 10
    store.close()


def test_embedded_target_down_is_a_note_not_an_error() -> None:
    store = EmbeddedData([Target("http://127.0.0.1:1/metrics", "gone")], interval=1, timeout=1)
    store.scrape_once()
    data = store.fleet(900)
    assert data.gpus == {}
    assert any("gone" in n and "not answering" in n for n in data.notes)
    store.close()


# -- the stragglers' run summaries (recording rules) given to the analysis as steps ----------

def _straggler_fleet(groups: dict[str, tuple[str, list[list[float]]]], steps: int = 60
                     ) -> tuple[dict[ContainerRef, Series], dict[PodKey, PodInfo],
                                dict[GpuRef, GpuInfo], WorkSignals, Window]:
    """Per workload: ``(signal, per device its values per step)``: ``utilization`` (the
    containers' utilization, for stalled ranks) or ``sm``/``power`` (every device busy,
    its work signal, for slow ranks); one container per device."""
    window = hand_window(steps * 60.0)
    containers, pods, gpus = {}, {}, {}
    sig: dict[str, dict[GpuRef, Series]] = {"utilization": {}, "sm": {}, "power": {}}
    for w, (signal, devices) in groups.items():
        for i, values in enumerate(devices):
            ref = GpuRef(f"node-{w}", f"GPU-{w}-{i}")
            c = ContainerRef(ref.node, "ml", f"{w}-{i}", "main", ref.uuid)
            pods[c.pod_key] = PodInfo(ref.node, "ml", c.pod, f"Job/{w}")
            gpus[ref] = GpuInfo(ref.node, str(i), ref.uuid, "H100")
            if signal == "utilization":
                containers[c] = make_series(values)
            else:
                containers[c] = make_series([0.9] * steps)
                sig["utilization"][ref] = make_series([0.95] * steps)
                sig[signal][ref] = make_series(values)
    signals = WorkSignals(utilization=sig["utilization"], sm=sig["sm"], power=sig["power"],
                          gpm=frozenset(sig["sm"]))
    return containers, pods, gpus, signals, window


def _wave(base: float, amplitude: float, phase: int, steps: int = 60) -> list[float]:
    return [base + amplitude * math.sin(i / 3 + phase) for i in range(steps)]


@pytest.mark.parametrize("groups", [
    # A rank of eight stalled; three of eight; one of two (the median is the middle two's
    # mean: as many others as stragglers); two of four.
    {"a": ("utilization", [_wave(0.2, 0.05, 0)] + [_wave(0.9, 0.05, p) for p in range(7)])},
    {"b": ("utilization", [_wave(0.1, 0.05, p) for p in range(3)]
           + [_wave(0.9, 0.05, p) for p in range(5)])},
    {"c": ("utilization", [_wave(0.1, 0.05, 0), _wave(0.9, 0.05, 1)])},
    {"d": ("utilization", [_wave(0.1, 0.05, 0), _wave(0.15, 0.05, 2),
                           _wave(0.85, 0.05, 1), _wave(0.9, 0.05, 3)])},
    # Slow ranks: by SM activity (one of three), by power (two of four), beside a stalled
    # group.
    {"e": ("sm", [_wave(0.35, 0.02, 0), _wave(0.36, 0.02, 1), _wave(0.9, 0.05, 2)]),
     "f": ("power", [_wave(100, 5, 0), _wave(110, 5, 1), _wave(300, 20, 2),
                     _wave(320, 20, 3)]),
     "g": ("utilization", [_wave(0.2, 0.05, 0)] + [_wave(0.9, 0.05, p) for p in range(3)])},
])
def test_straggler_summaries_give_the_verdicts_of_the_steps(
        groups: dict[str, tuple[str, list[list[float]]]]) -> None:
    """A straggler held over the whole history is summarised by the rules as its mean and
    its group's median's mean (what run_queries asks); handed to the verdict as the group's
    findings (_StragglerRuns.whole, in Runs), with its containers sent without steps, they
    give the stragglers of the real steps, with the same numbers, and leave the group's
    devices and pods as they are."""
    containers, pods, gpus, signals, window = _straggler_fleet(groups)
    hs = window.start
    real = stragglers(containers, pods, window, hs, gpus=gpus, signals=signals)
    assert real.stragglers and {s.workload for s in real.stragglers} == {
        f"Job/{w}" for w in groups}
    # What the rules record: each straggler's mean over the run, its group's median's.
    grid = tuple(t for t in make_series([0.0] * 60).times if t > hs)
    summary = _StragglerRuns(grid)
    by_group = {g.key: g for g in real.groups}
    for s in real.stragglers:
        key = s.key
        summary.runs.setdefault(key, {})[s.gpu] = (s.kind, s.signal, s.value)
        summary.medians[(key, s.kind)] = (s.signal, s.median)
    flagged = {key: {g: kind for g, (kind, _, _) in runs.items()}
               for key, runs in summary.runs.items()}
    members = _groups(containers, pods, gpus)
    whole, rest = summary.split(flagged, members, apart=())
    assert whole == set(flagged) and not rest
    runs = Runs(steps=grid, stragglers=summary.whole(whole))
    found = stragglers(dict.fromkeys(containers, Series((), ())), pods, window, hs,
                       gpus=gpus, signals=WorkSignals(), runs=runs)
    assert len(found.stragglers) == len(real.stragglers)
    for a, b in zip(found.stragglers, real.stragglers, strict=True):
        assert (a.gpu, a.kind, a.signal, a.pods, a.devices, a.since, a.seconds) == (
            b.gpu, b.kind, b.signal, b.pods, b.devices, b.since, b.seconds)
        assert a.value == pytest.approx(b.value, rel=1e-12)
        assert a.median == pytest.approx(b.median, rel=1e-9)
    assert found.workloads_checked == real.workloads_checked
    assert {g.key: g.pods for g in found.groups} == {
        key: g.pods for key, g in by_group.items()}
    # Without the summaries, the same containers without steps give no straggler.
    assert not stragglers(dict.fromkeys(containers, Series((), ())), pods, window, hs,
                          gpus=gpus, signals=WorkSignals()).stragglers


def test_straggler_summaries_are_not_used_where_they_cannot_describe_the_group() -> None:
    """A group goes to the steps when a flagged device has no run over the whole history,
    two kinds are flagged, the median is missing, or a device of it is time-sliced or
    spinning (its steps are asked anyway)."""
    containers, pods, gpus, _, _ = _straggler_fleet(
        {"a": ("utilization", [[0.2] * 60, [0.9] * 60, [0.9] * 60])})
    members = _groups(containers, pods, gpus)
    [key] = members
    low, *others = sorted(members[key])
    summary = _StragglerRuns(make_series([0.0] * 60).times)
    summary.runs[key] = {low: ("stalled", "utilization", 0.2)}
    summary.medians[(key, "stalled")] = ("utilization", 0.9)
    assert summary.split({key: {low: "stalled"}}, members, ()) == ({key}, set())
    # a second device flagged now, without a summary (a run shorter than the history)
    assert summary.split({key: {low: "stalled", others[0]: "stalled"}}, members, ()) == (
        set(), {key})
    assert summary.split({key: {low: "stalled", others[0]: "slow"}}, members, ()) == (
        set(), {key})
    assert summary.split({key: {low: "stalled"}}, members, {others[1]}) == (set(), {key})
    del summary.medians[(key, "stalled")]
    assert summary.split({key: {low: "stalled"}}, members, ()) == (set(), {key})


def test_a_namespace_page_asks_who_uses_what_on_its_nodes_only() -> None:
    """Filtered to a namespace, the first round finds where it ran (``ns_nodes``, no node
    list) and who uses what is asked on those nodes alone, in lists under the query limit,
    each node once, the namespace escaped in every part."""
    prom = PrometheusData("http://127.0.0.1:1")
    w = make_window(3600, 10_000.0, min_step=15, max_points=60)
    first = prom.fleet_queries(w, "ml")
    assert "members" not in first and "node=~" not in first["ns_nodes"]
    assert 'namespace="ml"' in first["ns_nodes"]
    assert "members" in prom.fleet_queries(w, None)
    nodes = [f"ip-10-{i // 250}-{i % 250}-{i % 7}.ec2.internal" for i in range(3000)]
    queries = prom.members_queries(w, "ml", nodes)
    assert len(queries) > 1 and set(queries) == {"members"} | {
        f"members#{i}" for i in range(1, len(queries))}
    named = []
    for q in queries.values():
        assert len(q.encode()) <= MAX_QUERY_BYTES and 'namespace="ml"' in q
        lists = set(re.findall(r'node=~"((?:[^"\\]|\\.)*)"', q))
        assert len(lists) == 1  # the same list in both selectors
        named += next(iter(lists)).split("|")
    assert sorted(named) == sorted(any_of([n]) for n in nodes)
    assert prom.members_queries(w, "ml", []) == {}
    prom.close()


def test_a_page_still_computing_when_the_source_closes_gets_one_clear_error() -> None:
    # The dashboard stops while a kept-warm view is being computed: its next round of
    # queries finds the pool shut down; a DataError (one line, the view falls back), never
    # a RuntimeError with a traceback in the log.
    prom = PrometheusData("http://127.0.0.1:1")
    prom.close()
    with pytest.raises(DataError, match="closed"):
        prom._submit({"gpus": "gpu_info"},
                     make_window(3600, 1_800_000_000.0, min_step=60, max_points=60))


def test_the_nodes_numbers_as_the_rules_send_them() -> None:
    """``node_summary`` rows (label ``stat``): a node's one model, or "" where its devices
    have several (MIG slices: the page then reads its devices); no mean where none of its
    GPUs reported; a node with models but no GPU count (gone since) is not a GPU node."""
    rows = [
        ({"node": "a", "stat": "gpus"}, 8.0), ({"node": "a", "stat": "mean"}, 0.5),
        ({"node": "a", "stat": "model", "model": "NVIDIA A100"}, 8.0),
        ({"node": "a", "stat": "known"}, 8.0),
        ({"node": "b", "stat": "gpus"}, 1.0),
        ({"node": "b", "stat": "model", "model": "NVIDIA A100"}, 1.0),
        ({"node": "b", "stat": "model", "model": "NVIDIA A100 MIG 1g.10gb"}, 7.0),
        ({"node": "c", "stat": "model", "model": "Tesla T4"}, 1.0),
    ]
    assert _summaries(rows) == {"a": NodeSummary(8, 0.5, 8, "NVIDIA A100"),
                                "b": NodeSummary(1, None, 0, "")}


def test_the_run_summaries_are_the_verdict_modules_forms() -> None:
    """Each run summary the plan asks is its verdict module's form over the history
    (``*_runs_promql``), labelled by ``stat``; the dense series' forms asked of the nodes
    listed."""
    from gpuscope.dashboard.data.promql import node_matchers
    from gpuscope.dashboard.data.recorded import History
    from gpuscope.dashboard.verdicts import allocated, idle, spinning
    from gpuscope.dashboard.verdicts import stragglers as strag

    prom = PrometheusData("http://127.0.0.1:1")
    w = make_window(3600, 10_000.0, min_step=60, max_points=60)
    out = prom.run_queries(w, w.start + 600, devices=["n1"], stragglers=True,
                           namespace='ml"x')
    text = " ".join(out.values())
    assert w.step == 60.0
    # First the runs over the whole history; then (trailing: asked once the first answer
    # names findings it did not summarise, on one-minute steps) the runs up to the end.
    trail = prom.run_queries(w, w.start + 600, trailing=True)
    trailing = " ".join(trail.values())
    # The spinning devices' other signals: asked for the rows the page shows, of their
    # nodes (over the whole history, or over the runs that began within it).
    means = [" ".join(prom.spinning_means_queries(w, w.start + 600, ["n2"], to_end).values())
             for to_end in (False, True)]
    assert not prom.spinning_means_queries(w, w.start + 600, [])
    n2 = node_matchers(["n2"], prom.cluster_label)
    for to_end, asked in ((False, text), (True, trailing)):
        span = (w.end, to_end)
        fleet = History("2999999ms", 50, "59999ms", {}, *span)
        forms = [idle.idle_runs_promql(fleet), spinning.spinning_runs_promql(fleet),
                 allocated.held_idle_runs_promql(fleet)]
        for form in spinning.spinning_means_promql(History(
                "2999999ms", 50, "59999ms", n2, *span)).values():
            assert form in means[to_end] and form not in asked, form
            assert form not in means[not to_end]
        if to_end:  # with how long each run at the end has held
            forms += [spinning.spinning_minutes_promql(fleet),
                      allocated.held_idle_minutes_promql(fleet)]
        else:
            forms += [*strag.straggler_runs_promql(History(
                "2999999ms", 50, "59999ms", {"namespace": '="ml\\"x"'}, *span)).values(),
                # (of every idle or spinning device: one query, however many nodes)
                idle.held_runs_promql(fleet)]
        for form in forms:
            assert form in asked, form
    assert "time()" in trailing and "time()" not in text
    assert "stalled" not in trailing and 'stat", "held"' not in trailing
    assert "spin_n" in trailing and "spin_n" not in text
    assert "unless on (node, uuid) count_over_time(uuid:gpu_spinning" not in text


def test_a_missed_rules_check_is_asked_again_after_a_minute(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A check that found no recorded minute at the window's end (its evaluation not written
    # yet) kept the page on the raw series for 5 minutes; a found one is kept 5 minutes.
    prom = PrometheusData("http://127.0.0.1:1", clock=lambda: 10_000.0)
    answers = [[], [({}, 1.0)], [({}, 1.0)]]
    asked: list[str] = []

    def instant(query: str, at: float) -> list[tuple[dict[str, str], float]]:
        asked.append(query)
        return answers[len(asked) - 1]

    monkeypatch.setattr(prom, "instant", instant)
    clock = [1000.0]
    monkeypatch.setattr("gpuscope.dashboard.plan.served.time.monotonic", lambda: clock[0])
    window = prom.window(3600)
    assert not prom.rules_loaded(window) and len(asked) == 1
    clock[0] += 30
    assert not prom.rules_loaded(window) and len(asked) == 1  # kept within the minute
    clock[0] += 31
    assert prom.rules_loaded(window) and len(asked) == 2      # asked again after it
    clock[0] += 299
    assert prom.rules_loaded(window) and len(asked) == 2      # a found one kept 5 minutes
    clock[0] += 2
    assert prom.rules_loaded(window) and len(asked) == 3



def _checked_side_by_side(monkeypatch: pytest.MonkeyPatch,
                          answer: Callable[[], list[tuple[dict[str, str], float]]],
                          ) -> tuple[PrometheusData, list[Future[bool]], list[str]]:
    """The page's rows and its steps ask whether the rules serve the hour side by side: the
    second asks while the store (0.3 s) still computes the first one's check, which
    ``answer`` ends (returns or raises). The source, both calls and the queries sent."""
    prom = PrometheusData("http://127.0.0.1:1", clock=lambda: 10_000.0)
    asked: list[str] = []
    entered = threading.Event()

    def instant(query: str, at: float) -> list[tuple[dict[str, str], float]]:
        asked.append(query)
        entered.set()
        time.sleep(0.3)
        return answer()

    monkeypatch.setattr(prom, "instant", instant)
    window = prom.window(3600)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(prom.rules_loaded, window)
        assert entered.wait(5)
        second = pool.submit(prom.rules_loaded, window)
        wait([first, second])
    return prom, [first, second], asked


def test_the_rows_and_the_steps_share_one_rules_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The check (the heaviest of the small queries at 5,000 nodes) is sent once.
    _, calls, asked = _checked_side_by_side(monkeypatch, lambda: [({}, 1.0)])
    assert all(call.result() for call in calls)
    assert len(asked) == 1, asked


def test_a_failed_rules_check_fails_those_who_waited_for_it_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A store that times out the check: the page's steps, waiting behind its rows' check,
    # sent it again and waited a whole timeout more (the error banner twice as late).
    def timed_out() -> list[tuple[dict[str, str], float]]:
        raise DataError("store: timed out")

    prom, calls, asked = _checked_side_by_side(monkeypatch, timed_out)
    for call in calls:
        with pytest.raises(DataError, match="timed out"):
            call.result()
    assert len(asked) == 1, asked
    # The page's first question (which window the rules serve) timed out: the rules' check
    # after it fails with its error instead of waiting a timeout of its own.
    asked.clear()
    other = prom.window(6 * 3600)
    assert prom.served_window(other) == (other, 1) and len(asked) == 1
    with pytest.raises(DataError, match="timed out"):
        prom.rules_loaded(other)
    assert len(asked) == 1, asked
    # A later page asks again.
    clock = [time.monotonic() + prom.RULES_FAILED_KEPT + 1]
    monkeypatch.setattr("gpuscope.dashboard.plan.served.time.monotonic", lambda: clock[0])
    monkeypatch.setattr(prom, "instant", lambda query, at: [({}, 1.0)])
    assert prom.rules_loaded(prom.window(3600))


def _late_rules(query: str, at: float) -> list[tuple[dict[str, str], float]]:
    """The version recorded by two rule sets a minute before the window's end, one at it
    (the exporters' newest sample at the end)."""
    return [({"at": "newest"}, at), ({"at": "end"}, 1.0), ({"at": "before"}, 2.0)]


def _written_later(query: str, at: float) -> list[tuple[dict[str, str], float]]:
    """Both rule sets' version at the end and a minute before (the rules written; the
    exporters' newest sample at the end)."""
    return [({"at": "newest"}, at), ({"at": "end"}, 2.0), ({"at": "before"}, 2.0)]


def _probed(monkeypatch: pytest.MonkeyPatch, *answers: Callable[[str, float], Any],
            **kwargs: Any) -> tuple[PrometheusData, list[str], list[float]]:
    """A page's data source whose store answers the n-th query with ``answers[n]`` (the last
    one after), the queries asked and its monotonic clock (seconds, to move on)."""
    prom = PrometheusData("http://127.0.0.1:1", clock=lambda: 10_000_000.0, **kwargs)
    asked: list[str] = []

    def instant(query: str, at: float) -> list[tuple[dict[str, str], float]]:
        asked.append(query)
        return answers[min(len(asked), len(answers)) - 1](query, at)

    monkeypatch.setattr(prom, "instant", instant)
    clock = [1000.0]
    monkeypatch.setattr("gpuscope.dashboard.plan.served.time.monotonic", lambda: clock[0])
    return prom, asked, clock


@pytest.mark.parametrize("max_points", [60, 20])  # one-minute and three-minute steps
def test_a_window_served_earlier_stays_on_its_step_grid(
        monkeypatch: pytest.MonkeyPatch, max_points: int) -> None:
    # Served a rule interval earlier, a window of several-minute steps ended off the grid of
    # its step, which VictoriaMetrics rounds a range query to (its last point a step before
    # the page's end): it is served a step earlier, the page asked a step before.
    end = 10_000_000.0
    prom = PrometheusData("http://127.0.0.1:1", clock=lambda: end, max_points=max_points)
    monkeypatch.setattr(prom, "instant", _late_rules)
    window = prom.window(3600)
    earlier = PrometheusData("http://127.0.0.1:1", clock=lambda: window.end - window.step,
                             max_points=max_points).window(3600)
    assert prom.served_window(window) == (earlier, 1)
    assert prom.served(window).end % window.step == 0


def test_a_window_the_rules_cannot_serve_is_not_served_earlier(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A lookback longer than the step (a two-minute scrape): the page is the raw series'
    # whatever the rules recorded, so it is not served a step earlier; only the store's
    # newest sample is asked (:func:`test_a_store_behind_the_clock_is_served_where_it_has_data`).
    prom, asked, _ = _probed(monkeypatch, _late_rules, lookback=120)
    window = prom.window(3600)
    assert window.step == 60 and not prom.rules_loaded(window)
    assert prom.served_window(window) == (window, 1)
    assert len(asked) == 1 and "dashboard_rules" not in asked[0] and "newest" in asked[0]


@pytest.mark.parametrize("lookback", [60.0, 120.0])  # the rules may serve it, or not
def test_a_store_behind_the_clock_is_served_where_it_has_data(
        monkeypatch: pytest.MonkeyPatch, lookback: float) -> None:
    # The store's newest exporter sample 200 s before the window's end, beyond the reach of
    # the first round's reads there (the step, at least the lookback): the page ends at the
    # last step at or before it (a minute's steps: 4 steps earlier), not kept for good.
    def behind(query: str, at: float) -> list[tuple[dict[str, str], float]]:
        return [*_written_later(query, at), ({"at": "newest"}, at - 200.0)]

    def current(query: str, at: float) -> list[tuple[dict[str, str], float]]:
        return [*_written_later(query, at), ({"at": "newest"}, at - 50.0)]
    prom, asked, clock = _probed(monkeypatch, behind, current, lookback=lookback)
    window = prom.window(3600)
    served, queries = prom.served_window(window)
    assert queries == 1 and served.step == window.step == 60
    assert served.end == window.end - 4 * 60 and served.seconds == window.seconds
    assert prom.served(window) == served and len(asked) == 1  # (the page's steps: kept)
    # Caught up (the newest sample within a step's reach): the window as asked.
    clock[0] += prom.SERVED_EARLIER_KEPT
    assert prom.served(window) == window and len(asked) == 2


def test_a_page_of_another_window_between_the_rows_and_the_steps_leaves_the_served_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The hour's rows served a minute earlier (the rules' last minute not written yet); a
    # 6 h page asked before the hour's steps; the rules written meanwhile: the hour's steps
    # are served over the rows' window, not asked again (which now says the window as asked).
    prom, asked, _ = _probed(monkeypatch, _late_rules, _written_later)
    hour, six = prom.window(3600), prom.window(6 * 3600)
    rows = prom.served(hour)
    assert rows.end == hour.end - 60
    assert prom.served(six) == six
    assert prom.served(hour) == rows and len(asked) == 2


def test_a_window_served_earlier_is_asked_again_on_the_next_page(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A window served a minute earlier was kept for the rest of its minute: the next page
    # (the kept-warm view's refresh) stayed a minute behind though the rules had been
    # written. The rows and steps of one page share it; a page SERVED_EARLIER_KEPT later asks.
    prom, asked, clock = _probed(monkeypatch, _late_rules, _written_later)
    hour = prom.window(3600)
    assert prom.served(hour).end == hour.end - 60
    clock[0] += 1
    assert prom.served(hour).end == hour.end - 60 and len(asked) == 1  # the same page
    clock[0] += prom.SERVED_EARLIER_KEPT
    assert prom.served(hour) == hour and len(asked) == 2                # the next one
    clock[0] += 600
    assert prom.served(hour) == hour and len(asked) == 2                # kept as asked


def test_a_failed_served_probe_is_not_waited_out_twice_by_one_page(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A store that times out: the page's rows and steps each waited out its timeout on the
    # probe, one after the other. The second reads the first one's failure; a page after
    # SERVED_EARLIER_KEPT asks again.
    def timed_out(query: str, at: float) -> list[tuple[dict[str, str], float]]:
        raise DataError("Prometheus: query timed out")

    prom, asked, clock = _probed(monkeypatch, timed_out)
    hour = prom.window(3600)
    assert prom.served(hour) == hour and prom.served(hour) == hour and len(asked) == 1
    clock[0] += prom.SERVED_EARLIER_KEPT
    assert prom.served(hour) == hour and len(asked) == 2


def test_embedded_history_begins_where_the_kept_points_do() -> None:
    """Each series keeps at most ``capacity`` points: once older ones are dropped, the
    history the page has begins at the oldest point it still serves, not at the first
    scrape (24 h of running at 15 s fill 1,440 points in 6 h). Else a 2 h window over 1 h
    of kept points claimed 2 h of history: a GPU idle throughout was 'idle since' the
    first kept point as if that were when it began, and a node that came up 30 min ago was
    charged the 2 h history less the 30 steps it missed, 1.5 h."""
    end = 1_800_000_000.0
    store = EmbeddedData([], interval=60, capacity=60, clock=lambda: end)
    for i in range(121):  # two hours of scrapes, a minute apart; 60 points kept
        t = end - 7200 + i * 60
        store.ingest_text("node-a", exposition(0.0, pods=False), t)
        if t > end - 1800:  # node-b comes up 30 minutes before the end
            store.ingest_text("node-b", exposition(0.0, uuid="GPU-2", pods=False), t)
    data = store.fleet(7200)
    store.close()
    kept = end - 59 * 60  # the oldest of the 60 points each of node-a's series serves
    assert data.history_start == pytest.approx(kept, abs=1e-3)
    assert data.history_seconds == pytest.approx(59 * 60, abs=1e-3)
    # node-b was there 30 minutes (29 of the history's 59 one-minute steps... to the step).
    assert data.present["node-b"] == pytest.approx(29 * 60, abs=data.window.step)
    view = build_fleet_view(data, bundled_prices())
    idle = {r.node: r for r in view.idle_rows}
    assert idle["node-a"].idle_seconds == pytest.approx(data.history_seconds, abs=1e-3)


def test_embedded_series_that_expired_and_returns_is_stored_again() -> None:
    """A series whose points all expired loses its ring; when its exporter serves it again,
    it is stored in a new ring the page reads, not in the dropped one (the store remembers
    each series' ring by its labels as scraped: ``expire`` must forget those it drops)."""
    store = EmbeddedData([], interval=1, max_age=50, clock=lambda: 1000.0)
    store.ingest_text("n", exposition(0.1), 600.0)
    store.expire(1000.0)
    assert not store._rings
    store.ingest_text("n", exposition(0.1), 990.0)
    assert store._rings
    assert all(list(ring.times) == [990.0] for ring in store._rings.values())
    store.close()


def test_embedded_scrapes_in_another_order_store_each_sample_in_its_own_series() -> None:
    """A scrape whose series come in another order than the node's last one (series that
    appear, go, or swap places) stores each sample in its own series (the store matches a
    sample with the one at its place in the last scrape when their names and labels are
    equal, and looks the others up)."""
    a = {"gpu": "0", "uuid": "GPU-a"}
    b = {"gpu": "1", "uuid": "GPU-b"}
    util, temp = "gpu_utilization_ratio", "gpu_temperature_celsius"
    store = EmbeddedData([], interval=1)
    store.ingest("n", [(util, a, 0.1), (util, b, 0.2), (temp, a, 30.0)], 1.0)
    store.ingest("n", [(util, dict(b), 0.4), (util, dict(a), 0.3), (temp, dict(a), 31.0)], 2.0)
    store.ingest("n", [(temp, dict(a), 32.0), (util, dict(b), 0.6)], 3.0)
    store.ingest("m", [(util, dict(a), 0.9)], 3.0)
    values = {(name, dict(labels)["uuid"], dict(labels)["node"]): list(ring.values)
              for (name, labels), ring in store._rings.items()}
    assert values == {
        (util, "GPU-a", "n"): [0.1, 0.3],
        (util, "GPU-b", "n"): [0.2, 0.4, 0.6],
        (temp, "GPU-a", "n"): [30.0, 31.0, 32.0],
        (util, "GPU-a", "m"): [0.9],
    }
    store.close()

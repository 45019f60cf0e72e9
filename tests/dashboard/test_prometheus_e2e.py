"""Against a real Prometheus that scraped real (simulated) exporters: the dashboard's
numbers equal the PromQL answers, and user input reaches PromQL only escaped."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import requests

from gpuscope.dashboard.data import DataError, InvalidFilter, selector
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.views import FleetView, build_fleet_view, page_view
from tests.conftest import ExporterProcess, free_port, stop_all, wait_for

IDLE = """
version: 1
node: {name: e2e-idle, instance_type: g5.12xlarge, seed: 1}
gpus: [{count: 2, model: NVIDIA A10G, memory_total: 24GiB}]
pods: [{namespace: ml, name: notebook, containers: [{name: lab, gpus: [0]}]}]
processes: [{pid: 10, gpu: 0, memory: 1GiB, utilization: 0, pod: ml/notebook/lab}]
"""

BUSY = """
version: 1
node: {name: e2e-busy, instance_type: p4d.24xlarge, seed: 2}
gpus: [{count: 4, model: NVIDIA A100-SXM4-40GB, memory_total: 40GiB}]
pods:
  - {namespace: serve, name: chat, containers: [{name: s, gpus: ["0::0"]}]}
  - {namespace: serve, name: embed, containers: [{name: s, gpus: ["0::1"]}]}
  - {namespace: serve, name: rerank, containers: [{name: s, gpus: ["0::2"]}]}
  - {namespace: ml, name: ddp-worker-0, workload: PyTorchJob/ddp,
    containers: [{name: t, gpus: [1]}]}
  - {namespace: ml, name: ddp-worker-1, workload: PyTorchJob/ddp,
    containers: [{name: t, gpus: [2]}]}
  - {namespace: ml, name: ddp-worker-2, workload: PyTorchJob/ddp,
    containers: [{name: t, gpus: [3]}]}
processes:
  - {pid: 20, gpu: 0, memory: 2GiB, utilization: 0.6, pod: serve/chat/s}
  - {pid: 21, gpu: 0, memory: 2GiB, utilization: 0.3, pod: serve/embed/s}
  - {pid: 22, gpu: 0, memory: 3GiB, utilization: 0.05, pod: serve/rerank/s}
  - {pid: 30, gpu: 1, memory: 30GiB, utilization: 0.9, pod: ml/ddp-worker-0/t}
  - {pid: 31, gpu: 2, memory: 30GiB, utilization: 0.9, pod: ml/ddp-worker-1/t}
  - {pid: 32, gpu: 3, memory: 30GiB, utilization: 0.3, pod: ml/ddp-worker-2/t}
"""

INJECTION = '"}) or vector(1) or up{x="'


def promql(base: str, query: str, at: float | None = None) -> list[dict]:  # type: ignore[type-arg]
    params = {"query": query}
    if at is not None:
        params["time"] = f"{at:.3f}"
    r = requests.get(base + "/api/v1/query", params=params, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def scalar(base: str, query: str, at: float | None = None) -> float:
    result = promql(base, query, at)
    assert len(result) == 1, (query, result)
    return float(result[0]["value"][1])


@pytest.fixture(scope="module")
def fleet(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two simulated exporters (real processes) and a real Prometheus scraping them every
    second, shared by this module's tests."""
    tmp = tmp_path_factory.mktemp("e2e")
    exporters: list[ExporterProcess] = []
    prom: subprocess.Popen[bytes] | None = None
    try:
        targets = {}
        for name, text in (("e2e-idle", IDLE), ("e2e-busy", BUSY)):
            scenario = tmp / f"{name}.yaml"
            scenario.write_text(text)
            exp = ExporterProcess(["--source", "simulated", "--scenario", str(scenario),
                                   "--interval", "0.5"])
            exporters.append(exp)
            targets[name] = f"127.0.0.1:{exp.port}"
        for exp in exporters:
            exp.wait_ready()
        port = free_port()
        lines = ["global: {scrape_interval: 1s}", "scrape_configs:", "  - job_name: gpuscope",
                 "    static_configs:"]
        for node, target in targets.items():
            lines += [f"      - targets: ['{target}']", f"        labels: {{node: {node}}}"]
        (tmp / "prometheus.yml").write_text("\n".join(lines) + "\n")
        log = (tmp / "prometheus.log").open("wb")
        prom = subprocess.Popen(
            [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"

        def enough() -> bool:
            try:
                return scalar(base, "min(count_over_time(gpu_utilization_ratio[1m]))") >= 10
            except (requests.RequestException, AssertionError):
                return False

        wait_for(enough, 60, "Prometheus to scrape both exporters 10 times")
        yield base
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(15)
        stop_all(exporters)


def view_of(base: str) -> tuple[FleetView, PrometheusData]:
    # One-second steps; each looks back 4 s, so scrapes delayed by a busy machine (CI runs
    # on 2 shared cores) leave no gap: a gap breaks every "for at least" run, and the
    # history here is only seconds long (and that of the rates begins 4 s after the data).
    prom = PrometheusData(base, min_step=1, lookback=4, max_points=900)
    data = prom.fleet(900)
    # 13 (no recording rules are looked for: one-second steps; who held what in two, held
    # and used), one for when the data begins (it is younger than the window), one for the
    # store's newest sample (``served_window``: the page ends where the store has data),
    # and a second round by node: idle steps, allocation, time-slicing (the shared device
    # and its containers), the straggler candidates' containers, statistics, the idle
    # container.
    # (The straggler's evidence is read as its row is shown: ``read_evidence``.)
    assert data.queries == 21
    return build_fleet_view(data, bundled_prices()), prom


def test_dashboard_numbers_equal_promql_answers(fleet: str) -> None:
    base = fleet
    view, prom = view_of(base)
    at = view.window.end
    k = view.kpis
    assert k.gpus == scalar(base, 'count(gpu_info{parent_uuid=""})', at) == 6
    # The mean over the window of each step's rate of the busy counter (over two lookbacks,
    # less a millisecond: a rate needs two samples), from the steps at which the counter is
    # as old as that.
    busy = "gpu_busy_seconds_total"
    assert k.mean_utilization == pytest.approx(scalar(
        base, f"avg(avg_over_time((rate({busy}[7999ms]) and {busy} offset 7999ms)[900s:1s]))",
        at), rel=1e-9)
    # These loads are constant: it is the gauges' mean but for a series' first seconds (a
    # rate over a series younger than its range reads low).
    assert k.mean_utilization == pytest.approx(
        scalar(base, "avg(avg_over_time(gpu_utilization_ratio[900s]))", at), rel=0.15)
    assert k.idle == scalar(base, "count(gpu_utilization_ratio < 0.05)", at) == 2
    assert k.busy == scalar(base, "count(gpu_utilization_ratio >= 0.05)", at) == 4

    # Idle node and its price: the node whose every GPU is below 0.05, at g5.12xlarge's price.
    idle_nodes = promql(base, "max by (node) (gpu_utilization_ratio) < 0.05", at)
    assert [r.node for r in view.idle_rows] == [m["metric"]["node"] for m in idle_nodes]
    [row] = view.idle_rows
    itype = promql(base, 'gpu_node_info{node="e2e-idle"}', at)[0]["metric"]["instance_type"]
    assert row.instance_type == itype
    assert row.price_per_hour == bundled_prices().per_hour(itype) == 5.672
    assert k.burning_per_hour == 5.672
    assert row.gpus == scalar(base, 'count(gpu_info{node="e2e-idle", parent_uuid=""})', at)
    assert row.allocated_gpus == scalar(base, 'count(container_gpu_allocated{node="e2e-idle"})',
                                        at) == 1

    # Time-slicing: each container's share of the summed container load.
    shares = promql(base, 'container_gpu_utilization_ratio{namespace="serve"} / on (node, uuid)'
                          ' group_left sum by (node, uuid)'
                          ' (container_gpu_utilization_ratio{namespace!=""})', at)
    expected = {m["metric"]["pod"]: float(m["value"][1]) for m in shares}
    got = {r.pod: r for r in view.share_rows}
    assert set(got) == set(expected) == {"chat", "embed", "rerank"}
    for pod, share in expected.items():
        assert got[pod].share == pytest.approx(share, rel=1e-9)
        assert got[pod].fair_share == pytest.approx(
            1 / scalar(base, 'count(container_gpu_allocated{namespace="serve"})', at))
    assert got["rerank"].gpu_utilization == pytest.approx(
        scalar(base, 'gpu_utilization_ratio{node="e2e-busy", gpu="0"}', at))
    assert [(r.kind, r.pod) for r in view.starved_rows] == [("time-slice", "rerank")]

    # Straggler: rank 2 against the workload's median.
    [s] = view.straggler_rows
    assert s.pods == ("ddp-worker-2",)
    assert s.utilization == pytest.approx(
        scalar(base, 'container_gpu_utilization_ratio{pod="ddp-worker-2"}', at))
    assert s.median == pytest.approx(scalar(
        base, 'quantile(0.5, container_gpu_utilization_ratio{namespace="ml", pod=~"ddp-.*"})',
        at))

    # Drill-downs.
    node = prom.node_detail("e2e-busy", 900)
    assert node.queries == 6
    # The busy counter's rate (as the fleet page reads it) at the window's last step: the
    # store's answer at that same instant. Not the gauge's value: Prometheus stamps each
    # sample with the scrape's time, not the sampling round's, so a rate over 8 s moves by
    # the change in how old the exporter's snapshot was when scraped (up to its 0.5 s
    # interval, more when a loaded machine delays a round): 0.941 for 0.95 under CPU load.
    gpu0 = 'gpu_busy_seconds_total{node="e2e-busy", gpu="0"}'
    end = node.window.end
    assert node.utilization["0"].times[-1] == end
    assert node.utilization["0"].values[-1] == pytest.approx(
        scalar(base, f"rate({gpu0}[7999ms])", end), rel=1e-9)
    # What that rate integrates is the steady gauge's value on the exporter's own clock: the
    # counter's increase over those samples per second of their sampling rounds.
    [busy_samples] = promql(base, f"{gpu0}[7999ms]", end)
    [round_times] = promql(base, 'gpu_exporter_last_sample_timestamp_seconds'
                                 '{node="e2e-busy"}[7999ms]', end)
    (_, v0), *_, (_, v1) = busy_samples["values"]
    (_, s0), *_, (_, s1) = round_times["values"]
    assert (float(v1) - float(v0)) / (float(s1) - float(s0)) == pytest.approx(
        scalar(base, 'gpu_utilization_ratio{node="e2e-busy", gpu="0"}', end), rel=1e-6)
    assert {"serve/rerank/s (GPU 0)", "ml/ddp-worker-2/t (GPU 3)"} <= set(node.containers)
    pod = prom.pod_detail("serve", "rerank", 900)
    assert pod.queries == 3  # utilization, memory, then the devices' index on its node
    assert pod.memory_used["s (e2e-busy GPU 0)"].values[-1] == scalar(
        base, 'container_gpu_memory_used_bytes{pod="rerank"}')
    prom.close()


def test_injection_is_escaped_against_a_real_prometheus(fleet: str) -> None:
    base = fleet
    # What an unescaped filter would do: with a payload shaped for the query around it, the
    # attacker's expression runs and its vector(1) comes back.
    payload = 'x"} or vector(1) or up{x="'
    raw = f'container_gpu_utilization_ratio{{namespace="{payload}"}}'
    assert any(r["metric"] == {} and r["value"][1] == "1" for r in promql(base, raw))
    # Escaped, any such value is one label matcher that matches nothing, and parses fine.
    for value in (INJECTION, payload, 'a\\"b\nc\x00', "serve\\"):
        assert promql(base, selector("container_gpu_utilization_ratio", namespace=value)) == []
    assert len(promql(base, selector("container_gpu_utilization_ratio", namespace="serve"))) == 3
    # The data layer refuses it before any query. (One-second steps, as in view_of: the
    # fleet's history is seconds long, and a window ends at a multiple of its step.)
    prom = PrometheusData(base, min_step=1, lookback=4, max_points=900)
    with pytest.raises(InvalidFilter):
        prom.fleet(900, namespace=INJECTION)
    assert prom.queries_total == 0
    narrowed = page_view(prom, 900, bundled_prices(), namespace="serve")
    assert [r.pod for r in narrowed.starved_rows] == ["rerank"]
    prom.close()


def test_what_the_answers_brought_is_counted(fleet: str) -> None:
    """The store counts its answers' bytes and series (what a page costs to receive): a
    range query's series once each, whatever its points; a query the store refuses adds
    nothing."""
    base = fleet
    prom = PrometheusData(base, min_step=1, lookback=4, max_points=900)
    query = 'container_gpu_utilization_ratio{namespace!=""}'
    at = prom.window(60).end
    rows = prom.instant(query, at)
    expected = promql(base, query, at)
    assert len(rows) == len(expected) == prom.answer_series_total >= 3
    first = prom.answer_bytes_total
    # Every series' labels came in the bytes counted.
    assert first > sum(len(r["metric"]["uuid"]) for r in expected)
    series = prom.range(query, prom.window(60))
    assert all(len(s.times) > 1 for _, s in series)
    assert prom.answer_series_total == len(rows) + len(series)
    assert prom.answer_bytes_total > first
    counted = (prom.answer_bytes_total, prom.answer_series_total)
    with pytest.raises(DataError):
        prom.instant("sum(", at)
    assert (prom.answer_bytes_total, prom.answer_series_total) == counted
    # Queries sent outside a role are counted under "", those of a role under it.
    assert prom.answers_by_role == {"": [counted[0], counted[1], 2]}
    again = prom.as_role("members", lambda: prom.instant(query, at))
    assert again == rows
    assert prom.answers_by_role["members"] == [prom.answer_bytes_total - counted[0],
                                               len(rows), 1]
    # A fleet page's queries each under its role (``now``, ``now#1``: ``now``; its checks of
    # the rules and of where data begins under ""), adding up to what it brought in all.
    before = (prom.answer_bytes_total, prom.answer_series_total)
    was = {role: list(counts) for role, counts in prom.answers_by_role.items()}
    prom.fleet(60)
    roles = {role: [c - w for c, w in zip(counts, was.get(role, [0, 0, 0]), strict=True)]
             for role, counts in prom.answers_by_role.items()}
    assert {"nodes", "now", "pods", "holdings"} <= {r for r, (_, _, n) in roles.items() if n}
    assert sum(b for b, _, _ in roles.values()) == prom.answer_bytes_total - before[0]
    assert sum(n for _, n, _ in roles.values()) == prom.answer_series_total - before[1]
    assert roles["now"][2] == len([q for q in prom.fleet_queries(prom.window(60), None)
                                   if q.partition("#")[0] == "now"])
    prom.close()

#!/usr/bin/env python3
"""How fast the fleet page loads for a large simulated fleet behind a real Prometheus.

    python bench/dashboard_bench.py                 # 500 nodes x 8 GPUs, 1 h window
    python bench/dashboard_bench.py --nodes 100 --no-browser

1. Generates the fleet's last hour (plus 5 minutes of look-back) as OpenMetrics with
   timestamps, one sample per series every 15 s. Each node plays one of four 8-GPU
   scenarios (the demo's p5 training node, idle p4d node and on-prem DGX, and the
   exporter's built-in p5 scenario with time-slicing and MIG) through the exporter's own
   SimulatedSource, attribution and collectors; every node gets its own ``node`` label and
   GPU UUIDs and a time shift, so no two nodes' series coincide.
2. ``promtool tsdb create-blocks-from openmetrics`` turns that into TSDB blocks, and a
   real Prometheus serves them (no scraping: 500 exporters do not fit on 2 cores).
3. Measures, at the data's end time: the page's queries (``PrometheusData.fleet``), the
   analysis and rendering (``build_fleet_view`` + figures + tables), and the full page load
   in headless Chromium (navigation until the idle-node table and the heatmap are drawn),
   and counts the queries one page load sends.

Needs Debian's ``prometheus`` (promtool) and, for the browser part, ``chromium``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuscope.dashboard import components  # noqa: E402
from gpuscope.dashboard.data import PrometheusData  # noqa: E402
from gpuscope.dashboard.figures import heatmap_figure  # noqa: E402
from gpuscope.dashboard.prices import load_prices  # noqa: E402
from gpuscope.dashboard.views import build_fleet_view  # noqa: E402
from gpuscope.exporter.kubernetes.apiserver import NodeInfo  # noqa: E402
from gpuscope.exporter.kubernetes.attribution import attribute  # noqa: E402
from gpuscope.exporter.kubernetes.simulated import ScenarioInputs  # noqa: E402
from gpuscope.exporter.sinks.prometheus.collectors.container import ContainerCollector  # noqa: E402
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector  # noqa: E402
from gpuscope.exporter.sources.scenario import load_scenario  # noqa: E402
from gpuscope.exporter.sources.simulated import SimulatedSource  # noqa: E402

# (scenario file, share of the fleet)
TEMPLATES = (
    (REPO / "dashboard/demo/p5-train.yaml", 0.5),
    (REPO / "dashboard/demo/p4d-idle.yaml", 0.2),
    (REPO / "dashboard/demo/onprem-dgx.yaml", 0.2),
    (REPO / "exporter/sources/scenarios/default.yaml", 0.1),
)
KEEP = {  # what the fleet page and the drill-downs read; the rest is left out
    "gpu_info", "gpu_node_info", "gpu_pod_info", "gpu_utilization_ratio",
    "gpu_memory_used_bytes", "container_gpu_allocated", "container_gpu_utilization_ratio",
    "container_gpu_memory_used_bytes",
    # the work signals (issue 15)
    "gpu_busy_seconds_total", "gpu_sm_active_seconds_total", "gpu_tensor_active_seconds_total",
    "gpu_dram_active_seconds_total", "gpu_energy_joules_total", "gpu_power_watts",
    "gpu_power_limit_watts", "gpu_throttle_seconds_total", "gpu_sm_clock_hertz",
    "gpu_temperature_celsius",
}
SCRAPE = 15.0
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def template_samples(path: Path, times: int) -> tuple[str, dict[SeriesKey, list[float]]]:
    """Per series of one scenario: its value at scenario times 0, 15, 30, ... s."""
    scenario = load_scenario(path)
    source = SimulatedSource(scenario, start=0.0)
    inputs = ScenarioInputs(scenario)
    series: dict[SeriesKey, list[float]] = {}
    for k in range(times):
        snap = source.sample_at(3600.0 + k * SCRAPE, timestamp=k * SCRAPE)
        pids = {p.pid for d in snap.devices for p in d.processes}
        att = attribute(snap, inputs.allocations(), inputs.containers_of(pids),
                        inputs.metadata(), node_fallback=NodeInfo())
        collectors = (GpuCollector(lambda snap=snap: snap),  # type: ignore[misc]
                      ContainerCollector(lambda att=att: att))  # type: ignore[misc]
        for collector in collectors:
            for family in collector.collect():
                for s in family.samples:
                    if s.name not in KEEP:
                        continue
                    key = (s.name, tuple(sorted(s.labels.items())))
                    series.setdefault(key, [float("nan")] * times)[k] = s.value
    return scenario.node.name, series


def openmetrics(nodes: int, end: float, times: int) -> Iterator[str]:
    """The fleet's samples, family by family, series by series, oldest first."""
    counts = [round(share * nodes) for _, share in TEMPLATES]
    counts[0] += nodes - sum(counts)
    templates = [template_samples(path, times) for path, _ in TEMPLATES]
    plan = list(enumerate(t for t, n in enumerate(counts) for _ in range(n)))
    start = end - (times - 1) * SCRAPE
    stamps = [f"{start + k * SCRAPE:.3f}" for k in range(times)]
    for family in sorted(KEEP):
        counter = family.endswith("_total")
        kind = "counter" if counter else "gauge"
        yield f"# TYPE {family.removesuffix('_total') if counter else family} {kind}\n"
        for node_index, t in plan:
            _, series = templates[t]
            node = f"gpu-node-{node_index:04d}"
            shift = node_index % times
            for (name, labels), values in series.items():
                if name != family:
                    continue
                lab = dict(labels)
                for key in ("uuid", "parent_uuid"):
                    if lab.get(key):
                        lab[key] = f"{lab[key][:-4]}{node_index:04d}"
                lab.update(node=node, job="gpuscope", instance=f"{node}:9463")
                text = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
                lines = []
                step_inc = (values[1] - values[0]) if counter and len(values) > 1 else 0.0
                for k in range(times):
                    v = values[(k + shift) % times]
                    if counter and v == v:
                        # keep a rotated counter monotonic: add what it counted per lap
                        v += ((k + shift) // times) * (values[-1] - values[0] + step_inc)
                    if v == v:  # not NaN (a series absent at that time)
                        lines.append(f"{name}{{{text}}} {v!r} {stamps[k]}\n")
                yield "".join(lines)
    yield "# EOF\n"


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {url}")


def browser_load(url: str, runs: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    times = []
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, viewport={"width": 1400,
                                                                        "height": 1000},
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"])
        page = ctx.new_page()
        for _ in range(runs):
            began = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#idle-nodes-table td.dash-cell", timeout=60_000)
            page.wait_for_selector("#fleet-heatmap .heatmaplayer", timeout=60_000)
            page.wait_for_selector("#stragglers-table td.dash-cell", timeout=60_000)
            times.append(time.perf_counter() - began)
        ctx.close()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--window", type=float, default=3600.0, help="seconds (default 1 h)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--keep", help="keep the generated data in this folder, and reuse it "
                    "when it is already there (same --nodes and --window)")
    args = ap.parse_args()
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install prometheus")

    work = Path(args.keep or tempfile.mkdtemp(prefix="gpuscope-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    tsdb = work / "tsdb"
    meta_file = work / "meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    if meta.get("nodes") == args.nodes and meta.get("window") == args.window and tsdb.exists():
        end, samples = meta["end"], meta["samples"]
        print(f"reusing {samples:,} samples in {tsdb}", flush=True)
    else:
        shutil.rmtree(tsdb, ignore_errors=True)
        end = float(int(time.time()) - 120)
        times = int((args.window + 300) // SCRAPE) + 1
        om = work / "fleet.om"
        began = time.perf_counter()
        samples = 0
        with om.open("w") as f:
            for chunk in openmetrics(args.nodes, end, times):
                samples += chunk.count("\n")
                f.write(chunk)
        gen_s = time.perf_counter() - began
        began = time.perf_counter()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om),
                        str(tsdb)], check=True, stdout=subprocess.DEVNULL)
        blocks_s = time.perf_counter() - began
        om.unlink()
        meta_file.write_text(json.dumps({"nodes": args.nodes, "window": args.window,
                                         "end": end, "samples": samples}))
        print(f"generated {samples:,} samples for {args.nodes} nodes x 8 GPUs in {gen_s:.1f}s;"
              f" TSDB blocks in {blocks_s:.1f}s", flush=True)

    port = free_port()
    prom_log = (work / "prometheus.log").open("wb")
    config = work / "prometheus.yml"
    config.write_text("global: {scrape_interval: 15s}\nscrape_configs: []\n")
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
         "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=prom_log, stderr=subprocess.STDOUT,
    )
    result: dict[str, object] = {"nodes": args.nodes, "gpus": args.nodes * 8,
                                 "window_s": args.window, "samples": samples}
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/-/ready", 60)
        source = PrometheusData(base, clock=lambda: end)
        prices = load_prices()

        fetch, build, render = [], [], []
        for _ in range(args.runs + 1):  # the first run warms Prometheus' caches
            t0 = time.perf_counter()
            data = source.fleet(args.window)
            t1 = time.perf_counter()
            view = build_fleet_view(data, prices)
            t2 = time.perf_counter()
            heatmap_figure(view.heatmap).to_json()
            json.dumps([components.idle_data(view.idle_rows),
                        components.starved_data(view.starved_rows),
                        components.share_data(view.share_rows),
                        components.straggler_data(view.straggler_rows)])
            t3 = time.perf_counter()
            fetch.append(t1 - t0)
            build.append(t2 - t1)
            render.append(t3 - t2)
        k = view.kpis
        print(f"fleet: {k.gpus} GPUs, {k.idle} idle, {k.idle_nodes} idle nodes, "
              f"{len(view.starved_rows)} starved, {len(view.straggler_rows)} stragglers, "
              f"{data.queries} queries")
        result.update(
            queries_fleet=data.queries,
            fetch_s=statistics.median(fetch[1:]), analysis_s=statistics.median(build[1:]),
            render_s=statistics.median(render[1:]), idle_nodes=k.idle_nodes,
            starved=len(view.starved_rows), stragglers=len(view.straggler_rows),
        )
        print(f"server side (median of {args.runs}): queries {result['fetch_s']:.2f}s, "
              f"analysis {result['analysis_s']:.2f}s, rendering {result['render_s']:.2f}s")

        if not args.no_browser:
            from gpuscope.dashboard.app import DashboardServer, create_app
            from gpuscope.dashboard.service import DashboardService

            if not os.path.exists(CHROMIUM):
                raise SystemExit(f"{CHROMIUM} not found: apt-get install chromium "
                                 "(or pass --no-browser)")
            for mode in ("on_demand", "kept_warm"):
                page_source = PrometheusData(base, clock=lambda: end)
                service = DashboardService(page_source, prices, share_for=0)
                if mode == "kept_warm":
                    service.keep_warm(30.0)
                    service.fleet(None, None)  # the first background result is in
                app = create_app(service, refresh_seconds=3600)
                server = DashboardServer(app, "127.0.0.1", 0)
                server.start()
                try:
                    before = page_source.queries_total
                    loads = browser_load(f"http://127.0.0.1:{server.port}/", args.runs + 1)
                    per_load = (page_source.queries_total - before) / len(loads)
                finally:
                    server.stop()
                    service.close()
                    page_source.close()
                result.update({f"page_load_{mode}_first_s": loads[0],
                               f"page_load_{mode}_s": statistics.median(loads[1:]),
                               f"queries_per_page_load_{mode}": per_load})
                print(f"page load in Chromium, view {mode.replace('_', ' ')}: first "
                      f"{loads[0]:.2f}s, then median {statistics.median(loads[1:]):.2f}s; "
                      f"{per_load:g} queries per page load", flush=True)
    finally:
        prom.terminate()
        prom.wait(30)
        prom_log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

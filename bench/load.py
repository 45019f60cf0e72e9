"""Load test of the exporter and the dashboard under concurrent clients (``make load``).

Not a test and not run by CI: it takes about 6.5 minutes (``--quick``: about 1.5). Needs Debian's
``wrk`` and, for the Prometheus mode of the dashboard, ``prometheus``/``promtool``.

A. Exporter. ``python -m gpuscope.exporter --source simulated --scenario FILE --interval 1`` as its
   own process on 127.0.0.1, FILE being ``synthetic_scenario(8, 64)`` (8 GPUs x 64
   processes; 32 pods, four time-slicing each GPU through replicas ``g::r``, each pod's
   container owning 16 processes of its GPU). After ``/readyz``:
   ``wrk -t2 -c100 -d60s --latency --timeout 5s`` on ``/metrics``, once uncompressed and
   once with ``Accept-Encoding: gzip`` (as Prometheus asks), each on a fresh exporter.
   Meanwhile a side thread scrapes ``/metrics`` once a second for
   ``gpu_exporter_last_sample_timestamp_seconds`` and ``gpu_exporter_missed_rounds_total``
   (rounds are counted from the distinct sample timestamps seen, as a scraper sees them)
   and reads the exporter's CPU and RSS from
   ``/proc``. Fails on any wrk error (connect, read, write, timeout, non-2xx, unexpected
   body), on wrk connections that never reached the server (handshakes dropped by a full
   listen queue, seen in /proc/net/tcp), on a missed sampling round, or when a scrape saw
   the last sample older than two intervals (measured like Prometheus does: from the time
   the scrape was sent).

B. Dashboard main page at 10 concurrent users (``wrk -t2 -c10``): ``GET /`` and the fleet
   view's callback ``POST /_dash-update-component`` (its body built from the running app's
   ``/_dash-dependencies`` and ``/_dash-layout``, as the browser builds it), as separate wrk
   runs, in two modes: ``gpuscope-dashboard --demo`` (embedded: one simulated exporter
   per bundled demo scenario, scraped in-process) and ``gpuscope-dashboard --prometheus
   URL`` on a real Prometheus holding a simulated fleet's last hour (``--nodes``, default
   50 x 8 GPUs; built with ``bench/dashboard_bench.py``'s generator and ``promtool``:
   backfilled, not scraped).
   The callback's answer is checked with urllib before and after each run (every output,
   a heatmap with a row per node) and by wrk on every response (200 and the heatmap in the
   body). Fails when p99 exceeds ``--p99-limit`` (2 s); then the dashboard is profiled with
   py-spy over one more run and the hottest functions are printed.

    .venv/bin/python bench/load.py                      # everything, 60-s runs
    .venv/bin/python bench/load.py --quick              # 10-s runs, 20 nodes
    .venv/bin/python bench/load.py --only exporter --process-metrics --json /tmp/load.json
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import exporter_bench as eb  # noqa: E402
from gpuscope.dashboard import ids  # noqa: E402
from gpuscope.dashboard.demo import scenario_files  # noqa: E402

WRK = "wrk"
MARK = "LOAD_JSON "  # the line the wrk script prints its numbers on
GPUS, PROCESSES_PER_GPU, PODS = 8, 64, 32


# ---------------------------------------------------------------------------------------------
# wrk


def lua_string(text: str | None) -> str:
    """A Lua string literal (``nil`` for None); every byte but [A-Za-z0-9 ] as ``\\ddd``."""
    if text is None:
        return "nil"
    out = []
    for b in text.encode():
        c = chr(b)
        out.append(c if c.isascii() and (c.isalnum() or c == " ") else f"\\{b:03d}")
    return '"' + "".join(out) + '"'


_LUA = """\
-- written by bench/load.py
wrk.method = {method}
wrk.body = {body}
{headers}
local expect_body = {expect_body}
local expect_header, expect_value = {expect_header}, {expect_value}
local threads = {{}}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  responses, non2xx, unexpected = 0, 0, 0
end

function response(status, headers, body)
  responses = responses + 1
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
  elseif expect_body and not string.find(body, expect_body, 1, true) then
    unexpected = unexpected + 1
  elseif expect_header then
    local found = nil
    for k, v in pairs(headers) do
      if string.lower(k) == expect_header then found = v end
    end
    if found ~= expect_value then unexpected = unexpected + 1 end
  end
end

function done(summary, latency, requests)
  local r, n, u = 0, 0, 0
  for _, t in ipairs(threads) do
    r = r + t:get("responses")
    n = n + t:get("non2xx")
    u = u + t:get("unexpected")
  end
  local e = summary.errors
  io.write(string.format("{mark}{{\\"duration_us\\": %d, \\"requests\\": %d, \\"bytes\\": %d, "
    .. "\\"responses\\": %d, \\"connect\\": %d, \\"read\\": %d, \\"write\\": %d, "
    .. "\\"status\\": %d, \\"timeout\\": %d, \\"non2xx\\": %d, \\"unexpected\\": %d, "
    .. "\\"min_us\\": %d, \\"mean_us\\": %.1f, \\"max_us\\": %d, \\"p50_us\\": %d, "
    .. "\\"p90_us\\": %d, \\"p99_us\\": %d}}\\n",
    summary.duration, summary.requests, summary.bytes, r, e.connect, e.read, e.write,
    e.status, e.timeout, n, u, latency.min, latency.mean, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class Request:
    """One kind of request for wrk to repeat, and what every answer must hold."""

    path: str
    method: str = "GET"
    body: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    expect_body: str | None = None  # a substring of every 2xx body
    expect_header: tuple[str, str] | None = None  # (lower-case name, exact value)

    def lua(self) -> str:
        name, value = self.expect_header or (None, None)
        return _LUA.format(
            method=lua_string(self.method),
            body=lua_string(self.body),
            headers="\n".join(f"wrk.headers[{lua_string(k)}] = {lua_string(v)}"
                              for k, v in self.headers),
            expect_body=lua_string(self.expect_body),
            expect_header=lua_string(name),
            expect_value=lua_string(value),
            mark=MARK,
        )


@dataclass
class WrkResult:
    connections: int
    threads: int
    duration_s: float
    requests: int
    requests_per_s: float
    mib_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    errors: dict[str, int]  # connect, read, write, timeout, status (>= 400), non2xx, unexpected
    loadavg: tuple[float, float]  # 1-min load average at start and end
    # TcpExtListenOverflows during the run (system-wide): connections the kernel could not
    # queue for accept() because the server's listen backlog was full (SYN dropped, retried
    # by the client after 1 s, 3 s, 7 s, ...).
    listen_overflows: int
    # Server-side ESTABLISHED sockets of wrk's connections (the kernel's view, once every
    # 0.5 s): the most seen, and when all of them first were (None: never during the run).
    # Fewer than ``connections`` means some clients' handshakes were dropped and are still
    # being retried: those clients got no answer at all for that long.
    server_connections_max: int
    all_connected_after_s: float | None

    @property
    def error_total(self) -> int:
        e = self.errors
        # "status" (>= 400) is a subset of "non2xx".
        return e["connect"] + e["read"] + e["write"] + e["timeout"] + e["non2xx"] + e[
            "unexpected"]


def established(port: int) -> int:
    """ESTABLISHED TCP sockets whose local port is ``port`` (from /proc/net/tcp{,6})."""
    count = 0
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == "01" and fields[1].endswith(suffix):
                    count += 1
    return count


def run_wrk(url: str, request: Request, *, connections: int, threads: int, duration: float,
            timeout: float, workdir: Path, other_connections: int = 0) -> WrkResult:
    """One wrk run; ``other_connections``: connections to the server that are not wrk's
    (subtracted from the server-side count)."""
    script = workdir / f"wrk-{abs(hash(request))}.lua"
    script.write_text(request.lua())
    command = [WRK, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration))}s",
               "--latency", "--timeout", f"{timeout:g}s", "-s", str(script), url + request.path]
    port = int(urllib.parse.urlsplit(url).port or 80)
    load_before = os.getloadavg()[0]
    overflows = listen_overflows()
    started = time.monotonic()
    seen_max, all_after = 0, None
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            while proc.poll() is None and time.monotonic() - started < duration + timeout + 60:
                # Not in the last half second: wrk closes its connections as it ends.
                if time.monotonic() - started < duration - 0.5:
                    seen = established(port) - other_connections
                    seen_max = max(seen_max, seen)
                    if seen >= connections and all_after is None:
                        all_after = round(time.monotonic() - started, 1)
                time.sleep(0.5)
            stdout, stderr = proc.communicate(timeout=30)
        except BaseException:
            proc.kill()
            raise
    overflows = listen_overflows() - overflows
    load_after = os.getloadavg()[0]
    line = next((ln for ln in stdout.splitlines() if ln.startswith(MARK)), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n"
                           f"{stdout}\n{stderr}")
    n = json.loads(line[len(MARK):])
    seconds = n["duration_us"] / 1e6
    return WrkResult(
        connections=connections, threads=threads, duration_s=round(seconds, 2),
        requests=n["requests"],
        requests_per_s=round(n["requests"] / seconds, 1),
        mib_per_s=round(n["bytes"] / seconds / 2**20, 2),
        p50_ms=n["p50_us"] / 1000, p90_ms=n["p90_us"] / 1000, p99_ms=n["p99_us"] / 1000,
        max_ms=n["max_us"] / 1000, mean_ms=round(n["mean_us"] / 1000, 3),
        errors={k: int(n[k]) for k in ("connect", "read", "write", "timeout", "status",
                                       "non2xx", "unexpected")},
        loadavg=(round(load_before, 2), round(load_after, 2)),
        listen_overflows=overflows,
        server_connections_max=seen_max,
        all_connected_after_s=all_after,
    )


def wrk_problems(w: WrkResult) -> list[str]:
    out = [f"wrk: {k} errors: {v}" for k, v in w.errors.items() if v and k != "status"]
    if w.all_connected_after_s is None:
        out.append(f"only {w.server_connections_max} of wrk's {w.connections} connections "
                   "ever reached the server (the others' handshakes were dropped and retried)")
    return out


def listen_overflows() -> int:
    """The kernel's TcpExtListenOverflows counter (0 where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        lines = Path("/proc/net/netstat").read_text().splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            if names.startswith("TcpExt:"):
                return int(values.split()[names.split().index("ListenOverflows")])
    return 0


# ---------------------------------------------------------------------------------------------
# Process watching


class ProcWatch:
    """CPU (``utime + stime`` of all threads) and RSS of processes over a window; RSS read
    once a second for the peak."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._ticks = {name: eb.cpu_ticks(pid) for name, pid in pids.items()}
        self._rss_peak = {name: 0 for name in pids}
        self._started = time.monotonic()

    def poll(self) -> None:
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                self._rss_peak[name] = max(self._rss_peak[name], eb.memory_kib(pid)["VmRSS"])

    def finish(self) -> dict[str, dict[str, float]]:
        window = time.monotonic() - self._started
        out: dict[str, dict[str, float]] = {}
        for name, pid in self.pids.items():
            self.poll()
            ticks = eb.cpu_ticks(pid) - self._ticks[name]
            out[name] = {
                "cpu_percent": round(ticks / eb.CLK_TCK / window * 100, 1),
                "rss_peak_mib": round(self._rss_peak[name] / 1024, 1),
                "rss_end_mib": round(eb.memory_kib(pid)["VmRSS"] / 1024, 1),
            }
        return out


@contextlib.contextmanager
def every_second(fn: Callable[[], None]) -> Iterator[None]:
    """Call ``fn`` about once a second from a side thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(1.0):
            fn()

    thread = threading.Thread(target=loop, name="load-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def stop_quietly(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        eb.stop_process(proc)


def log_exceptions(path: Path) -> dict[str, int]:
    """Tracebacks in a log, by exception type (the last line of each)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("Traceback"):
                continue
            for after in lines[i + 1:]:
                m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b)", after)
                if m:
                    out[m.group(1)] = out.get(m.group(1), 0) + 1
                    break
    return out


def log_tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# ---------------------------------------------------------------------------------------------
# A. Exporter


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", re.MULTILINE)


def samples(body: bytes) -> Iterator[tuple[str, str, float]]:
    """(name, label text, value) of every sample line."""
    for m in _LINE.finditer(body.decode()):
        yield m.group(1), m.group(2) or "", float(m.group(3))


def metric(body: bytes, name: str) -> float:
    for n, _, value in samples(body):
        if n == name:
            return value
    raise RuntimeError(f"no {name} in the scrape")


def label_values(body: bytes, name: str, label: str) -> set[str]:
    pattern = re.compile(rf'{label}="([^"]*)"')
    return {m.group(1) for n, labels, _ in samples(body) if n == name
            for m in [pattern.search(labels)] if m}


@dataclass
class SamplerCheck:
    """What the side thread saw of the sampling loop during a wrk run."""

    interval_s: float
    polls: int = 0
    poll_failures: int = 0
    poll_max_ms: float = 0.0
    missed_rounds_before: float = 0.0
    missed_rounds_after: float = 0.0
    # Staleness of the last sample at each poll: now - last_sample_timestamp, "now" being when
    # the scrape was sent (as Prometheus timestamps a scrape) and, conservatively, received.
    lag_max_s: float = 0.0
    lag_at_receive_max_s: float = 0.0
    distinct_timestamps: int = 0
    rounds_from_timestamps: int = 0  # (last - first timestamp seen) / interval
    rounds_expected: int = 0  # (last - first poll) / interval
    # (scrape sent, answer received, last_sample_timestamp), wall-clock seconds
    timeline: list[tuple[float, float, float]] = field(default_factory=list, repr=False)

    @property
    def missed_rounds(self) -> float:
        return self.missed_rounds_after - self.missed_rounds_before

    def add(self, sent: float, received: float, body: bytes) -> None:
        last = metric(body, "gpu_exporter_last_sample_timestamp_seconds")
        self.missed_rounds_after = metric(body, "gpu_exporter_missed_rounds_total")
        self.timeline.append((sent, received, last))
        self.polls += 1
        self.poll_max_ms = max(self.poll_max_ms, (received - sent) * 1000)

    def summarize(self) -> None:
        if not self.timeline:
            return
        self.lag_max_s = round(max(max(0.0, s - ts) for s, _, ts in self.timeline), 3)
        self.lag_at_receive_max_s = round(max(r - ts for _, r, ts in self.timeline), 3)
        stamps = [ts for _, _, ts in self.timeline]
        self.distinct_timestamps = len(set(stamps))
        self.rounds_from_timestamps = round((stamps[-1] - stamps[0]) / self.interval_s)
        self.rounds_expected = round((self.timeline[-1][0] - self.timeline[0][0]) / self.interval_s)

    def problems(self) -> list[str]:
        out = []
        if self.missed_rounds:
            out.append(f"{self.missed_rounds:g} missed sampling round(s)")
        if self.poll_failures:
            out.append(f"{self.poll_failures} side-thread scrape(s) failed")
        if self.lag_max_s > 2 * self.interval_s:
            out.append(f"last sample {self.lag_max_s:.2f} s old at a scrape (> 2 intervals)")
        if abs(self.rounds_from_timestamps - self.rounds_expected) > 1:
            out.append(f"{self.rounds_from_timestamps} rounds seen, {self.rounds_expected} due")
        return out


@dataclass
class ExporterRun:
    variant: str
    command: list[str]
    series: int
    gpus: int
    pods: int
    containers: int
    body_bytes: int
    wrk: WrkResult
    sampler: SamplerCheck
    process: dict[str, float]  # cpu_percent, rss_peak_mib, rss_end_mib
    log_exceptions: dict[str, int]  # tracebacks in the exporter's log, by type
    problems: list[str]


def exporter_run(args: argparse.Namespace, variant: str, workdir: Path) -> ExporterRun:
    bench_args = eb.parse_args(
        ["--source", "simulated", "--interval", f"{args.interval:g}", "--gpus", str(GPUS),
         "--processes-per-gpu", str(PROCESSES_PER_GPU),
         *(["--process-metrics"] if "process-metrics" in variant else [])])
    gzip_on = "gzip" in variant
    exp = eb.start_exporter(bench_args, workdir)
    try:
        eb.wait_ready(exp, 60)
        scraper = eb.Scraper(exp.port, {})
        _, body = scraper.scrape()
        gpus = len(label_values(body, "gpu_utilization_ratio", "gpu"))
        pods = len(label_values(body, "container_gpu_allocated", "pod"))
        containers = sum(1 for n, _, _ in samples(body) if n == "container_gpu_allocated")
        series = eb.count_series(body)
        check = SamplerCheck(interval_s=args.interval)
        check.missed_rounds_before = metric(body, "gpu_exporter_missed_rounds_total")

        def poll() -> None:
            sent = time.time()
            try:
                _, polled = scraper.scrape()
            except (OSError, RuntimeError, http.client.HTTPException):
                check.poll_failures += 1
                return
            check.add(sent, time.time(), polled)
            watch.poll()

        headers = (("Accept-Encoding", "gzip"),) if gzip_on else ()
        request = Request(
            "/metrics", headers=headers,
            expect_body=None if gzip_on else "gpu_exporter_last_sample_timestamp_seconds",
            expect_header=("content-encoding", "gzip") if gzip_on else None,
        )
        watch = ProcWatch({"exporter": exp.pid})
        poll()
        with every_second(poll):
            result = run_wrk(f"http://127.0.0.1:{exp.port}", request,
                             connections=args.exporter_connections, threads=args.threads,
                             duration=args.duration, timeout=args.timeout, workdir=workdir,
                             other_connections=1)
        poll()
        process = watch.finish()["exporter"]
        check.summarize()
        scraper.close()
        if exp.proc.poll() is not None:
            raise RuntimeError(f"the exporter died during the run:\n{exp.log_tail()}")
    finally:
        code = exp.stop()
    problems = wrk_problems(result)
    problems += check.problems()
    if gpus != GPUS or pods != PODS:
        problems.append(f"expected {GPUS} GPUs and {PODS} pods, the exporter shows {gpus} and "
                        f"{pods}")
    if code not in (0, None):
        problems.append(f"exporter exit code {code}")
    return ExporterRun(variant=variant, command=exp.command, series=series, gpus=gpus,
                       pods=pods, containers=containers, body_bytes=len(body), wrk=result,
                       sampler=check, process=process,
                       log_exceptions=log_exceptions(exp.log_path), problems=problems)


# ---------------------------------------------------------------------------------------------
# B. Dashboard


def http_json(url: str, body: object | None = None, timeout: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _props_by_id(node: Any, out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if isinstance(node, dict):
        props = node.get("props")
        if isinstance(props, dict):
            if isinstance(props.get("id"), str):
                out[props["id"]] = props
            for value in props.values():
                _props_by_id(value, out)
    elif isinstance(node, list):
        for item in node:
            _props_by_id(item, out)
    return out


def fleet_callback_body(base: str) -> dict[str, Any]:
    """The JSON body the browser posts for the fleet view on a page load, built from the
    app's own ``/_dash-dependencies`` and the initial values in ``/_dash-layout``. (Checked
    against the body headless Chromium sends: the same, less the ``endId`` query parameter,
    which only background callbacks read.)"""
    deps = http_json(base + "/_dash-dependencies")
    dep = next(d for d in deps if f"{ids.FLEET_HEATMAP}.figure" in d["output"].split("..."))
    props = _props_by_id(http_json(base + "/_dash-layout"), {})

    def value(ref: dict[str, str]) -> dict[str, Any]:
        item = {"id": ref["id"], "property": ref["property"]}
        found = props.get(ref["id"], {})
        if ref["property"] in found:
            item["value"] = found[ref["property"]]
        return item

    outputs = []
    for part in dep["output"].strip(".").split("..."):
        component, _, prop = part.rpartition(".")
        outputs.append({"id": component, "property": prop})
    body: dict[str, Any] = {
        "output": dep["output"], "outputs": outputs,
        "inputs": [value(i) for i in dep["inputs"]],
        "changedPropIds": [], "parsedChangedPropsIds": [],
    }
    if dep.get("state"):
        body["state"] = [value(s) for s in dep["state"]]
    return body


def check_fleet_answer(answer: Any, body: dict[str, Any], nodes: int) -> list[str]:
    """Problems with a fleet callback's answer: every output present, no error banner, a
    heatmap with one row per node, KPI cards. (The node picker's options are not in it:
    its own callback sends the names matching what is typed, at most 100.)"""
    try:
        response = answer["response"]
        missing = [f"{o['id']}.{o['property']}" for o in body["outputs"]
                   if o["property"] not in response.get(o["id"], {})]
        if missing:
            return [f"outputs missing from the answer: {', '.join(missing)}"]
        problems = []
        banner = response[ids.BANNER]
        if "error" in banner["className"] or banner["children"]:
            problems.append(f"banner shown: {banner['children']!r}")
        traces = response[ids.FLEET_HEATMAP]["figure"]["data"]
        heat = [t for t in traces if t.get("type") == "heatmap"]
        rows = len(heat[0].get("y", [])) if heat else 0
        if rows != nodes:
            problems.append(f"heatmap has {rows} node rows, expected {nodes}")
        if not response[ids.FLEET_KPIS]["children"]:
            problems.append("no KPI cards")
        return problems
    except (KeyError, TypeError, IndexError) as exc:
        return [f"unexpected answer shape: {type(exc).__name__}: {exc}"]


def fleet_summary(answer: Any) -> str:
    """The KPI cards and the table notes of a fleet callback's answer, as one line."""
    try:
        response = answer["response"]
        cards = []
        for card in response[ids.FLEET_KPIS]["children"]:
            texts = [c["props"]["children"] for c in card["props"]["children"]]
            cards.append(f"{texts[0]} {texts[1]}")
        notes = [str(response[i]["children"]) for i in
                 (ids.IDLE_NOTE, ids.STARVED_NOTE, ids.STRAGGLERS_NOTE)]
        return "; ".join(cards) + ". " + " ".join(notes)
    except (KeyError, TypeError, IndexError):
        return ""


@dataclass
class Profile:
    path: str
    samples: int
    top_self: list[tuple[str, float]]  # (frame, share of samples)
    top_inclusive: list[tuple[str, float]]


@dataclass
class DashboardRun:
    mode: str
    nodes: int
    command: list[str]
    target: str  # "/" or the callback
    fleet: str  # what the page showed (fleet_summary) after the run
    response_bytes: int
    wrk: WrkResult
    processes: dict[str, dict[str, float]]
    problems: list[str]
    log_exceptions: dict[str, int] = field(default_factory=dict)  # in the dashboard's log
    profile: Profile | None = None


def _frame(text: str) -> str:
    """``func (path:line)`` -> ``func (short path)``: site-packages and the repo cut off."""
    m = re.match(r"^(.*) \((.*?)(?::\d+)?\)$", text)
    if not m:
        return text
    func, path = m.groups()
    for marker in ("site-packages/", "lib/python3.11/", str(REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{func} ({path})"


# Frames on nearly every stack (threads, the HTTP server, WSGI): left out of the inclusive list.
PLUMBING = ("threading.py", "socketserver.py", "http/server.py", "socket.py", "werkzeug/",
            "flask/app.py", "concurrent/futures/")


def profile_summary(path: Path, top: int = 12) -> Profile:
    """Hottest frames of a py-spy ``--format raw`` (collapsed stacks) recording: by own
    samples, and by samples in which the frame is on the stack (less the threading and
    HTTP-server plumbing)."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame(f) for f in stack.split(";")]
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for f in set(frames):
            if not any(f"({p}" in f for p in PLUMBING):
                incl[f] = incl.get(f, 0) + count

    def best(counts: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [(f, round(c / max(total, 1), 3)) for f, c in ranked]

    return Profile(str(path), total, best(own), best(incl))


def dashboard_command(mode: str, port: int, prometheus: str | None) -> list[str]:
    script = Path(sys.executable).with_name("gpuscope-dashboard")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "gpuscope.dashboard"]
    source = ["--demo"] if mode == "embedded" else ["--prometheus", str(prometheus)]
    return [*cli, *source, "--listen", f"127.0.0.1:{port}"]


def start_prometheus_fleet(args: argparse.Namespace, workdir: Path,
                           ahead: float) -> tuple[subprocess.Popen[bytes], str]:
    """A real Prometheus holding ``args.nodes`` simulated 8-GPU nodes: the last hour plus
    five minutes of look-back and ``ahead`` seconds into the future, so the dashboard (on the
    real clock) sees a full hour all through the runs. Generated with dashboard_bench's
    generator, turned into TSDB blocks by promtool."""
    from bench import dashboard_bench as db

    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found: apt-get install prometheus")
    end = float(int(time.time() + ahead))
    times = int((3600 + 300 + ahead) // db.SCRAPE) + 1
    om = workdir / "fleet.om"
    tsdb = workdir / "tsdb"
    began = time.monotonic()
    with om.open("w") as f:
        for chunk in db.openmetrics(args.nodes, end, times):
            f.write(chunk)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om),
                    str(tsdb)], check=True, stdout=subprocess.DEVNULL, timeout=1800)
    om.unlink()
    print(f"  built a {args.nodes}-node fleet's TSDB in {time.monotonic() - began:.0f} s",
          flush=True)
    port = db.free_port()
    config = workdir / "prometheus.yml"
    config.write_text("global: {scrape_interval: 15s}\nscrape_configs: []\n")
    with (workdir / "prometheus.log").open("wb") as log:
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
             "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=eb._die_with_parent,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        db.wait_http(url + "/-/ready", 60)
    except SystemExit as exc:
        stop_quietly(prom)
        raise RuntimeError(str(exc)) from None
    return prom, url


def wait_for_view(base: str, body: dict[str, Any], nodes: int, proc: subprocess.Popen[bytes],
                  log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    problems: list[str] = ["no answer"]
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard exited with {proc.returncode}:\n{log_tail(log)}")
        with contextlib.suppress(OSError, ValueError):
            problems = check_fleet_answer(
                http_json(base + "/_dash-update-component", body), body, nodes)
            if not problems:
                return
        time.sleep(1.0)
    raise RuntimeError(f"the fleet view did not come up in {timeout:g} s: {problems}\n"
                       f"{log_tail(log)}")


def dashboard_runs(args: argparse.Namespace, mode: str, workdir: Path) -> list[DashboardRun]:
    prom: subprocess.Popen[bytes] | None = None
    dash: subprocess.Popen[bytes] | None = None
    runs: list[DashboardRun] = []
    log = workdir / f"dashboard-{mode}.log"
    try:
        prom_url = None
        nodes = len(scenario_files())  # the demo fleet: a node per dashboard/demo/*.yaml
        watched: dict[str, int] = {}
        if mode == "prometheus":
            nodes = args.nodes
            # Until the end of both runs, a profile and some slack.
            prom, prom_url = start_prometheus_fleet(args, workdir,
                                                    ahead=3 * args.duration + 600)
            watched["prometheus"] = prom.pid
        port = eb.free_port()
        command = dashboard_command(mode, port, prom_url)
        env = eb.child_env(eb.parse_args([]))
        with log.open("wb") as out:
            dash = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=eb._die_with_parent)
        watched = {"dashboard": dash.pid, **watched}
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                body = fleet_callback_body(base)
                break
            except (OSError, ValueError) as exc:
                if dash.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the dashboard did not come up: {exc}\n"
                                       f"{log_tail(log)}") from None
                time.sleep(0.5)
        wait_for_view(base, body, nodes, dash, log)
        with urllib.request.urlopen(base + "/", timeout=30) as resp:
            page_bytes = len(resp.read())
        callback_bytes = len(json.dumps(http_json(base + "/_dash-update-component", body)))
        targets = (
            ("GET /", Request("/", expect_body="_dash-config"), page_bytes),
            ("POST callback", Request(
                "/_dash-update-component", method="POST", body=json.dumps(body),
                headers=(("Content-Type", "application/json"),),
                expect_body=f'"{ids.FLEET_HEATMAP}"'), callback_bytes),
        )
        for name, request, size in targets:
            problems: list[str] = []
            watch = ProcWatch(watched)
            with every_second(watch.poll):
                result = run_wrk(base, request, connections=args.dashboard_users,
                                 threads=args.threads, duration=args.duration,
                                 timeout=args.timeout, workdir=workdir)
            processes = watch.finish()
            problems += wrk_problems(result)
            if result.p99_ms > args.p99_limit * 1000:
                problems.append(f"p99 {result.p99_ms / 1000:.2f} s > {args.p99_limit:g} s")
            answer = http_json(base + "/_dash-update-component", body)
            problems += [f"after the run: {p}" for p in check_fleet_answer(answer, body, nodes)]
            run = DashboardRun(mode=mode, nodes=nodes, command=command, target=name,
                               fleet=fleet_summary(answer),
                               response_bytes=size, wrk=result, processes=processes,
                               problems=problems)
            if result.p99_ms > args.p99_limit * 1000 or args.profile:
                run.profile = profile_run(args, base, request, dash.pid, workdir,
                                          f"{mode}-{name.split()[0].lower()}")
            runs.append(run)
        if dash.poll() is not None:
            raise RuntimeError(f"the dashboard died during the runs:\n{log_tail(log)}")
    finally:
        stop_quietly(dash)
        stop_quietly(prom)
    if runs:
        runs[-1].log_exceptions = log_exceptions(log)
    return runs


def profile_run(args: argparse.Namespace, base: str, request: Request, pid: int,
                workdir: Path, name: str) -> Profile | None:
    """py-spy over one more wrk run of ``request`` (at most 30 s), summarized."""
    exe = eb.py_spy()
    if exe is None:
        print("  (py-spy not found: no profile)", file=sys.stderr)
        return None
    seconds = min(args.duration, 30.0)
    out_dir = Path(args.profile_dir) if args.profile_dir else workdir
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"profile-{name}.txt"
    spy = subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
         "--format", "raw", "--nonblocking", "--output", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_wrk(base, request, connections=args.dashboard_users, threads=args.threads,
                duration=seconds, timeout=args.timeout, workdir=workdir)
        spy.wait(60)
    except (subprocess.TimeoutExpired, RuntimeError):
        spy.kill()
        spy.wait()
    return profile_summary(path) if path.exists() else None


# ---------------------------------------------------------------------------------------------
# Report


def _errors(w: WrkResult) -> str:
    e = w.errors
    return (f"{e['connect']}/{e['read']}/{e['write']}/{e['timeout']}/{e['non2xx']}/"
            f"{e['unexpected']}")


def _conns(w: WrkResult) -> str:
    if w.all_connected_after_s is not None:
        return f"all@{w.all_connected_after_s:g}s"
    return f"{w.server_connections_max}/{w.connections}"


def print_report(exporter: list[ExporterRun], dashboard: list[DashboardRun],
                 problems: list[str]) -> None:
    if exporter:
        w0 = exporter[0].wrk
        print(f"\nA. exporter /metrics: {GPUS} GPUs x {PROCESSES_PER_GPU} processes, {PODS} "
              f"pods, sampled every {exporter[0].sampler.interval_s:g} s; "
              f"wrk -t{w0.threads} -c{w0.connections} --timeout 5s")
        print(f"  {'variant':<22} {'series':>6} {'req/s':>6} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'max ms':>7} {'errors¹':>12} {'ovf²':>5} {'conns³':>8} {'missed':>6} "
              f"{'rounds':>7} {'lag s':>5} {'side ms':>7} {'CPU %':>5} {'RSS MiB':>7} {'load':>9}")
        for r in exporter:
            w, s = r.wrk, r.sampler
            print(f"  {r.variant:<22} {r.series:>6} {w.requests_per_s:>6.0f} "
                  f"{w.p50_ms:>7.1f} {w.p99_ms:>7.1f} {w.max_ms:>7.1f} {_errors(w):>12} "
                  f"{w.listen_overflows:>5} {_conns(w):>8} {s.missed_rounds:>6g} "
                  f"{s.rounds_from_timestamps:>3}/{s.rounds_expected:<3} "
                  f"{s.lag_max_s:>5.2f} {s.poll_max_ms:>7.0f} {r.process['cpu_percent']:>5.0f} "
                  f"{r.process['rss_peak_mib']:>7.1f} "
                  f"{w.loadavg[0]:>4.2f}/{w.loadavg[1]:<4.2f}")
        print("  rounds: seen/due from last_sample_timestamp; lag: oldest last sample at a "
              "scrape; side ms: slowest of those\n  scrapes (side thread, once a second, on "
              "a connection opened before wrk's); CPU: % of one core; RSS: peak")
        for r in exporter:
            if r.log_exceptions:
                print(f"  exporter log ({r.variant}): tracebacks "
                      + ", ".join(f"{k} x{v}" for k, v in r.log_exceptions.items()))
    if dashboard:
        w0 = dashboard[0].wrk
        print(f"\nB. dashboard main page: wrk -t{w0.threads} -c{w0.connections} "
              f"(concurrent users) --timeout 5s")
        print(f"  {'mode':<22} {'request':<14} {'KiB':>5} {'req/s':>7} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'max ms':>8} {'errors¹':>12} {'ovf²':>5} {'conns³':>8} "
              f"{'dash CPU %':>10} {'prom CPU %':>10} {'RSS MiB':>8} {'load':>9}")
        for d in dashboard:
            w = d.wrk
            label = f"{d.mode} ({d.nodes} nodes)"
            prom = d.processes.get("prometheus", {}).get("cpu_percent")
            print(f"  {label:<22} {d.target:<14} {d.response_bytes / 1024:>5.0f} "
                  f"{w.requests_per_s:>7.1f} {w.p50_ms:>8.1f} {w.p99_ms:>8.1f} "
                  f"{w.max_ms:>8.1f} {_errors(w):>12} {w.listen_overflows:>5} {_conns(w):>8} "
                  f"{d.processes['dashboard']['cpu_percent']:>10.1f} "
                  f"{'-' if prom is None else f'{prom:.1f}':>10} "
                  f"{d.processes['dashboard']['rss_peak_mib']:>8.1f} "
                  f"{w.loadavg[0]:>4.2f}/{w.loadavg[1]:<4.2f}")
        for d in dashboard:
            if d.target.startswith("POST"):
                print(f"  {d.mode} page: {d.fleet}")
        for d in dashboard:
            if d.log_exceptions:
                print(f"  dashboard log ({d.mode}): tracebacks "
                      + ", ".join(f"{k} x{v}" for k, v in d.log_exceptions.items()))
        for d in dashboard:
            if d.profile is not None:
                print(f"\n  profile of {d.mode} {d.target} ({d.profile.samples} samples, "
                      f"{d.profile.path}); on the stack / own:")
                for frame, share in d.profile.top_inclusive:
                    print(f"    {share:>6.1%}  {frame}")
                print("    own:")
                for frame, share in d.profile.top_self[:8]:
                    print(f"    {share:>6.1%}  {frame}")
    print("\n  ¹ connect/read/write/timeout/non-2xx/unexpected body, as wrk counts them "
          "(timeout: connections found\n"
          "    waiting over --timeout, or still connecting, at its 2-s checks)\n"
          "  ² listen-queue overflows (system-wide TcpExtListenOverflows during the run)\n"
          "  ³ wrk's connections established at the server (kernel's view, /proc/net/tcp): all, "
          "and after how\n    long, or the most seen\n"
          f"  load: 1-min load average at start/end of the run ({os.cpu_count()} CPUs)")
    if problems:
        print("\nFAILED:")
        for p in problems:
            print(f"  - {p}")
    else:
        print("\nOK: no errors, no missed sampling round, dashboard p99 within the limit")


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/load.py",
        description="Load test: the exporter's /metrics under 100 connections, the dashboard's "
                    "main page under 10 users (wrk). Exit 1 on any error, missed sampling "
                    "round or dashboard p99 over the limit.")
    p.add_argument("--duration", type=float, help="seconds per wrk run (default 60; --quick 10)")
    p.add_argument("--quick", action="store_true",
                   help="short runs for development: 10 s each, a 20-node Prometheus fleet")
    p.add_argument("--only", choices=("exporter", "dashboard"), help="run one part only")
    p.add_argument("--modes", default="embedded,prometheus",
                   help="dashboard modes, comma-separated (default embedded,prometheus)")
    p.add_argument("--nodes", type=int, help="Prometheus-mode fleet size, 8 GPUs each "
                   "(default 50; --quick 20)")
    p.add_argument("--process-metrics", action="store_true",
                   help="also run the exporter with --process-metrics (768 more series)")
    p.add_argument("--interval", type=float, default=1.0, help="exporter sampling interval")
    p.add_argument("--exporter-connections", type=int, default=100)
    p.add_argument("--dashboard-users", type=int, default=10)
    p.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    p.add_argument("--timeout", type=float, default=5.0, help="wrk request timeout, s")
    p.add_argument("--p99-limit", type=float, default=2.0,
                   help="dashboard p99 limit in seconds (default 2)")
    p.add_argument("--profile", action="store_true",
                   help="py-spy profile every dashboard target (default: only one over the "
                        "limit)")
    p.add_argument("--profile-dir", help="keep py-spy recordings here (default: discarded)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to PATH")
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = 10.0 if args.quick else 60.0
    if args.nodes is None:
        args.nodes = 20 if args.quick else 50
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(args.modes) <= {"embedded", "prometheus"}:
        p.error("--modes: embedded, prometheus")
    if args.duration < 1 or args.nodes < 1:
        p.error("--duration and --nodes must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which(WRK) is None:
        print("load.py: wrk not found (apt-get install wrk)", file=sys.stderr)
        return 2
    exporter: list[ExporterRun] = []
    dashboard: list[DashboardRun] = []
    problems: list[str] = []
    began = time.time()
    with eb.sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="gpuscope-load-") as tmp:
        try:
            if args.only in (None, "exporter"):
                variants = ["default", "gzip"]
                if args.process_metrics:
                    variants += ["process-metrics", "process-metrics gzip"]
                for variant in variants:
                    print(f"exporter, {variant}: {args.duration:g} s of wrk "
                          f"(load {os.getloadavg()[0]:.2f})", flush=True)
                    workdir = Path(tmp) / f"exporter-{variant.replace(' ', '-')}"
                    workdir.mkdir()
                    run = exporter_run(args, variant, workdir)
                    exporter.append(run)
                    problems += [f"exporter {variant}: {p}" for p in run.problems]
            if args.only in (None, "dashboard"):
                for mode in args.modes:
                    print(f"dashboard, {mode}: 2 x {args.duration:g} s of wrk "
                          f"(load {os.getloadavg()[0]:.2f})", flush=True)
                    workdir = Path(tmp) / f"dashboard-{mode}"
                    workdir.mkdir()
                    for d in dashboard_runs(args, mode, workdir):
                        dashboard.append(d)
                        problems += [f"dashboard {mode} {d.target}: {p}" for p in d.problems]
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            problems.append(f"aborted: {exc}")
    print_report(exporter, dashboard, problems)
    if args.json:
        out = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(began)),
            "duration_s": args.duration,
            "exporter": [asdict(r) for r in exporter],
            "dashboard": [asdict(d) for d in dashboard],
            "problems": problems,
            "ok": not problems,
            "machine": eb.machine_info(),
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

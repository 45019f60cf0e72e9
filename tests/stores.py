"""Real Prometheus-compatible stores for tests and benchmarks: Debian's ``prometheus`` and
``victoria-metrics``, each started as its own process on a free loopback port with its own
data folder, loaded with a fleet's samples, and stopped (and its folder removed) on exit.

    with start_prometheus(blocks) as prom:            # TSDB blocks from promtool
        PrometheusData(prom.url, clock=lambda: end).fleet(3600)
    with start_victoriametrics() as vm:
        vm.import_lines(fleet.vm_json_lines(...))     # /api/v1/import, then a flush
        vm.wait_for_series(expected)

Both are started as a user would start them, with defaults for everything that shapes a
query's answer, except what a test or a benchmark on stored data needs:

- Prometheus: ``--storage.tsdb.retention.time=100y`` (backfilled samples are hours old and
  a data set is kept for days: the default 15 d retention would delete it);
  ``--query.lookback-delta`` is Prometheus' default (5 m) unless given.
- VictoriaMetrics: ``-retentionPeriod=100y`` (same reason). Its response cache stays on
  (``cache=True``), as users run it: it changes answers, not only speed. With the cache on,
  ``/api/v1/query_range`` aligns start and end to multiples of the step
  (``promql.AdjustStartEnd``), so for an end that is not a multiple of the step the last
  point is up to a step earlier than on Prometheus (issue 16's "2 busy / 0 idle" came from
  that). ``cache=False`` adds ``-search.disableCache``. ``-search.latencyOffset`` stays at
  its default (30 s: an instant query within 30 s of now is evaluated at now - 30 s): the
  data sets end minutes before the query time, so it changes nothing there, and live
  scraping must be read the way users' stores answer.

Blocks and VictoriaMetrics data folders are hard-link copied into a temporary folder before
the store opens them (``copy=True``): both stores only ever add and remove files, never
rewrite one, so a kept data set (``/work/fleet5000``) is never changed and several stores
can serve it at once.

The ``gpuscope-dashboard`` recording rules are recorded over stored data as the stores' own
tools do it, one dependency level at a time: :func:`backfill_rules` (promtool, into blocks)
and :func:`replay_rules` (vmalert, into a running VictoriaMetrics); a tool that fails
raises :class:`StoreError` with its own last lines.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.dashboard.data.recorded import RULE_R
from gpuscope.dashboard.plan.rules import RULE_INTERVAL, recording_rules
from tests.ports import free_port

PROMETHEUS = "prometheus"
VICTORIA_METRICS = "victoria-metrics"


class StoreError(RuntimeError):
    """A store did not start, did not load its data, or answered with an error."""


def binary(name: str) -> str:
    """The path of a Debian store binary; ``StoreError`` naming the package when missing
    (``scripts/setup --test`` installs both)."""
    path = shutil.which(name)
    if path is None:
        package = {"promtool": "prometheus", "vmalert": VICTORIA_METRICS,
                   "vmagent": VICTORIA_METRICS}.get(name, name)
        raise StoreError(f"{name} not found: apt-get install {package} (scripts/setup --test)")
    return path


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of a process in KiB: ``VmRSS`` of ``/proc/<pid>/status``, or its
    peak so far with ``field="VmHWM"``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise StoreError(f"no {field} for pid {pid}")


def self_metrics(url: str) -> dict[str, float]:
    """A Go program's own ``/metrics`` page (Prometheus', VictoriaMetrics', vmagent's), its
    samples summed by sample name (prometheus_client's parser)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def proc_stat(pid: int) -> tuple[str, list[str]]:
    """A process's command name and the fields of ``/proc/<pid>/stat`` after it (the
    state, the parent's pid, ...); OSError where the process is gone."""
    # The command name (field 2) may hold spaces and parentheses: it runs to the last ")".
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.find("(") + 1:text.rfind(")")], text[text.rfind(")") + 1:].split()


def stat_cpu_seconds(fields: list[str]) -> float:
    """User and system CPU time of a process's :func:`proc_stat` fields, in seconds."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far, in seconds (``/proc/<pid>/stat``)."""
    return stat_cpu_seconds(proc_stat(pid)[1])


class GoCounters(NamedTuple):
    """A Go program's own counters: garbage collections completed
    (``go_gc_duration_seconds_count``) and heap bytes allocated
    (``go_memstats_alloc_bytes_total``), each None where its ``/metrics`` lacks it."""

    collections: int | None
    allocated_bytes: float | None


def clone_tree(src: Path, dst: Path) -> None:
    """``dst`` as a copy of ``src`` made of hard links (``cp -al``): instant, no extra disk."""
    subprocess.run(["cp", "-al", str(src), str(dst)], check=True)


@dataclass
class Store:
    """One running store: ``kind`` is ``prometheus`` or ``victoriametrics``."""

    kind: str
    url: str
    proc: subprocess.Popen[bytes]
    data: Path
    log: Path
    started_s: float = 0.0  # seconds from the process start until it answered ready
    extra: dict[str, Any] = field(default_factory=dict)

    # -- reading -------------------------------------------------------------------------
    def get(self, path: str, params: dict[str, str] | None = None, timeout: float = 60.0
            ) -> Any:
        """GET ``path`` (with ``params``) and the decoded JSON answer's ``data``."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise StoreError(f"{self.kind} {path}: HTTP {exc.code} "
                             f"{exc.read()[:500].decode(errors='replace')}") from None
        if body.get("status") != "success":
            raise StoreError(f"{self.kind} {path}: {body}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (``metric``, ``value`` per series)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.get("/api/v1/query", params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def scalar(self, promql: str, at: float | None = None) -> float | None:
        """The one value of an instant query that returns at most one series."""
        result = self.query(promql, at)
        return float(result[0]["value"][1]) if result else None

    def series_count(self, at: float, lookback: str = "1h") -> int:
        """How many series the store holds: on VictoriaMetrics ``/api/v1/series/count`` (a
        PromQL count over every series would exceed its ``-search.maxUniqueTimeseries``,
        300,000, at 5,000 nodes), on Prometheus those with a sample in ``lookback`` before
        ``at``."""
        if self.kind == "victoriametrics":
            data = self.get("/api/v1/series/count")
            return int(data[0])
        n = self.scalar(f'count(last_over_time({{__name__=~".+"}}[{lookback}]))', at)
        return int(n or 0)

    def rss_kib(self) -> int:
        return rss_kib(self.proc.pid)

    # -- writing -------------------------------------------------------------------------
    def delete_before(self, selector: str, before: float) -> None:
        """Removes the samples of ``selector``'s series at and before ``before`` (seconds
        since the epoch), as if they had begun after it: Prometheus deletes a range of time
        (its admin API's tombstones); VictoriaMetrics deletes whole series, so they are
        exported, deleted and their later samples imported again (then made searchable,
        and its response cache emptied)."""
        match = urllib.parse.urlencode({"match[]": selector})
        delete = f"{self.url}/api/v1/admin/tsdb/delete_series?{match}"
        if self.kind == "prometheus":
            request = urllib.request.Request(
                f"{delete}&{urllib.parse.urlencode({'start': '0', 'end': f'{before:.3f}'})}",
                method="POST")
            with urllib.request.urlopen(request, timeout=600) as answer:
                if answer.status != 204:
                    raise StoreError(f"prometheus delete_series: HTTP {answer.status}")
            return
        self.rewrite(selector, lambda v, t: v if t > before else None)

    def delete_after(self, selector: str, after: float) -> None:
        """Removes the samples of ``selector``'s series after ``after`` (seconds since the
        epoch), as if they had not been written yet: Prometheus' tombstones over
        ``(after, +1 day]``, VictoriaMetrics' series rewritten (:meth:`rewrite`)."""
        if self.kind == "prometheus":
            match = urllib.parse.urlencode({"match[]": selector, "start": f"{after + 0.001:.3f}",
                                            "end": f"{after + 86_400:.3f}"})
            request = urllib.request.Request(
                f"{self.url}/api/v1/admin/tsdb/delete_series?{match}", method="POST")
            with urllib.request.urlopen(request, timeout=600) as answer:
                if answer.status != 204:
                    raise StoreError(f"prometheus delete_series: HTTP {answer.status}")
            return
        self.rewrite(selector, lambda v, t: v if t <= after else None)

    def rewrite(self, selector: str, change: Callable[[float, float], float | None]) -> int:
        """VictoriaMetrics: every sample (value, seconds since the epoch) of ``selector``'s
        series becomes ``change(value, t)`` (None: dropped): the series exported, deleted
        and imported again, then made searchable (:meth:`refresh`). Returns how many series
        ``selector`` found."""
        series = self.export(selector)
        match = urllib.parse.urlencode({"match[]": selector})
        with urllib.request.urlopen(
                f"{self.url}/api/v1/admin/tsdb/delete_series?{match}", timeout=600):
            pass
        kept = []
        for s in series:
            pairs = [(change(v, t / 1000), t)
                     for v, t in zip(s["values"], s["timestamps"], strict=True)]
            pairs = [(v, t) for v, t in pairs if v is not None]
            if pairs:
                kept.append({"metric": s["metric"], "values": [v for v, _ in pairs],
                             "timestamps": [t for _, t in pairs]})
        self.import_series(kept)
        self.refresh()
        return len(series)

    def export(self, selector: str) -> list[dict[str, Any]]:
        """VictoriaMetrics' ``/api/v1/export`` of ``selector``: per series ``metric``,
        ``values`` and ``timestamps`` (ms)."""
        match = urllib.parse.urlencode({"match[]": selector})
        with urllib.request.urlopen(f"{self.url}/api/v1/export?{match}", timeout=600) as r:
            return [json.loads(line) for line in r.read().splitlines() if line]

    def import_series(self, series: Iterable[Mapping[str, Any]]) -> int:
        """:meth:`import_lines` of series as :meth:`export` gives them; call
        :meth:`refresh` after."""
        return self.import_lines(json.dumps(s).encode() + b"\n" for s in series)

    def refresh(self) -> None:
        """VictoriaMetrics: what was imported made searchable (:meth:`flush`) and its
        response cache emptied (it keeps the parts a query shares with an earlier one)."""
        self.flush()
        with urllib.request.urlopen(self.url + "/internal/resetRollupResultCache", timeout=60):
            pass

    def cpu_seconds(self) -> float:
        """The store's CPU time so far (user and system), in seconds."""
        return cpu_seconds(self.proc.pid)

    def go_counters(self) -> GoCounters:
        """The store's (a Go program's) garbage collections completed and bytes allocated so
        far, from its ``/metrics``."""
        m = self_metrics(self.url)
        n = m.get("go_gc_duration_seconds_count")
        return GoCounters(None if n is None else int(n), m.get("go_memstats_alloc_bytes_total"))

    def peak_rss_kib(self) -> int:
        """The highest resident set size since the store started (``VmHWM``), in KiB."""
        return rss_kib(self.proc.pid, "VmHWM")

    def disk_bytes(self) -> int:
        """Bytes the data folder takes (hard links to a kept data set count in full)."""
        return sum(p.stat().st_size for p in self.data.rglob("*") if p.is_file())

    # -- loading (VictoriaMetrics) --------------------------------------------------------
    def import_lines(self, chunks: Iterable[bytes], fmt: str = "json",
                     chunk_bytes: int = 8 << 20) -> int:
        """Streams samples into VictoriaMetrics: ``fmt="json"`` is ``/api/v1/import`` (one
        JSON object per series: ``metric``, ``values``, ``timestamps`` in ms),
        ``fmt="prometheus"`` is ``/api/v1/import/prometheus`` (text exposition format, each
        sample with its timestamp in ms). The chunks are sent in POSTs of about
        ``chunk_bytes`` each (whole lines), so nothing is held in memory. Returns bytes sent.
        Call :meth:`flush` after."""
        if self.kind != "victoriametrics":
            raise StoreError("import_lines is for VictoriaMetrics; Prometheus loads blocks")
        path = {"json": "/api/v1/import", "prometheus": "/api/v1/import/prometheus"}[fmt]
        sent = 0
        buf: list[bytes] = []
        size = 0

        def post() -> None:
            nonlocal sent, size
            body = b"".join(buf)
            req = urllib.request.Request(self.url + path, data=body, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    r.read()
            except urllib.error.HTTPError as exc:
                raise StoreError(f"victoriametrics import: HTTP {exc.code} "
                                 f"{exc.read()[:500].decode(errors='replace')}") from None
            sent += len(body)
            buf.clear()
            size = 0

        for chunk in chunks:
            buf.append(chunk)
            size += len(chunk)
            if size >= chunk_bytes:
                post()
        if buf:
            post()
        return sent

    def flush(self) -> None:
        """Makes imported samples searchable now (VictoriaMetrics buffers them for up to a
        second or so; ``/internal/force_flush`` writes them out)."""
        if self.kind == "victoriametrics":
            with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=120) as r:
                r.read()

    def wait_for_series(self, expected: int, at: float, timeout: float = 300.0) -> None:
        """Waits until a query at ``at`` sees ``expected`` series (the import is searchable
        and complete); ``StoreError`` with what it saw otherwise."""
        deadline = time.monotonic() + timeout
        seen = -1
        while True:
            self.flush()
            seen = self.series_count(at)
            if seen == expected:
                return
            if seen > expected:
                raise StoreError(f"{self.kind} holds {seen} series, expected {expected}")
            if time.monotonic() > deadline:
                raise StoreError(f"{self.kind} sees {seen} series after {timeout:.0f}s, "
                                 f"expected {expected}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait_ready(store: Store, path: str, timeout: float) -> None:
    began = time.monotonic()
    while True:
        if store.proc.poll() is not None:
            tail = store.log.read_text(errors="replace")[-2000:]
            raise StoreError(f"{store.kind} exited {store.proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(store.url + path, timeout=2) as r:
                if r.status == 200:
                    store.started_s = time.monotonic() - began
                    return
        except OSError:
            pass
        if time.monotonic() - began > timeout:
            store.stop()
            raise StoreError(f"{store.kind} not ready after {timeout:.0f}s (log: {store.log})")
        time.sleep(0.1)


# -- the gpuscope-dashboard recording rules over stored data ---------------------------------


def _tail(log: str) -> str:
    """A tool's output, cut to its last lines on one line (for an error)."""
    return " | ".join(log.strip().splitlines()[-5:])[-1500:]


def reads_itself(record: str, expr: str) -> bool:
    """Whether a rule reads its own past (the verdicts' runs, ``dashboard/verdicts/runs.py``):
    a backfill that evaluates a rule over a range in one query cannot make it; it is made
    minute by minute (:func:`record_runs`)."""
    return record in expr


def after_runs() -> set[str]:
    """The rules a range backfill cannot make: those that read their own past
    (:func:`reads_itself`) and those that read them (made after them, minute by minute)."""
    out: set[str] = set()
    for record, expr in recording_rules():  # (in the group's order: a rule reads earlier ones)
        if reads_itself(record, expr) or any(name in expr for name in out):
            out.add(record)
    return out


def rule_levels(runs: bool = False) -> list[list[tuple[str, str]]]:
    """The recording rules by dependency level: promtool backfills a rule from the data a
    running Prometheus holds, so a rule that reads another waits for that one's blocks.
    ``runs``: only the rules :func:`after_runs` names, else only the others."""
    later = after_runs()
    rules = [(r, e) for r, e in recording_rules() if (r in later) == runs]
    names = {r for r, _ in rules}
    level: dict[str, int] = {}
    for record, expr in rules:
        level[record] = 1 + max((level[n] for n in names if n != record and n in expr),
                                default=-1)
    return [[(r, e) for r, e in rules if level[r] == lv]
            for lv in range(max(level.values()) + 1)]


#: Prometheus' query timeout while promtool backfills the rules (its default: 2 min).
BACKFILL_QUERY_TIMEOUT = "15m"


def backfill_rules(blocks: Path, start: float, end: float, work: Path,
                   only: Collection[str] | None = None) -> None:
    """The gpuscope-dashboard rules (``only`` those named, where given) over ``[start,
    end]``, written into ``blocks``, level by level, every level evaluated at the same
    times, as one group is: promtool, as Prometheus, offsets a group's evaluations within
    its interval by a hash of its name and file, so every level is written as the same
    group in the same file (levels with offsets of their own would read each other a
    minute late), named relative to ``work`` (the offset is then the same in every run)."""
    promtool = binary("promtool")
    start = (int(start) // int(RULE_INTERVAL) + 1) * int(RULE_INTERVAL)
    rules = work / "gpuscope-dashboard.yaml"
    for i, level in enumerate(rule_levels()):
        level = [(r, e) for r, e in level if only is None or r in only]
        if not level:
            continue
        rules.write_text(yaml.safe_dump({"groups": [{
            "name": "gpuscope-dashboard", "interval": "1m",
            "rules": [{"record": r, "expr": e} for r, e in level]}]}, width=1 << 20))
        out = work / f"blocks{i}"
        # promtool asks each rule's whole range in one query: at 5,000 nodes on a busy
        # 2-core machine the allocated-idle rule's took longer than Prometheus' default 2 min
        # (a 503 that failed the backfill); a batch has no page waiting on it.
        with start_prometheus(blocks, copy=False,
                              extra_args=[f"--query.timeout={BACKFILL_QUERY_TIMEOUT}"]) as prom:
            run = subprocess.run([promtool, "tsdb", "create-blocks-from", "rules",
                                  f"--start={start}", f"--end={int(end)}", f"--url={prom.url}",
                                  "--eval-interval=1m", f"--output-dir={out}", rules.name],
                                 capture_output=True, text=True, timeout=3600, cwd=work)
        if run.returncode != 0:
            raise StoreError(f"promtool create-blocks-from rules (level {i}) exited "
                             f"{run.returncode}: {_tail(run.stdout + run.stderr)}")
        for block in out.iterdir():
            shutil.move(str(block), blocks / block.name)


#: The most minutes one vmalert replay run evaluates (its default
#: ``-replay.maxDatapointsPerQuery``): a rule's samples over them go in one write, which
#: VictoriaMetrics takes within vmalert's 30-second write timeout at 5,000 nodes (a day's
#: did not).
REPLAY_POINTS = 1000


def replay_chunks(start: float, end: float, points: int = REPLAY_POINTS,
                  interval: float = 60.0) -> list[tuple[float, float]]:
    """``[start, end]`` as consecutive replay ranges of at most ``points`` evaluations
    ``interval`` seconds apart, each range's first and last evaluation included and no
    evaluation in two ranges (vmalert's own chunks share their boundary)."""
    out: list[tuple[float, float]] = []
    first = start
    while first <= end:
        last = min(end, first + (points - 1) * interval)
        out.append((first, last))
        first = last + interval
    return out


def replay_rules(vm: Store, start: float, end: float, work: Path,
                 points: int = REPLAY_POINTS) -> None:
    """The gpuscope-dashboard rules over ``[start, end]`` evaluated by vmalert's replay mode
    (Debian's, from the victoria-metrics package) on ``vm`` and written back to it, as a
    VictoriaMetrics user backfills them, one dependency level per run (each run flushes what
    it wrote when it exits; VictoriaMetrics' ``/internal/force_flush`` makes it searchable
    before the next level reads it). ``-datasource.queryStep=0``: each rule's range query
    steps by the group's interval (vmalert's default step, 5 m, would record one sample in
    five minutes). A rule's whole window goes in one write: at 5,000 nodes larger than
    VictoriaMetrics takes by default (``-maxInsertRequestSize``, 32 MB), which vmalert logs,
    drops and exits 0 after (so its log is read). A window longer than ``points``
    (:data:`REPLAY_POINTS`) minutes is replayed in runs over :func:`replay_chunks` (vmalert's
    own chunks, ``-replay.maxDatapointsPerQuery``, share their boundary minute, which it
    then records twice: the run summaries do not trust a minute recorded twice)."""
    vmalert = binary("vmalert")

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    rules = work / "gpuscope-dashboard-vm.yaml"
    for level in rule_levels():
        rules.write_text(yaml.safe_dump({"groups": [{
            "name": "gpuscope-dashboard", "interval": "1m",
            "rules": [{"record": r, "expr": e} for r, e in level]}]}, width=1 << 20))
        for first, last in replay_chunks(start, end, points):
            run = subprocess.run(
                [vmalert, f"-rule={rules}", f"-datasource.url={vm.url}",
                 f"-remoteWrite.url={vm.url}", f"-replay.timeFrom={stamp(first)}",
                 f"-replay.timeTo={stamp(last)}", "-datasource.queryStep=0",
                 f"-replay.maxDatapointsPerQuery={points}",
                 "-replay.rulesDelay=0", "-replay.disableProgressBar",
                 f"-httpListenAddr=127.0.0.1:{free_port()}", "-loggerLevel=WARN"],
                capture_output=True, text=True, timeout=1800, cwd=work)
            # vmalert exits 0 after dropping what the store refused ("all 5 attempts to
            # send request failed - dropping ..."): its log says so (a retry that then
            # succeeds loses nothing).
            log = run.stdout + run.stderr
            if run.returncode != 0 or "dropping" in log:
                raise StoreError(f"vmalert's replay exited {run.returncode}"
                                 f"{' and dropped samples' if 'dropping' in log else ''}: "
                                 f"{_tail(log)}")
        # What this level wrote made searchable; and the response cache emptied
        # (VictoriaMetrics empties it itself when samples older than 5 minutes arrive, and
        # says so in its log: made sure).
        vm.refresh()


def record_runs(vm: Store, start: float, end: float) -> None:
    """The rules that read their own past and what reads them (:func:`after_runs`: the
    verdicts' runs) made on ``vm`` as a live rule evaluation makes them: at each of the
    rules' minutes in
    ``[start, end]`` (the interval's multiples, as vmalert's replay evaluates the others),
    each rule by an instant query, its answer imported before any rule after it in the
    group that reads it (the next dependency level) and before the next minute. After
    :func:`replay_rules`, which makes the flags they follow."""
    levels = rule_levels(runs=True)
    t = -(-start // RULE_INTERVAL) * RULE_INTERVAL
    while t <= end + 1e-6:
        # A level's answers in one import: no rule reads another of its level
        # (:func:`rule_levels`), only its own past and the levels before, made searchable
        # before the next level reads them. (One import and flush per rule cost 25 flushes a
        # minute where the levels need 3: a quarter of this function's time.)
        for level in levels:
            if vm.import_series([{"metric": {**row["metric"], "__name__": record},
                                  "values": [float(row["value"][1])],
                                  "timestamps": [round(t * 1000)]}
                                 for record, expr in level for row in vm.query(expr, t)]):
                vm.refresh()  # (searchable, and no cached answer left from before it)
        t += RULE_INTERVAL


def record_runs_in_blocks(blocks: Path, start: float, end: float, work: Path) -> None:
    """:func:`record_runs` for a Prometheus from ``blocks`` (after :func:`backfill_rules`,
    which cannot make them): the recorded series the run rules read, as the Prometheus
    serves them at each of the rules' minutes (``last_over_time(…[1m])``), copied into a
    scratch VictoriaMetrics, which records the runs minute by minute; its records are then
    written into ``blocks`` by ``promtool tsdb create-blocks-from openmetrics``. The
    records are VictoriaMetrics' evaluation of the rules (``promtool test rules`` checks
    Prometheus' own on drawn flags: tests/dashboard/verdicts/test_recorded_runs.py)."""
    rules = [rule for level in rule_levels(runs=True) for rule in level]
    own = {record for record, _ in rules}
    inputs = sorted({name for name, _ in recording_rules() if name not in own
                     and any(name in expr for _, expr in rules)})
    first = -(-start // RULE_INTERVAL) * RULE_INTERVAL
    with start_prometheus(blocks, copy=False) as prom, start_victoriametrics() as vm:
        for name in inputs:
            data = prom.get("/api/v1/query_range", {
                "query": f"last_over_time({name}[{RULE_R}])",
                "start": f"{first:.3f}", "end": f"{end:.3f}", "step": f"{RULE_INTERVAL:g}"},
                timeout=600)
            vm.import_series({"metric": {**r["metric"], "__name__": name},
                              "values": [float(v) for _, v in r["values"]],
                              "timestamps": [round(float(t) * 1000) for t, _ in r["values"]]}
                             for r in data["result"])
        vm.refresh()
        record_runs(vm, start, end)
        exported = vm.export('{__name__=~"' + "|".join(sorted(own)) + '"}')
    text = work / "runs.om"
    with text.open("w") as out:
        for line in exported:
            labels = dict(line["metric"])
            name = labels.pop("__name__")
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            for v, t in zip(line["values"], line["timestamps"], strict=True):
                out.write(f"{name}{{{body}}} {v!r} {t / 1000:.3f}\n")
        out.write("# EOF\n")
    made = work / "runs-blocks"
    promtool_blocks(text, made)
    for block in made.iterdir():
        shutil.move(str(block), blocks / block.name)


def _escape(value: str) -> str:
    """A label value as the OpenMetrics text format writes it."""
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


@contextmanager
def _workdir(prefix: str) -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _serve(kind: str, args: Sequence[str], port: int, data: Path, log: Path, ready: str,
           timeout: float, env: Mapping[str, str] | None = None) -> Iterator[Store]:
    """Run a store's ``args`` (listening on ``port``, with ``env`` over this process'
    environment) with its output in ``log`` until ``ready`` answers; stopped on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, **env} if env else None)
    store = Store(kind, f"http://127.0.0.1:{port}", proc, data, log)
    try:
        _wait_ready(store, ready, timeout)
        yield store
    finally:
        store.stop()


@contextmanager
def start_prometheus(
    blocks: Path | None = None,
    *,
    copy: bool = True,
    lookback_delta: str | None = None,
    scrape_config: str | None = None,
    extra_args: Iterable[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[Store]:
    """A Prometheus serving ``blocks`` (a folder of TSDB blocks, e.g. from
    :func:`bench.fleet.build_blocks`; hard-link copied unless ``copy=False``, then opened in
    place) or an empty TSDB, scraping ``scrape_config`` (the text of the ``scrape_configs``
    list's YAML, e.g. for live exporters) if given. Stopped and removed on exit."""
    exe = binary(PROMETHEUS)
    with _workdir("gpuscope-prom-") as work:
        tsdb = work / "tsdb"
        if blocks is not None and copy:
            clone_tree(blocks, tsdb)
        elif blocks is not None:
            tsdb = blocks
        config = work / "prometheus.yml"
        config.write_text("global: {scrape_interval: 15s, evaluation_interval: 15s}\n"
                          f"scrape_configs:\n{scrape_config or '  []'}\n")
        port = free_port()
        args = [exe, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                "--storage.tsdb.retention.time=100y", f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-admin-api", "--log.level=warn"]
        if lookback_delta is not None:
            args.append(f"--query.lookback-delta={lookback_delta}")
        args += list(extra_args)
        with _serve("prometheus", args, port, tsdb, work / "prometheus.log", "/-/ready",
                    timeout, env) as store:
            yield store


@contextmanager
def start_victoriametrics(
    data: Path | None = None,
    *,
    copy: bool = True,
    cache: bool = True,
    scrape_config: str | None = None,
    scrape_interval: str = "15s",
    extra_args: Iterable[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[Store]:
    """A single-node VictoriaMetrics on ``data`` (a ``-storageDataPath`` kept from an earlier
    import: hard-link copied unless ``copy=False``) or on an empty folder, with its response
    cache on unless ``cache=False`` (see the module's docstring), scraping ``scrape_config`` (the
    ``scrape_configs`` list's YAML) if given. Stopped and removed on exit."""
    exe = binary(VICTORIA_METRICS)
    with _workdir("gpuscope-vm-") as work:
        path = work / "vmdata"
        if data is not None and copy:
            clone_tree(data, path)
        elif data is not None:
            path = data
        port = free_port()
        args = [exe, f"-storageDataPath={path}", "-retentionPeriod=100y",
                f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"]
        if not cache:
            args.append("-search.disableCache")
        if scrape_config is not None:
            config = work / "scrape.yml"
            config.write_text(f"global: {{scrape_interval: {scrape_interval}}}\n"
                              f"scrape_configs:\n{scrape_config}\n")
            args.append(f"-promscrape.config={config}")
        args += list(extra_args)
        with _serve("victoriametrics", args, port, path, work / "victoria-metrics.log",
                    "/health", timeout, env) as store:
            yield store


@contextmanager
def start_vmagent(remote_write: str, *, timeout: float = 60.0) -> Iterator[Store]:
    """``vmagent`` (Debian's ``victoria-metrics`` package) remote-writing what it is sent
    (``/api/v1/import`` and the other ingestion APIs) to ``remote_write`` through one queue,
    so each series' samples arrive in the order they were sent; its queue in a temporary
    folder. Stopped and removed on exit."""
    exe = binary("vmagent")
    with _workdir("gpuscope-vmagent-") as work:
        port = free_port()
        args = [exe, f"-remoteWrite.url={remote_write}", "-remoteWrite.queues=1",
                f"-httpListenAddr=127.0.0.1:{port}",
                f"-remoteWrite.tmpDataPath={work / 'queue'}", "-loggerLevel=WARN"]
        with _serve("vmagent", args, port, work, work / "vmagent.log", "/health",
                    timeout) as store:
            yield store

def promtool_blocks(openmetrics: Path, out: Path) -> float:
    """``promtool tsdb create-blocks-from openmetrics FILE OUT``; returns the seconds it took.
    The samples must be in the past (promtool writes 2 h blocks; Prometheus keeps them with
    :func:`start_prometheus`' retention)."""
    exe = binary("promtool")
    began = time.perf_counter()
    run = subprocess.run([exe, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics),
                          str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if run.returncode != 0:
        raise StoreError(f"promtool create-blocks-from failed: "
                         f"{run.stderr.decode(errors='replace')[-2000:]}")
    return time.perf_counter() - began


@contextmanager
def fleet_in_both(fleet: Any, workdir: Path) -> Iterator[tuple[Store, Store]]:
    """A Prometheus and a VictoriaMetrics holding the same samples of ``fleet`` (a
    ``bench.fleet.Fleet``: blocks through promtool in ``workdir``, and ``/api/v1/import``),
    both searchable; stopped on exit. Query them at ``fleet.shape.end``."""
    from bench.fleet import build_blocks, import_victoriametrics

    blocks = workdir / "tsdb"
    build_blocks(fleet, blocks)
    with start_prometheus(blocks, copy=False) as prom, start_victoriametrics() as vm:
        import_victoriametrics(fleet, vm)
        yield prom, vm


__all__ = ["Store", "StoreError", "binary", "clone_tree", "fleet_in_both", "free_port",
           "promtool_blocks", "rss_kib", "start_prometheus", "start_victoriametrics",
           "start_vmagent"]

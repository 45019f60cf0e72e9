"""The node and the in-process exporter of ``test_leak.py``, and its memory measurements.

The node is made and churned by ``bench/soak.py``'s own code (``bench.soak.Node``, imported,
not copied): a real grpcio PodResources server on a unix socket, a ``/proc`` tree in the
seven cgroup formats, ``FakeApi`` (list + watch, node GET) over HTTP through a kubeconfig,
and the FakeNvml double of libnvidia-ml, changed by the soak exporter's ``Driver``
(``bench/soak_exporter.py``). The soak writes its NVML commands to the exporter's stdin;
here they go straight to the ``Driver`` in this process. Per sampling round the churn and
faults are the soak's ten-times run (``bench/soak.py --churn-every 0.2 --pod-lifetime 0.6
4.0 --faults-every 6`` at ``--interval 0.1``), with rounds of one virtual second: a churn
step every 2 rounds, pods living 6-40 rounds, 30 % of new processes on a PID that just
ended (with a new start time), a process restart in 5 % of pods per step, host processes
coming and going, and a fault every 6 rounds, in the soak's turn (a GPU lost for 5 rounds,
XIDs, the watch ended, the kubelet restarting, XIDs, ``410 Gone``, the driver unloaded for
4). The time-slicing slots are 4 GPUs x 8 replicas instead of 8 x 4: the same 32 pods, half
the GPU series. The kubelet double also answers ``GetAllocatableResources()``.

The exporter is wired as ``exporter.cli.run()`` wires it (``parse_config`` flags,
``LiveInputs``, ``Attributor`` with the container cap, ``ProcessSeriesCap``, ``Sampler``,
``build_registry``) over ``NvmlSource`` and the real pynvml, without the timers of its
sampler and kubelet threads: a round passes one sampling interval of a virtual clock (the
exporter's wall and monotonic clocks, so NVML's retry backoff counts rounds), runs the
sampler's round (``run_once``: NVML, attribution, the process cap) and renders a scrape with
``prometheus_client.generate_latest`` (every ``TEXT_EVERY`` rounds also with
``generate_text``, the server's own renderer). The kubelet is asked every ``KUBELET_EVERY``
rounds (its production period of 10 intervals) in this thread, through the watcher's
``refresh_once``. The API server's watch and the XID events run on the exporter's own
threads, as in production; before each measurement the test waits (bounded) until the
watcher holds exactly the pods alive.

Everything the node does is seeded: a seed gives the same pods, processes, PIDs and faults.

Run alone for a longer look (figures printed, nothing asserted; ``--frames 8`` also shows
where the growth was allocated from, slowly)::

    .venv/bin/python -m tests.reliability.leak_node --rounds 600 --windows 5
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import linecache
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from bench import soak
from bench.soak_exporter import Driver, gpu_uuid
from bench.soak_exporter import build_node as build_fake_nvml
from gpuscope.exporter.cardinality import DroppedSeries, ProcessSeriesCap
from gpuscope.exporter.cli import build_registry
from gpuscope.exporter.config import parse_config
from gpuscope.exporter.kubernetes.apiserver import (
    MetadataDisabled,
    PodMetadataWatcher,
    load_config,
)
from gpuscope.exporter.kubernetes.attribution import Attributor, LiveInputs
from gpuscope.exporter.kubernetes.metadata import NodeInfo
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sinks.prometheus.exposition import generate_text
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.exporter.kubernetes.podresources import test_client as _podresources
from tests.exporter.sources.fake_nvml import restored_pynvml

INTERVAL_S = 1.0  # a round: one sampling interval of the virtual clock
KUBELET_EVERY = 10  # rounds between kubelet List() calls (production: every 10 s)
TEXT_EVERY = 10  # rounds between renderings with the server's generate_text too
GPUS, REPLICAS = 4, 8
CHURN_EVERY_S = 2.0
POD_LIFETIME_S = (6.0, 40.0)
FAULTS_EVERY_S = 6.0
T0 = 1_780_000_000.0


class VirtualClock:
    """The exporter's wall and monotonic time: both move only when a round passes, so
    NVML's retry backoff and the utilization windows are the same on every run."""

    def __init__(self) -> None:
        self.elapsed = 0.0

    def wall(self) -> float:
        return T0 + self.elapsed

    def monotonic(self) -> float:
        return 1_000.0 + self.elapsed


class _DriverPipe:
    """What ``soak.Node.send`` writes to (the soak exporter's stdin there): each line goes
    to ``bench/soak_exporter.py``'s ``Driver`` at once."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def write(self, data: bytes) -> int:
        for line in data.decode().splitlines():
            self._driver.apply(line)
        return len(data)

    def flush(self) -> None:
        pass


class LogCounter(logging.Handler):
    """Counts the exporter's ERROR (and worse) records by logger; keeps the first one."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.counts: Counter[str] = Counter()
        self.first_error: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.name} {record.levelname}"] += 1
        if self.first_error is None:
            self.first_error = f"{record.name}: {record.getMessage()}"


@contextlib.contextmanager
def quiet_logs() -> Iterator[LogCounter]:
    """The exporter logs only ERROR and worse (counted, not propagated), grpcio (the kubelet
    double) nothing, while a session runs.

    Why: pytest's log capture attaches its handlers to every logger, propagating or not, at
    each test phase, and keeps every record it gets until the test ends, with its arguments:
    the faults' warnings carry NVMLError objects, whose tracebacks hold the sampler's frames
    and so whole snapshots, NVML sessions and rendered scrapes (+1 MB in 700 rounds). The
    records not made, the exporter's code runs as ever (the XID log's rate limit too)."""
    counter = LogCounter()
    exporter, grpc_ = logging.getLogger("gpuscope"), logging.getLogger("grpc")
    saved = [(lg, lg.propagate, lg.level) for lg in (exporter, grpc_)]
    exporter.addHandler(counter)
    exporter.propagate = False
    exporter.setLevel(logging.ERROR)
    grpc_.setLevel(logging.CRITICAL + 1)
    try:
        yield counter
    finally:
        exporter.removeHandler(counter)
        for lg, propagate, level in saved:
            lg.propagate = propagate
            lg.setLevel(level)  # clears the loggers' cached levels too


class Kubelet(soak.Kubelet):
    """``bench/soak.py``'s kubelet, also answering ``GetAllocatableResources()`` as a kubelet
    since 1.21 does: every GPU advertised as ``replicas`` time-slicing replicas (the soak's
    answers UNIMPLEMENTED, and grpcio logs each such call with a traceback)."""

    def __init__(self, gpus: int, replicas: int) -> None:
        super().__init__()
        self._allocatable = _podresources.allocatable(*(
            _podresources.replicas("nvidia.com/gpu", gpu_uuid(g), replicas)
            for g in range(gpus)))

    def GetAllocatableResources(  # the generated servicer's method name
        self, request: Any, context: Any
    ) -> Any:
        return self._allocatable


def soak_args(seed: int, faults_every: float) -> argparse.Namespace:
    """``bench/soak.py``'s parser and defaults, with the settings of the module doc."""
    return soak.parse_args([
        "--seed", str(seed), "--gpus", str(GPUS), "--replicas", str(REPLICAS),
        "--churn-every", str(CHURN_EVERY_S), "--faults-every", str(faults_every),
        "--pod-lifetime", *(str(s) for s in POD_LIFETIME_S),
    ])


# ---------------------------------------------------------------------------------------------
# Measurements


@dataclass
class Measurement:
    """One look at this process's memory, after ``gc.collect()``."""

    round: int
    traced: int  # bytes tracemalloc holds (its own bookkeeping left out); 0 when not tracing
    snapshot: Path | None  # the tracemalloc snapshot, dumped
    objects: dict[str, int]  # gc.get_objects() by type name
    pods: int
    processes: int
    threads: list[str]  # this process's threads, by name
    fds: int  # open file descriptors (the PID resolver holds one per GPU process)
    api_connections: int  # open at the API server double


@dataclass
class Growth:
    """From one measurement to a later one."""

    rounds: int
    traced: int  # bytes
    lines: list[tracemalloc.StatisticDiff]  # compare_to(..., "lineno"), most growth first
    objects: list[tuple[str, int]]  # types by growth, most first
    objects_total: int

    def by_area(self) -> dict[str, int]:
        """Traced growth by where the line is: the exporter's code, the node's doubles and
        this test (tests/, bench/: "tests+bench"), installed packages, the standard library."""
        areas: Counter[str] = Counter()
        for s in self.lines:
            path = s.traceback[-1].filename
            if path.startswith(_EXPORTER) or "/gpuscope/exporter/" in path:
                area = "exporter"
            elif path.startswith(_HARNESS):
                area = "tests+bench"
            elif "site-packages" in path:
                area = "packages"
            else:
                area = "stdlib"
            areas[area] += s.size_diff
        return dict(areas)

    def describe(self, top: int = 8) -> str:
        areas = ", ".join(f"{a} {n:+,}" for a, n in sorted(self.by_area().items()))
        out = [f"over {self.rounds:,} rounds: traced {self.traced:+,} B ({areas}), GC-tracked "
               f"objects {self.objects_total:+,}"]
        if self.lines:
            out.append("  lines, most growth first:")
            out += [f"    {s.size_diff:+,} B {s.count_diff:+,} blocks  {s.traceback}"
                    for s in self.lines[:top]]
            out.append("  most shrinking: " + ", ".join(
                f"{s.size_diff:+,} B {s.traceback}" for s in self.lines[-3:]))
        out.append("  types: " + ", ".join(f"{name} {n:+,}" for name, n in self.objects[:top]))
        return "\n".join(out)


def growth(before: Measurement, after: Measurement) -> Growth:
    lines: list[tracemalloc.StatisticDiff] = []
    if before.snapshot is not None and after.snapshot is not None:
        old = tracemalloc.Snapshot.load(str(before.snapshot))
        new = tracemalloc.Snapshot.load(str(after.snapshot))
        lines = sorted(new.compare_to(old, "lineno"), key=lambda s: -s.size_diff)
    names = before.objects.keys() | after.objects.keys()
    diff = {n: after.objects.get(n, 0) - before.objects.get(n, 0) for n in names}
    return Growth(
        rounds=after.round - before.round, traced=after.traced - before.traced, lines=lines,
        objects=sorted(((n, d) for n, d in diff.items() if d), key=lambda kv: -kv[1]),
        objects_total=sum(after.objects.values()) - sum(before.objects.values()),
    )


_REPO = Path(__file__).resolve().parents[2]
_EXPORTER = str(_REPO / "exporter")
_HARNESS = (str(_REPO / "tests"), str(_REPO / "bench"))

# Left out of every snapshot: tracemalloc's own (snapshots, comparisons), and this file's
# (the measurements and their counts; the node's rounds allocate nothing here that lives).
_LEFT_OUT = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, linecache.__file__),
    tracemalloc.Filter(False, "<unknown>"),
    tracemalloc.Filter(False, __file__),
)


# ---------------------------------------------------------------------------------------------
# The node and the exporter


@dataclass
class Totals:
    rounds: int = 0
    kubelet_lists: int = 0
    kubelet_list_failures: int = 0
    scrapes: int = 0
    scrape_bytes_max: int = 0
    faults: Counter[str] = field(default_factory=Counter)


class LeakNode:
    """The soak's node and an exporter wired to it in this process; see the module doc."""

    def __init__(self, workdir: Path, seed: int, faults_every: float) -> None:
        self.workdir = workdir
        self._measurements = 0
        self.args = soak_args(seed, faults_every)
        self.clock = VirtualClock()
        self.node = soak.Node(workdir, self.args, random.Random(seed))
        self.node.kubelet = Kubelet(self.args.gpus, self.args.replicas)
        self.fake = build_fake_nvml(self.args.gpus)
        self.driver = Driver(self.fake)
        self.node.stdin = _DriverPipe(self.driver)
        self.totals = Totals()
        self._closers: list[Callable[[], None]] = []
        self._next_churn = 0.0
        self._next_fault = faults_every / 2
        self._fault_n = 0
        self._undo: tuple[float, str] | None = None

    def start(self) -> None:
        node = self.node
        node.start()
        self._closers.append(node.stop)
        cfg = parse_config([
            "--kubelet-socket", str(node.socket_path), "--proc-root", str(node.proc_root),
            "--kubeconfig", str(node.kubeconfig), "--node-name", soak.NODE,
            "--interval", str(INTERVAL_S), "--process-metrics",
        ], environ={})
        kube = load_config(cfg.kubeconfig)
        assert not isinstance(kube, MetadataDisabled)
        self.watcher = PodMetadataWatcher(
            kube, cfg.node_name, request_timeout_s=2.0, backoff_initial_s=0.02,
            backoff_max_s=0.2, rng=random.Random(self.args.seed),
        )
        # The kubelet thread's period is an hour: it asks once at start, then round() asks.
        self.inputs = LiveInputs(
            kubelet_socket=cfg.kubelet_socket, proc_root=cfg.proc_root,
            metadata_watcher=self.watcher, resource_names=cfg.gpu_resources,
            node_name=cfg.node_name, kubelet_interval=3600.0,
        )
        dropped = DroppedSeries()
        self.attributor = Attributor(
            self.inputs, node_fallback=NodeInfo(instance_type=cfg.instance_type or ""),
            max_containers=cfg.max_container_series, dropped=dropped,
        )
        self._closers.append(self.attributor.close)
        self.source = NvmlSource(
            library_loader=lambda: self.fake, clock=self.clock.wall,
            monotonic=self.clock.monotonic, xid_wait_timeout_ms=50,
        )
        self._closers.append(self.source.close)
        process_cap = ProcessSeriesCap(cfg.max_process_series, dropped)
        self.sampler = Sampler(
            self.source, cfg.interval, clock=self.clock.wall, monotonic=self.clock.monotonic,
            listeners=(self.attributor, process_cap),
        )
        self.registry = build_registry(cfg, self.sampler, self.attributor,
                                       process_cap=process_cap, dropped=dropped)
        self.wait_synced()

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()

    def round(self, *, synced: bool = False) -> None:
        """One sampling interval: the node churns and faults as the soak's main loop makes
        it, the driver records a utilization sample per process, the kubelet is asked when
        due, the sampler runs its round, and a scrape is rendered. ``synced``: the kubelet
        asked and the pod watcher caught up before the sampler's round, whatever is due."""
        node, now = self.node, self.clock.elapsed
        if self._undo is not None and now >= self._undo[0]:
            node.undo(self._undo[1])
            if self._undo[1] == "driver_back":
                # A driver loaded again starts without the old one's event sets; the double
                # keeps those the exporter could not free while it was gone (~300 B each).
                with self.fake._events_changed:
                    self.fake._event_sets.clear()
            self._undo = None
        if now >= self._next_churn:
            node.churn(now)
            node.prune(now)
            self._next_churn += self.args.churn_every
        if self._undo is None and now >= self._next_fault:
            kind = soak.FAULTS[self._fault_n % len(soak.FAULTS)]
            self._undo = node.fault(kind, now)
            self.totals.faults[kind] += 1
            self._fault_n += 1
            self._next_fault += self.args.faults_every
        self._forget()
        self.clock.elapsed += INTERVAL_S
        # Inside the interval that just passed, after NvmlSource's cursor.
        self.driver.tick(int((self.clock.wall() - INTERVAL_S / 2) * 1_000_000))
        if synced:
            self.refresh_kubelet()
            self.wait_synced()
        elif self.totals.rounds % KUBELET_EVERY == 0:
            self.refresh_kubelet()
        self.sampler.run_once()
        body = generate_latest(self.registry)
        if self.totals.rounds % TEXT_EVERY == 0:
            generate_text(self.registry)
        self.totals.scrapes += 1
        self.totals.scrape_bytes_max = max(self.totals.scrape_bytes_max, len(body))
        self.totals.rounds += 1

    def _forget(self) -> None:
        """Keep the harness's own records bounded and steady: the soak keeps ended pods and
        processes and the kubelet's answers for its stale-series check (none here), and
        FakeApi every request it saw."""
        node = self.node
        node.kubelet.answered.clear()
        node.ended_pods.clear()
        node.ended_procs.clear()
        with node.api.lock:
            node.api.seen.clear()

    def refresh_kubelet(self) -> None:
        # LiveInputs' PodResourcesWatcher, asked in this thread instead of on its timer.
        ok = self.inputs._kubelet.refresh_once()
        self.totals.kubelet_lists += 1
        self.totals.kubelet_list_failures += not ok

    def quiet(self) -> bool:
        """No fault under way, and the exporter over it: every GPU, the driver and the
        kubelet are there, and the last round saw NVML and every GPU up (after a driver
        reload NVML is initialised again only when its retry backoff allows)."""
        node = self.node
        if self._undo is not None or node.lost_gpu is not None or node.driver_down:
            return False
        snap = self.sampler.latest()
        return (node.kubelet_up and snap is not None and snap.source_up
                and len(snap.devices) == len(self.fake.gpus)
                and all(d.up for d in snap.devices))

    def run_until(self, rounds: int) -> None:
        """Rounds until ``rounds`` have run and no fault is under way."""
        while self.totals.rounds < rounds or not self.quiet():
            self.round()

    def settle_for_measurement(self, like: Measurement | None, within: int) -> None:
        """Rounds until one in which the exporter holds the node as it is (``synced``), with
        no fault under way. Also until every time-slicing slot has a pod, and with ``like`` as
        many processes are alive as then, give or take 6 (both looks see a node of the same
        size), for at most ``within`` rounds."""
        last = self.totals.rounds + within
        while True:
            self.run_until(self.totals.rounds)
            self.round(synced=True)
            if not self.quiet():
                continue
            if self.totals.rounds >= last or (
                len(self.node.pods) == len(self.node.slots)
                and (like is None or abs(len(self.node.live_pids) - like.processes) <= 6)
            ):
                return

    def wait_synced(self, timeout: float = 20.0) -> None:
        """Bounded: until the watcher holds exactly the pods alive and has the node."""
        want = {p.spec.uid for p in self.node.pods.values()}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = self.watcher.snapshot()
            if snap.synced and snap.node is not None and set(snap.pods) == want:
                return
            time.sleep(0.005)
        snap = self.watcher.snapshot()
        raise AssertionError(
            f"the pod watcher did not catch up in {timeout:.0f} s: {len(snap.pods)} pods, "
            f"{len(want)} alive, {len(set(snap.pods) ^ want)} differ")

    def measure(self, first: Measurement | None = None, within: int = 300) -> Measurement:
        """:meth:`settle_for_measurement` (like ``first``), then ``gc.collect()`` and the two
        looks. The snapshot goes to a file at once, so no snapshot's objects are ever counted
        (a first measurement takes it before it counts the objects, a later one after)."""
        self.settle_for_measurement(first, within)
        gc.collect()
        self._measurements += 1
        path = self.workdir / f"snapshot-{self._measurements}"
        traced = -1
        if first is None:
            if tracemalloc.is_tracing():
                traced = _dump_snapshot(path)
            objects = _count_objects()
        else:
            objects = _count_objects()
            if tracemalloc.is_tracing():
                traced = _dump_snapshot(path)
        return Measurement(
            round=self.totals.rounds, traced=max(traced, 0),
            snapshot=path if traced >= 0 else None, objects=objects,
            pods=len(self.node.pods), processes=len(self.node.live_pids),
            threads=sorted(t.name for t in threading.enumerate()), fds=_open_fds(),
            api_connections=len(self.node.api.connections),
        )


def _dump_snapshot(path: Path) -> int:
    """Take a snapshot (what this file allocates and tracemalloc's own left out), write it
    to ``path`` and return the bytes it holds."""
    snapshot = tracemalloc.take_snapshot().filter_traces(_LEFT_OUT)
    snapshot.dump(str(path))
    traced = sum(t.size for t in snapshot.traces)
    del snapshot
    gc.collect()  # its tuples, which may sit in a reference cycle with nothing else
    return traced


def _open_fds() -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/fd"))
    return -1


def _count_objects() -> dict[str, int]:
    """The objects the GC tracks, by type name. A plain dict filled here, so that its memory
    is this file's (left out of the snapshots) and no count is in one and not the other."""
    counts: dict[str, int] = {}
    for o in gc.get_objects():
        name = type(o).__qualname__
        counts[name] = counts.get(name, 0) + 1
    return counts


# ---------------------------------------------------------------------------------------------
# A session: warm-up, tracing, measured windows


def rebuild_interned_strings(max_strings: int = 1_000_000) -> int:
    """Make CPython rebuild its table of interned strings now, under tracing; returns the
    new table's size (0 if no rebuild was seen).

    Why: pathlib interns every path component, so each PID the node's ``/proc`` tree names
    leaves a deleted entry there, and every few thousand rounds the table (~2 MB in a test
    process) is rebuilt. Allocated before tracing began, the old table is in no snapshot,
    the new one is: one rebuild between the two measurements reads as ~2 MB of growth at
    ``pathlib.py:74`` (it did, in a 1,500-round window). Interning short-lived strings until
    the rebuild happens moves it before the first measurement; the next one is then at
    least as many insertions away as the table holds strings (tens of thousands: more than
    a window's rounds make)."""
    before = tracemalloc.get_traced_memory()[0]
    for start in range(0, max_strings, 1000):
        for i in range(start, start + 1000):
            sys.intern(f"gpuscope-leak-test-{i}")  # dropped at once: a deleted entry
        now = tracemalloc.get_traced_memory()[0]
        if now - before >= 256 * 1024:
            return now - before
        before = now
    return 0


@dataclass
class Window:
    """Two measurements and what happened between them."""

    first: Measurement
    last: Measurement
    growth: Growth
    seconds: float
    pods_started: int
    processes_started: int
    pid_reuses: int
    faults: Counter[str]


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    # Short: a unix socket path holds 107 bytes, pytest's tmp_path can be longer. In memory
    # where there is /dev/shm: on a disk's file system closing a removed /proc file costs
    # ~0.4 ms (a third of a round).
    shm = Path("/dev/shm")
    where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="gpuscope-leak-", dir=where))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Session:
    """A :class:`LeakNode` warmed up, then traced: ``warmup`` rounds without tracing (fast),
    then tracemalloc on, the interned-string table rebuilt, and ``settle`` rounds.

    Why tracing starts late, and why that is sound: tracing makes a round ~4 times slower,
    and what is compared is two snapshots. Memory allocated before tracing began is in
    neither (and freed later, it is taken off neither), so their difference is exact except
    for old memory *replaced* after the first snapshot. ``settle`` covers a whole cycle of
    the faults (7 kinds, one every ``faults_every`` rounds), more than a pod or a process
    lives, and many kubelet periods: whatever the exporter holds for the node at the first
    snapshot, and every per-round structure, was allocated under tracing by then. The one
    old structure that outlives it is the interned-string table (see
    :func:`rebuild_interned_strings`)."""

    def __init__(self, *, warmup: int, settle: int | None = None, seed: int = 1,
                 faults_every: float = FAULTS_EVERY_S, frames: int = 1) -> None:
        self.warmup = warmup
        self.settle = settle if settle is not None else int(
            len(soak.FAULTS) * faults_every / INTERVAL_S) + 10
        self.seed = seed
        self.faults_every = faults_every
        self.frames = frames
        self.interned_table = 0
        self.seconds_untraced = 0.0
        self.seconds_settle = 0.0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Session:
        started = time.monotonic()
        stack = self._stack
        try:
            self.logs = stack.enter_context(quiet_logs())
            stack.enter_context(restored_pynvml())
            workdir = stack.enter_context(_workdir())
            self.node = LeakNode(workdir, self.seed, self.faults_every)
            stack.callback(self.node.close)
            self.node.start()
            self.node.run_until(self.warmup)
            self.seconds_untraced = time.monotonic() - started
            tracing = time.monotonic()
            tracemalloc.start(self.frames)
            stack.callback(tracemalloc.stop)
            self.interned_table = rebuild_interned_strings()
            self.node.run_until(self.node.totals.rounds + self.settle)
            self.seconds_settle = time.monotonic() - tracing
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def window(self, rounds: int, *, like_within: int = 300) -> Window:
        """A measurement, ``rounds`` rounds, and a measurement at the first quiet round after
        them with as many pods and processes alive as at the first (within
        ``like_within`` more)."""
        node = self.node
        churn = node.node.totals
        started_counts = (churn.pods_started, churn.processes_started, churn.pid_reuses,
                          node.totals.faults.copy())
        first = node.measure()
        started = time.monotonic()
        node.run_until(first.round + rounds)
        last = node.measure(first, like_within)
        seconds = time.monotonic() - started
        faults = node.totals.faults.copy()
        faults.subtract(started_counts[3])
        return Window(first, last, growth(first, last), seconds,
                      churn.pods_started - started_counts[0],
                      churn.processes_started - started_counts[1],
                      churn.pid_reuses - started_counts[2], +faults)


def describe_window(w: Window) -> str:
    return "\n".join([
        f"{w.growth.rounds:,} rounds measured in {w.seconds:.1f} s (rounds {w.first.round:,} "
        f"to {w.last.round:,}): {w.pods_started:,} pods, {w.processes_started:,} processes "
        f"({w.pid_reuses:,} reused a PID), faults {dict(w.faults)}",
        f"alive (pods/processes): {w.first.pods}/{w.first.processes} at the first "
        f"measurement, {w.last.pods}/{w.last.processes} at the last; traced "
        f"{w.first.traced:,} -> {w.last.traced:,} B; threads {len(w.first.threads)} -> "
        f"{len(w.last.threads)}; fds {w.first.fds} -> {w.last.fds}; API server connections "
        f"{w.first.api_connections} -> {w.last.api_connections}",
        w.growth.describe(),
    ])


def describe_session(s: Session) -> str:
    t, c = s.node.totals, s.node.node.totals
    return (
        f"{t.rounds:,} rounds: {s.warmup:,} untraced in {s.seconds_untraced:.1f} s, "
        f"{s.settle} settling under tracing in {s.seconds_settle:.1f} s (interned-string "
        f"table rebuilt: {s.interned_table:,} B); churn {c.pods_started:,} pods, "
        f"{c.processes_started:,} processes ({c.pid_reuses:,} reused a PID, "
        f"{c.host_processes_started:,} host); faults {dict(t.faults)}; kubelet List() "
        f"{t.kubelet_lists:,} ({t.kubelet_list_failures} failed); scrapes {t.scrapes:,}, up "
        f"to {t.scrape_bytes_max:,} B; logs {dict(s.logs.counts)}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.reliability.leak_node")
    p.add_argument("--rounds", type=int, default=600, help="rounds per measured window")
    p.add_argument("--windows", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--settle", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults-every", type=float, default=FAULTS_EVERY_S)
    p.add_argument("--frames", type=int, default=1,
                   help="tracemalloc frames per allocation; above 1 the top growth is also "
                        "shown by traceback (slower)")
    a = p.parse_args(argv)
    with Session(warmup=a.warmup, settle=a.settle, seed=a.seed,
                 faults_every=a.faults_every, frames=a.frames) as session:
        for _ in range(a.windows):
            w = session.window(a.rounds)
            print(describe_window(w), flush=True)
            if a.frames > 1 and w.first.snapshot is not None and w.last.snapshot is not None:
                old = tracemalloc.Snapshot.load(str(w.first.snapshot))
                new = tracemalloc.Snapshot.load(str(w.last.snapshot))
                for stat in new.compare_to(old, "traceback")[:10]:
                    print(f"{stat.size_diff:+,} B {stat.count_diff:+,} blocks")
                    print("\n".join(f"    {line}" for line in stat.traceback.format()))
            del w
        print(describe_session(session))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The exporter does not leak: thousands of sampling rounds in this process, with pods,
processes and PIDs churning and faults, and its memory flat (issue 31, item 2).

The node and the exporter are ``leak_node.py``'s: ``bench/soak.py``'s node (real grpcio
kubelet on a unix socket, ``/proc`` tree, API server over HTTP, the NVML double through the
real pynvml), churned by the soak's own code at its ten-times rate per round (a churn step
every 2 rounds, pods living 6-40 rounds, 30 % of new processes on a PID that just ended), a
fault every 6 rounds in turn (a GPU lost, XIDs, the watch ended, the kubelet restarting,
``410 Gone``, the driver unloaded). The exporter is wired as ``cli.run()`` wires it; each
round runs the sampler's round (NVML, attribution, the process cap) and renders ``/metrics``
with ``generate_latest``. Seeded: every run plays the same node.

800 rounds of warm-up without tracing, then tracemalloc on and a whole cycle of the faults
(52 rounds), then the measured window: a measurement, 500 rounds (~650 pods and ~1,550
processes come and go, ~85 faults), and a measurement at the first quiet round after them
with every slot holding a pod and as many processes alive (+-6). Each measurement is taken
after a round whose kubelet ``List()`` and pod watcher match the node, and ``gc.collect()``.

The bounds over the window (``BOUNDS``), and the smallest leak each catches in 500 rounds:

- traced memory grows by less than 128 KiB: 262 bytes a round, 200 a pod, 85 a process.
  Seen: +28 to +66 KB, nearly all of it the node's doubles (FakeApi's requests, the /proc
  writes, the driver's sample buffers) and stdlib caches filling (urllib's 128 parsed URLs,
  re's patterns), which run in this process too; the exporter's own lines -11 to +16 KB.
- no line (``compare_to(..., "lineno")``) grows by 32 KiB or more: 66 bytes a round, 50 a
  pod, 21 a process, allocated at one line, as a growing dict or list is. Seen: at most
  +15 KB (a pod list decoded on the watcher's thread; one ctypes array type alive or not).
- no type of GC-tracked object grows by 100 or more, all together by less than 300: one
  object every 5 rounds, or one per pod or process that came and went. Seen: at most +27 of
  one type (urllib's ``SplitResult``, its cache filling) and +48 in all.
- no more exporter threads, and no more open files than processes alive (the PID resolver
  holds one ``stat`` file per GPU process), give or take 2.

``test_a_planted_leak_is_caught`` plants two ~100-byte records a round for 250 rounds (52 KB
at one line, what one record a round leaves over the 500 rounds above) on the attribution
path and checks that these checks report that line and that type.

About 40 s alone, 55 s beside the rest of the suite (xdist, 2 cores): ~8 s of warm-up, ~17
for the 500 traced rounds (tracemalloc makes a round ~4 times slower), ~9 for the planted
leak's 250. ``python -m tests.reliability.leak_node`` runs more windows and prints what grew.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench import soak
from gpuscope.exporter.kubernetes.attribution import Attributor
from gpuscope.exporter.model import Snapshot
from tests.reliability.leak_node import Session, Window, describe_session, describe_window

KIB = 1024
SEED = 1
WARMUP_ROUNDS = 800
ROUNDS = 500
PLANTED_ROUNDS = 250


@dataclass(frozen=True)
class Bounds:
    traced: int = 128 * KIB  # bytes, all traces
    line: int = 32 * KIB  # bytes, one line
    per_type: int = 100  # GC-tracked objects of one type
    objects: int = 300  # GC-tracked objects, all types


BOUNDS = Bounds()
FD_TOLERANCE = 2  # the doubles' sockets (the API server's keep-alive connections, gRPC's)


def _exporter_threads(names: list[str]) -> list[str]:
    # The doubles' threads (the API server's handlers, gRPC's pool) come and go with faults.
    return [n for n in names if n.startswith("gpuscope-")]


def problems(w: Window, bounds: Bounds = BOUNDS) -> list[str]:
    """What grew past a bound over the window; empty when memory is flat."""
    g, first, last = w.growth, w.first, w.last
    found = []
    if g.traced >= bounds.traced:
        found.append(f"traced memory grew {g.traced:+,} B (bound {bounds.traced:,} B)")
    found += [f"{s.traceback} grew {s.size_diff:+,} B in {s.count_diff:+,} blocks (bound "
              f"{bounds.line:,} B a line)" for s in g.lines if s.size_diff >= bounds.line]
    found += [f"{n:+,} {name} objects (bound {bounds.per_type} a type)"
              for name, n in g.objects if n >= bounds.per_type]
    if g.objects_total >= bounds.objects:
        found.append(f"{g.objects_total:+,} GC-tracked objects (bound {bounds.objects:,})")
    before, after = _exporter_threads(first.threads), _exporter_threads(last.threads)
    if len(after) > len(before):
        found.append(f"the exporter's threads {before} -> {after}")
    if last.fds - first.fds > max(0, last.processes - first.processes) + FD_TOLERANCE:
        found.append(f"open files {first.fds} -> {last.fds} with processes "
                     f"{first.processes} -> {last.processes}")
    return found


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    with Session(warmup=WARMUP_ROUNDS, seed=SEED) as s:
        yield s


def test_memory_is_flat_through_churn_and_faults(session: Session) -> None:
    w = session.window(ROUNDS)
    report = f"{describe_window(w)}\n{describe_session(session)}"
    print(report)  # the figures, with -s

    # The paths ran as on a node: the churn and every fault happened, nothing failed.
    assert w.pods_started >= 500 and w.processes_started >= 1_200, report
    assert w.pid_reuses >= 300, report
    assert set(w.faults) == set(soak.FAULTS) and min(w.faults.values()) >= 5, report
    assert session.node.node.totals.host_processes_started > 0, report
    assert session.node.totals.kubelet_list_failures > 0, report  # asked while restarting
    assert session.logs.first_error is None, session.logs.first_error
    # ... and ended in a correct scrape: every live pod, and no other, named by attribution.
    scrape = {f.name: f for f in text_string_to_metric_families(
        generate_latest(session.node.registry).decode())}
    alive = {p.spec.name for p in session.node.node.pods.values()}
    named = {s.labels["pod"] for s in scrape["container_gpu_allocated"].samples}
    assert named == alive, report
    pids = {int(s.labels["pid"]) for s in scrape["gpu_process_memory_used_bytes"].samples}
    assert pids == set(session.node.node.live_pids), report

    assert problems(w) == [], report


PLANTED: list[list[float]] = []


def test_a_planted_leak_is_caught(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Attributor.__call__

    def leaking(self: Attributor, snapshot: Snapshot) -> None:
        real(self, snapshot)
        for _ in range(2):
            PLANTED.append([snapshot.timestamp, float(len(snapshot.devices))])  # ~100 B each

    monkeypatch.setattr(Attributor, "__call__", leaking)
    try:
        w = session.window(PLANTED_ROUNDS)
    finally:
        monkeypatch.undo()
        planted = len(PLANTED)
        PLANTED.clear()
    report = describe_window(w)
    print(report)

    assert planted >= 2 * PLANTED_ROUNDS
    found = problems(w)
    here = Path(__file__).name
    assert any(here in p and "a line" in p for p in found), (found, report)
    assert any(" list objects " in p for p in found), (found, report)
    top = w.growth.lines[0].traceback[-1]
    assert Path(top.filename).name == here, report  # the planted line grew most

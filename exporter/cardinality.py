"""Caps on how many label sets one node can put into ``/metrics``.

A node is not supposed to run 10,000 GPU processes, but a fork bomb in a notebook, an MPS
server with hundreds of clients or a leak in a serving stack can get close, and every one of
them would become a series in every Prometheus that scrapes the node. Two flags bound that:

* ``--max-process-series`` caps the opt-in per-process series (``gpu_process_*``). When a
  round has more processes than that, each device's (GPU's, MIG slice's) biggest device
  memory holder is kept first, then each one's second biggest, and so on (the ones an
  operator would look at first, on every GPU; memory changes slowly, so the kept set is
  stable from round to round) and the rest are left out.
* ``--max-container-series`` caps the (container, device) rows of ``container_gpu_*``.
  Allocated rows come first (they are what cost and idle-allocation analysis read; in name
  order), then the unallocated rows holding the most device memory; host processes go last.
  Nothing in that order moves from round to round as utilization does, so the kept rows do
  not flap in and out of ``/metrics``.

What was left out is counted in ``gpu_exporter_series_dropped_total{family}``, once per
sampling round (on the sampler thread, not per scrape), so ``rate()`` of it reads as "label
sets dropped per second". Nothing is dropped from the snapshot itself: device totals and
container sums are still computed over every process, and the CloudWatch sink reads the
whole attribution (``Attributor.latest``; ``/metrics`` renders ``Attributor.series``).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.exporter.model import Snapshot

if TYPE_CHECKING:  # gpuscope.exporter.kubernetes.attribution imports this module
    from gpuscope.exporter.kubernetes.attribution import Attribution, ContainerUsage

PROCESS_FAMILY = "gpu_process"
CONTAINER_FAMILY = "container_gpu"

DEFAULT_MAX_PROCESS_SERIES = 2000
DEFAULT_MAX_CONTAINER_SERIES = 2000

ProcessKeys = frozenset[tuple[str, int]]


def keep_processes(snapshot: Snapshot, limit: int) -> tuple[ProcessKeys | None, int]:
    """The (device UUID, PID) pairs to render and how many are left out.

    ``None`` means "all of them" (the common case, computed without sorting)."""
    total = sum(len(d.processes) for d in snapshot.devices)
    if total <= limit:
        return None, 0
    # Each device's biggest memory holder first, then each one's second, and so on: a
    # global rank on memory (then PID) gave every slot to one GPU's processes wherever
    # they held as much memory as the others' (identical workers), leaving the other GPUs
    # with no process series at all.
    ranked: list[tuple[int, int, int, str]] = []
    for d in snapshot.devices:
        by_memory = sorted(((p.memory_used_bytes or 0, p.pid) for p in d.processes),
                           key=lambda row: (-row[0], row[1]))
        ranked.extend((rank, -memory, pid, d.uuid)
                      for rank, (memory, pid) in enumerate(by_memory))
    ranked.sort()
    return frozenset((uuid, pid) for _, _, pid, uuid in ranked[:limit]), total - limit


def _container_rank(usage: ContainerUsage) -> tuple[bool, bool, int, str, str, str, str]:
    # Nothing that moves from round to round (utilization does, every round): a rank on it
    # keeps a different set each round, and the rows left out flap in and out of /metrics.
    # Allocated rows in name order (a pod's rows next to each other), then unallocated rows
    # by device memory (slow, as for processes), host processes last.
    return (
        not usage.allocated,
        not usage.key.pod,  # host processes
        0 if usage.allocated else -(usage.memory_used_bytes or 0),
        usage.key.namespace, usage.key.pod, usage.key.container, usage.uuid,
    )


def cap_containers(result: Attribution, limit: int) -> tuple[Attribution, int]:
    """``result`` with at most ``limit`` container rows (and only the pods they belong to),
    and how many rows were left out. The kept rows keep their original order."""
    dropped = len(result.containers) - limit
    if dropped <= 0:
        return result, 0
    kept = set(map(id, sorted(result.containers, key=_container_rank)[:limit]))
    containers = tuple(u for u in result.containers if id(u) in kept)
    pods_left = {(u.key.namespace, u.key.pod) for u in containers}
    pods = tuple(p for p in result.pods if (p.namespace, p.pod) in pods_left)
    return dataclasses.replace(result, containers=containers, pods=pods), dropped


class DroppedSeries:
    """Totals for ``gpu_exporter_series_dropped_total``, per family."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, int] = {PROCESS_FAMILY: 0, CONTAINER_FAMILY: 0}

    def add(self, family: str, count: int) -> None:
        if count:
            with self._lock:
                self._totals[family] = self._totals.get(family, 0) + count

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._totals)


@dataclass(slots=True)
class _Decision:
    snapshot: Snapshot
    kept: ProcessKeys | None


class ProcessSeriesCap:
    """A sampler listener that decides, once per snapshot, which processes get series.

    The collector asks :meth:`kept` for the snapshot it renders; a scrape that races the
    sampler (a newer snapshot than the last decision) gets the same pure answer computed on
    the spot, without counting it twice."""

    def __init__(self, limit: int, dropped: DroppedSeries) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self._dropped = dropped
        self._last: _Decision | None = None

    def __call__(self, snapshot: Snapshot) -> None:
        kept, dropped = keep_processes(snapshot, self.limit)
        self._last = _Decision(snapshot, kept)
        self._dropped.add(PROCESS_FAMILY, dropped)

    def kept(self, snapshot: Snapshot) -> ProcessKeys | None:
        last = self._last
        if last is not None and last.snapshot is snapshot:
            return last.kept
        return keep_processes(snapshot, self.limit)[0]

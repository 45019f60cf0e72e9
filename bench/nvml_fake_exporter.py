"""Run the real exporter (``gpuscope.exporter.cli.main``) over the FakeNvml test double of
libnvidia-ml.

Used by ``bench/exporter_bench.py --source nvml-fake``; not a test. It builds a node of
``--gpus`` A100s with ``--processes-per-gpu`` compute processes each, then runs
``gpuscope-exporter --source nvml`` with every remaining argument, except that the source is
``NvmlSource(library_loader=lambda: fake)``. Everything above the C library is real: pynvml's
ctypes marshalling, NvmlSource, the sampler, the collectors and the HTTP server.

A *driver tick* thread inside this process stands in for the driver's per-process
utilization sampler: every ``--driver-tick`` seconds it appends one sample per process to each
GPU's buffer. Its CPU is counted in the process's total, so the thread names itself
``fake-nvml-tick`` (``/proc/<pid>/task/<tid>/comm``) and the benchmark reports it separately.
The fake's Python entry points run on the sampler thread, in place of the C library's
own (native, much cheaper) work; a profile shows how much of a round they take.

Run from the repository root::

    python3 -m bench.nvml_fake_exporter --gpus 8 --processes-per-gpu 64 -- \
        --listen 127.0.0.1:9463 --interval 1
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml

from gpuscope.exporter import cli
from gpuscope.exporter.sources import nvml

if TYPE_CHECKING:  # imported where a node is built: bench.nvml_c_exporter's exporter process
    from tests.exporter.sources.fake_nvml import FakeNvml  # runs no Python double at all

TICK_THREAD_NAME = "fake-nvml-tick"
# Per-GPU sample buffer: a few ticks are plenty for an exporter that reads every interval,
# and a small buffer keeps the fake's own memory out of the exporter's RSS (the default
# 4096-sample buffer of FakeGpu would hold ~3 MB of tuples on 8 GPUs).
BUFFER_TICKS = 4
# GPU-utilization samples the driver records every tick (percent).
BUSY_PERCENT = 50
# Work signals, constant (bench/fake_libnvml/fake_nvml.c has the same): GPM means, perf-policy
# violation time (ns) and the clocks-event-reason durations (ns).
GPM_MEANS: dict[int, float] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 90.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 40.0,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 25.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 60.0,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 50.0,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 100.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 1000.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 2000.0,
}
VIOLATION_NS: dict[int, int] = {
    pynvml.NVML_PERF_POLICY_POWER: 5_000_000_000,
    pynvml.NVML_PERF_POLICY_THERMAL: 2_000_000_000,
    pynvml.NVML_PERF_POLICY_SYNC_BOOST: 0,
    pynvml.NVML_PERF_POLICY_BOARD_LIMIT: 0,
    pynvml.NVML_PERF_POLICY_LOW_UTILIZATION: 0,
    pynvml.NVML_PERF_POLICY_RELIABILITY: 0,
    pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS: 0,
    pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS: 0,
}
CLOCKS_EVENT_NS: dict[int, int] = {
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: 2_000_000_000,
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: 0,
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: 0,
}


def build_node(gpus: int, processes_per_gpu: int) -> FakeNvml:
    """``gpus`` A100-80GB GPUs, each with ``processes_per_gpu`` compute processes sharing
    ~72 GiB of memory, and the work signals on: GPM answered (as on Hopper) with constant
    means, throttle counters, GPU-utilization samples (one per tick). ``max_event_wait_s``
    matches NvmlSource's 1 s XID wait, so the XID thread blocks as long as it would in the
    real driver instead of polling at 50 Hz."""
    from tests.exporter.sources.fake_nvml import GIB, FakeNvml

    fake = FakeNvml(gpus, max_event_wait_s=1.0)
    memory = (72 * GIB // max(processes_per_gpu, 1)) if processes_per_gpu else 0
    for gpu in fake.gpus:
        gpu.max_util_samples = BUFFER_TICKS * max(processes_per_gpu, 1)
        gpu.max_busy_samples = BUFFER_TICKS
        gpu.gpm_supported = True
        gpu.gpm = dict(GPM_MEANS)
        gpu.violation_ns = dict(VIOLATION_NS)
        gpu.clocks_event_ns = dict(CLOCKS_EVENT_NS)
        for i in range(processes_per_gpu):
            gpu.add_process(
                10_000 + gpu.index * processes_per_gpu + i,
                used_memory=memory,
                sm_util=1 + i % 3,
                mem_util=i % 2,
            )
    return fake


def tick(fake: FakeNvml, timestamp_us: int, n: int) -> None:
    """One driver sampling tick: a new sample per process (utilization varies per tick) and
    a GPU-utilization sample per GPU.

    Unlike ``FakeNvml.record_process_samples`` (insort + trim in place), each GPU's buffer is
    replaced by a new list in one assignment: the sampler thread may be reading the old one
    at this moment, and an in-place trim would shift the samples under it.
    """
    for gpu in fake.gpus:
        if not gpu.process_utilization_supported:
            continue
        new: list[tuple[int, int, int, int]] = []
        for i, proc in enumerate(gpu.processes):
            proc.sm_util = 1 + (i + n) % 3
            new.append((timestamp_us, proc.pid, proc.sm_util, proc.mem_util))
        gpu.util_samples = (gpu.util_samples + new)[-gpu.max_util_samples :]
        busy = (timestamp_us, BUSY_PERCENT)
        gpu.busy_samples = [*gpu.busy_samples, busy][-gpu.max_busy_samples :]


def _name_this_thread(name: str) -> None:
    """Set the OS thread name (Linux ``prctl(PR_SET_NAME)``); a no-op elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _tick_forever(fake: FakeNvml, period: float, stop: threading.Event) -> None:
    _name_this_thread(TICK_THREAD_NAME)
    n = 0
    next_due = time.monotonic()
    while True:
        tick(fake, int(time.time() * 1_000_000), n)
        n += 1
        next_due += period
        if stop.wait(max(0.0, next_due - time.monotonic())):
            return


def pod_uid(gpu: int, replica: int) -> str:
    """The UID of the pod that holds time-slicing replica ``replica`` of GPU ``gpu``."""
    return str(uuid.UUID(int=(0xB0D << 64) + (gpu << 16) + replica))


def container_id(gpu: int, replica: int) -> str:
    """The 64-hex container ID of that pod's one container."""
    return hashlib.sha256(f"gpuscope-bench-{gpu}-{replica}".encode()).hexdigest()


def pods_per_gpu(processes_per_gpu: int) -> int:
    """Time-slicing pods sharing each GPU (as in ``synthetic_scenario``: up to four)."""
    return max(1, min(4, processes_per_gpu))


def write_proc_tree(root: Path, fake: FakeNvml) -> None:
    """A host ``/proc`` for the fake PIDs: ``<pid>/stat`` (start time, field 22) and
    ``<pid>/cgroup`` (cgroup v2, systemd driver, containerd), process ``i`` of GPU ``g`` in
    pod ``i % pods_per_gpu``, so attribution reads and parses what it would on a node."""
    for gpu in fake.gpus:
        n_pods = pods_per_gpu(len(gpu.processes))
        for i, proc in enumerate(gpu.processes):
            replica = i % n_pods
            uid = pod_uid(gpu.index, replica).replace("-", "_")
            d = root / str(proc.pid)
            d.mkdir(parents=True, exist_ok=True)
            fields = ["S", "1", *["0"] * 18, str(1000 + proc.pid), *["0"] * 30]
            (d / "stat").write_text(f"{proc.pid} (python3) {' '.join(fields)}\n")
            (d / "cgroup").write_text(
                "0::/kubepods.slice/kubepods-besteffort.slice/"
                f"kubepods-besteffort-pod{uid}.slice/"
                f"cri-containerd-{container_id(gpu.index, replica)}.scope\n"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.nvml_fake_exporter",
        description="gpuscope-exporter --source nvml over a fake libnvidia-ml (benchmark only).",
        epilog="Arguments after '--' go to gpuscope-exporter (--source is forced to nvml).",
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes-per-gpu", type=int, default=64)
    parser.add_argument("--driver-tick", type=float, default=1.0,
                        help="seconds between per-process utilization samples (default 1)")
    parser.add_argument("--proc-tree", type=Path, metavar="DIR",
                        help="write a /proc tree for the fake PIDs into DIR and pass "
                             "--proc-root DIR to the exporter")
    add_gpm_arguments(parser)
    args, rest = parser.parse_known_args(argv)
    exporter_args = [a for a in rest if a != "--"]

    fake = build_node(args.gpus, args.processes_per_gpu)
    for gpu in fake.gpus:
        gpu.gpm_supported = args.gpm
    if args.proc_tree is not None:
        write_proc_tree(args.proc_tree, fake)
        exporter_args += ["--proc-root", str(args.proc_tree)]
    stop = threading.Event()
    ticker = threading.Thread(
        target=_tick_forever, args=(fake, args.driver_tick, stop), name=TICK_THREAD_NAME,
        daemon=True,
    )
    ticker.start()

    print(
        f"nvml-fake: {len(fake.gpus)} GPUs x {args.processes_per_gpu} processes, "
        f"driver tick {args.driver_tick:g} s",
        file=sys.stderr,
    )
    return run_exporter_over(fake, exporter_args, stop, gpm_source_kwargs(args))


def add_gpm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpm-interval", type=float, metavar="SECONDS",
                        help="NvmlSource's GPM cadence (0: every round; default: its own)")
    parser.add_argument("--no-gpm", dest="gpm", action="store_false",
                        help="the fake library answers that it has no GPM")


def gpm_source_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if args.gpm_interval is None:
        return {}
    return {"gpm_interval_seconds": args.gpm_interval}


def run_exporter_over(
    fake: object, exporter_args: list[str], stop: threading.Event,
    source_kwargs: dict[str, Any] | None = None,
) -> int:
    """``gpuscope-exporter --source nvml`` with ``fake`` as libnvidia-ml (the Python double,
    or the C one as a ``ctypes.CDLL``) and ``source_kwargs`` for NvmlSource; sets ``stop``
    when the exporter returns."""
    extra = dict(source_kwargs or {})

    class FakeLibraryNvmlSource(nvml.NvmlSource):
        """NvmlSource whose libnvidia-ml is the fake (unless a caller passes a loader)."""

        def __init__(self, **kwargs: Any) -> None:
            kwargs.setdefault("library_loader", lambda: fake)
            for key, value in extra.items():
                kwargs.setdefault(key, value)
            super().__init__(**kwargs)

    # The only change to the real code path: cli.build_source imports NvmlSource from
    # gpuscope.exporter.sources.nvml when it runs, and gets this subclass, i.e.
    # NvmlSource(library_loader=lambda: fake). Everything else is gpuscope-exporter as is.
    nvml.NvmlSource = FakeLibraryNvmlSource  # type: ignore[misc]
    try:
        return cli.main([*exporter_args, "--source", "nvml"])
    finally:
        stop.set()


if __name__ == "__main__":
    sys.exit(main())

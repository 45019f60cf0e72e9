"""The exporter process of ``bench/soak.py``: the real exporter over FakeNvml, driven by a pipe.

Not a test. Like ``bench/nvml_fake_exporter.py`` it runs ``gpuscope.exporter.cli.main`` with
``--source nvml`` and ``NvmlSource(library_loader=lambda: fake)``, so everything above the C
library is real. The fake lives in this process, so the soak drives it through this
process's stdin, one command per line (a thread named ``fake-nvml-drv`` applies them and,
every ``--driver-tick`` seconds, records one per-process utilization sample per process, as
the driver does):

    add GPU PID MEMORY SM     a process starts on GPU (index): MEMORY bytes, SM percent
    del GPU PID               it ends
    lost GPU 0|1              the GPU falls off the bus (1) or answers again (0)
    xid GPU CODE              an XID critical-error event on GPU
    driver 0|1                the driver unloads (0) or is back (1)

The thread keeps only the current state (the processes now running, a per-GPU sample buffer
of ``BUFFER_TICKS`` ticks), so its memory does not grow with churn. End of input (the soak
went away) stops the exporter as SIGTERM would.

``SOAK_TRACEMALLOC=FILE`` (environment) starts ``tracemalloc`` and writes the top allocation
growth to FILE every ``SOAK_TRACEMALLOC_EVERY`` seconds (default 60), against a baseline
taken one such period after start: for
diagnosing a leak, never for the figures (tracing costs CPU and memory). ``SOAK_OBJECTS=FILE``
is the cheap version: one JSON line per period with pymalloc's allocated block count, the
number of objects the GC tracks and the types whose count changed most.
``SOAK_MALLOC_TRIM=SECONDS`` calls glibc's ``malloc_trim(0)`` that often, to tell memory glibc
keeps after ``free()`` from memory the process holds (it did not stop the creep: see
docs/reliability.md).

Run from the repository root (``bench/soak.py`` does)::

    python3 -m bench.soak_exporter --gpus 8 -- --listen 127.0.0.1:9463 --interval 0.1 ...
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence

from bench.nvml_fake_exporter import _name_this_thread, run_exporter_over
from tests.exporter.sources.fake_nvml import FakeNvml, FakeProcess

DRIVER_THREAD_NAME = "fake-nvml-drv"
BUFFER_TICKS = 4
MAX_PROCESSES_PER_GPU = 32  # sizes each GPU's sample buffer (BUFFER_TICKS x this)


def gpu_uuid(index: int) -> str:
    """The NVML UUID of GPU ``index`` (the soak puts the same in the kubelet's answers)."""
    return f"GPU-{uuid.UUID(int=(0x50A4 << 96) + index)}"


def build_node(gpus: int) -> FakeNvml:
    """``gpus`` A100s, no processes yet. XID waits block up to 1 s, as in the driver."""
    fake = FakeNvml(max_event_wait_s=1.0)
    for i in range(gpus):
        gpu = fake.add_gpu(uuid=gpu_uuid(i))
        gpu.max_util_samples = BUFFER_TICKS * MAX_PROCESSES_PER_GPU
    return fake


class Driver:
    """Applies the soak's commands to the fake and ticks per-process utilization samples.

    Process lists and sample buffers are replaced, never changed in place: the sampler thread
    may be iterating the old list at that moment."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake
        self.commands = 0

    def apply(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        op, args = parts[0], [int(a) for a in parts[1:]]
        self.commands += 1
        if op == "add":
            index, pid, memory, sm = args
            gpu = self.fake.gpus[index]
            proc = FakeProcess(pid, used_memory=memory, sm_util=sm, mem_util=sm // 2)
            gpu.processes = [*(p for p in gpu.processes if p.pid != pid), proc]
        elif op == "del":
            index, pid = args
            gpu = self.fake.gpus[index]
            gpu.processes = [p for p in gpu.processes if p.pid != pid]
        elif op == "lost":
            self.fake.gpus[args[0]].lost = bool(args[1])
        elif op == "xid":
            self.fake.inject_xid(args[0], args[1])
        elif op == "driver":
            self.fake.driver_loaded = bool(args[0])
        else:
            raise ValueError(f"unknown command {line!r}")

    def tick(self, timestamp_us: int) -> None:
        for gpu in self.fake.gpus:
            new = [(timestamp_us, p.pid, p.sm_util, p.mem_util) for p in gpu.processes]
            if new:
                gpu.util_samples = (gpu.util_samples + new)[-gpu.max_util_samples :]


def _drive(driver: Driver, period: float, stop: threading.Event) -> None:
    """Read commands from stdin until EOF, ticking every ``period`` seconds meanwhile."""
    _name_this_thread(DRIVER_THREAD_NAME)
    fd = sys.stdin.fileno()
    pending = b""
    next_tick = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_tick:
            driver.tick(int(time.time() * 1_000_000))
            next_tick += period
            if next_tick < now:  # fell behind (CPU starved): do not tick back to back
                next_tick = now + period
        ready, _, _ = select.select([fd], [], [], max(0.0, next_tick - time.monotonic()))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break  # the soak is gone
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                driver.apply(line.decode())
            except (ValueError, IndexError) as exc:
                print(f"soak_exporter: bad command: {exc}", file=sys.stderr)
    if not stop.is_set():
        os.kill(os.getpid(), signal.SIGTERM)  # stop the exporter as the kubelet would


def _trace_memory(path: str, every: float, stop: threading.Event) -> None:
    import linecache
    import tracemalloc

    _name_this_thread("soak-tracemalloc")
    # Leave out what tracing itself allocates (snapshots, comparisons, source lines).
    ignore = [tracemalloc.Filter(False, pattern, all_frames=True)
              for pattern in (tracemalloc.__file__, linecache.__file__, __file__)]
    if stop.wait(every):  # the baseline: after start-up and one period of warm-up
        return
    first = tracemalloc.take_snapshot().filter_traces(ignore)
    started = time.monotonic()
    while not stop.wait(every):
        snap = tracemalloc.take_snapshot().filter_traces(ignore)
        current, peak = tracemalloc.get_traced_memory()
        lines = [f"after {time.monotonic() - started:.0f} s: traced {current} B (peak {peak} B),"
                 f" exporter's {sum(t.size for t in snap.traces)} B vs "
                 f"{sum(t.size for t in first.traces)} B at the baseline",
                 "", "by line:"]
        for stat in snap.compare_to(first, "lineno")[:20]:
            lines.append(f"  {stat.size_diff:+d} B {stat.count_diff:+d} blocks  {stat.traceback}")
        lines += ["", "by traceback:"]
        for stat in snap.compare_to(first, "traceback")[:15]:
            lines.append(f"{stat.size_diff:+d} B {stat.count_diff:+d} blocks")
            lines.extend(f"    {frame}" for frame in stat.traceback.format()[-8:])
        del snap
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, path)


def _die_with_parent() -> None:
    """SIGTERM when the soak dies (Linux), so no exporter is left behind even if the soak is
    killed with SIGKILL. Set here, not in a ``preexec_fn``: the soak runs gRPC threads, and
    forking with them is unsafe."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the soak died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo() -> dict[str, int]:
    """glibc's ``mallinfo2()``: heap (``arena``) and mmapped (``hblkhd``) bytes, bytes in use
    (``uordblks``) and free in the heap (``fordblks``); empty elsewhere."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {name: int(getattr(info, name)) for name in ("arena", "hblkhd", "uordblks",
                                                        "fordblks")}


def _count_objects(path: str, every: float, stop: threading.Event) -> None:
    """Every ``every`` seconds append one JSON line to ``path``: pymalloc's allocated blocks,
    the objects the GC tracks and the types whose count changed most since the first line.
    Cheap enough (tens of ms a time) to run alongside a soak, unlike tracemalloc."""
    import collections
    import gc
    import json

    _name_this_thread("soak-objects")
    started = time.monotonic()
    first: collections.Counter[str] | None = None
    while not stop.wait(every):
        counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        first = first if first is not None else counts
        diff = counts.copy()
        diff.subtract(first)
        changed = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15]
        line = {"t": round(time.monotonic() - started), "blocks": sys.getallocatedblocks(),
                "objects": sum(counts.values()), "malloc": _mallinfo(),
                "changed": dict(changed)}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
        del counts, diff


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.soak_exporter",
        description="gpuscope-exporter over a fake libnvidia-ml driven from stdin (soak only).",
        epilog="Arguments after '--' go to gpuscope-exporter (--source is forced to nvml).",
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--driver-tick", type=float, default=0.1,
                        help="seconds between per-process utilization samples (default 0.1)")
    args, rest = parser.parse_known_args(argv)
    exporter_args = [a for a in rest if a != "--"]
    _die_with_parent()

    fake = build_node(args.gpus)
    stop = threading.Event()
    threading.Thread(
        target=_drive, args=(Driver(fake), args.driver_tick, stop), name=DRIVER_THREAD_NAME,
        daemon=True,
    ).start()
    trim_every = os.environ.get("SOAK_MALLOC_TRIM")
    if trim_every:  # diagnosis: does RSS creep go away when glibc returns free pages?
        libc = ctypes.CDLL("libc.so.6")

        def trim() -> None:
            while not stop.wait(float(trim_every)):
                libc.malloc_trim(0)

        threading.Thread(target=trim, name="soak-malloc-trim", daemon=True).start()
    objects = os.environ.get("SOAK_OBJECTS")
    if objects:
        every = float(os.environ.get("SOAK_TRACEMALLOC_EVERY", "60"))
        threading.Thread(target=_count_objects, args=(objects, every, stop),
                         name="soak-objects", daemon=True).start()
    trace = os.environ.get("SOAK_TRACEMALLOC")
    if trace:
        import tracemalloc

        tracemalloc.start(12)
        every = float(os.environ.get("SOAK_TRACEMALLOC_EVERY", "60"))
        threading.Thread(target=_trace_memory, args=(trace, every, stop),
                         name="soak-tracemalloc", daemon=True).start()

    return run_exporter_over(fake, exporter_args, stop)


if __name__ == "__main__":
    sys.exit(main())

"""Run the real exporter (``gpuscope.exporter.cli.main``) over a fake libnvidia-ml written in C.

Used by ``bench/exporter_bench.py --source nvml-c``; not a test. Like
``bench/nvml_fake_exporter.py`` (``--source nvml-fake``) it runs ``gpuscope-exporter --source
nvml`` with ``NvmlSource(library_loader=...)``, but the library is
``bench/fake_libnvml/fake_nvml.c``, compiled into a shared object and opened with
``ctypes.CDLL`` as pynvml opens ``libnvidia-ml.so.1``: the NVML calls cost what native calls
cost, and no Python test double runs in the exporter process. The node is the same as
``build_node(--gpus, --processes-per-gpu)``'s (same UUIDs, PIDs, memory, readings); the
library synthesizes the per-process utilization samples from the clock, so there is no
driver tick thread either.

The library is built with ``gcc`` (or ``$CC``) into ``bench/fake_libnvml/build/`` (ignored by
git), named by a hash of the source, so an edited source is rebuilt; ``--library`` uses one
built beforehand instead.

Run from the repository root::

    python3 -m bench.nvml_c_exporter --gpus 8 --processes-per-gpu 64 -- \
        --listen 127.0.0.1:9463 --interval 1
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from bench.nvml_fake_exporter import (
    add_gpm_arguments,
    build_node,
    gpm_source_kwargs,
    run_exporter_over,
    write_proc_tree,
)

SOURCE = Path(__file__).resolve().parent / "fake_libnvml" / "fake_nvml.c"
DEFAULT_BUILD_DIR = SOURCE.parent / "build"
CFLAGS = ("-O2", "-shared", "-fPIC")
LIBRARY_STEM = "libnvidia-ml-fake"
# Seconds of per-process samples the library keeps: nvml_fake_exporter.BUFFER_TICKS ticks.
HISTORY_SECONDS = 4


class BuildError(RuntimeError):
    """The library could not be built; the message is one line."""


def build_library(build_dir: Path | None = None, compiler: str | None = None) -> Path:
    """The path of the compiled library, building it first when it is missing or its source
    (or the compiler or flags) changed since. Raises :class:`BuildError`."""
    cc = compiler or os.environ.get("CC") or "gcc"
    directory = build_dir or DEFAULT_BUILD_DIR
    try:
        source = SOURCE.read_bytes()
    except OSError as exc:
        raise BuildError(f"cannot read {SOURCE}: {exc.strerror}") from exc
    digest = hashlib.sha256(b"\0".join([source, cc.encode(), *(f.encode() for f in CFLAGS)]))
    target = directory / f"{LIBRARY_STEM}-{digest.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    exe = shutil.which(cc)
    if exe is None:
        raise BuildError(
            f"cannot build the fake libnvidia-ml: C compiler {cc!r} not found (install gcc, "
            "or set CC)"
        )
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [exe, *CFLAGS, "-o", str(partial), str(SOURCE)],
            capture_output=True, text=True, timeout=120, check=False,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["no output"]
            first = next((line for line in lines if "error" in line), lines[0])
            raise BuildError(f"{cc} failed on {SOURCE.name} ({done.returncode}): {first}")
        os.replace(partial, target)  # atomic: a concurrent build sees all of it or nothing
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"cannot build the fake libnvidia-ml in {directory}: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
    for old in directory.glob(f"{LIBRARY_STEM}-*.so"):
        if old != target:
            with contextlib.suppress(OSError):
                old.unlink()  # builds of older sources (a process still using one keeps it)
    return target


def library_env(
    gpus: int, processes_per_gpu: int, history_seconds: int = HISTORY_SECONDS, gpm: bool = True
) -> dict[str, str]:
    """The environment that sets the node the library builds at its ``nvmlInit``."""
    return {
        "FAKE_NVML_GPUS": str(gpus),
        "FAKE_NVML_PROCESSES_PER_GPU": str(processes_per_gpu),
        "FAKE_NVML_HISTORY_SECONDS": str(history_seconds),
        "FAKE_NVML_GPM": "1" if gpm else "0",
    }


def configure(
    gpus: int, processes_per_gpu: int, history_seconds: int = HISTORY_SECONDS, gpm: bool = True
) -> None:
    """Set the node the library builds at its next ``nvmlInit`` (in this process' environment)."""
    os.environ.update(library_env(gpus, processes_per_gpu, history_seconds, gpm))


def load_library(path: Path) -> ctypes.CDLL:
    """Open the library as pynvml opens ``libnvidia-ml.so.1``."""
    return ctypes.CDLL(str(path))


def write_proc_tree_for(root: Path, gpus: int, processes_per_gpu: int) -> None:
    """``nvml_fake_exporter.write_proc_tree`` for the node the library plays: the PIDs come
    from the Python double's ``build_node`` (the same), which is dropped afterwards; the
    exporter's NVML calls never reach it."""
    write_proc_tree(root, build_node(gpus, processes_per_gpu))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.nvml_c_exporter",
        description="gpuscope-exporter --source nvml over a fake libnvidia-ml in C "
                    "(benchmark only).",
        epilog="Arguments after '--' go to gpuscope-exporter (--source is forced to nvml).",
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes-per-gpu", type=int, default=64)
    parser.add_argument("--proc-tree", type=Path, metavar="DIR",
                        help="write a /proc tree for the fake PIDs into DIR and pass "
                             "--proc-root DIR to the exporter")
    parser.add_argument("--library", type=Path, metavar="SO",
                        help="the compiled fake library (default: build it if needed)")
    parser.add_argument("--build-dir", type=Path, metavar="DIR",
                        help=f"where to build the library (default {DEFAULT_BUILD_DIR})")
    add_gpm_arguments(parser)
    args, rest = parser.parse_known_args(argv)
    exporter_args = [a for a in rest if a != "--"]
    if args.gpus < 0 or args.processes_per_gpu < 0:
        parser.error("--gpus and --processes-per-gpu must not be negative")

    try:
        path = args.library or build_library(args.build_dir)
        library = load_library(path)
    except (BuildError, OSError) as exc:
        print(f"nvml_c_exporter: error: {exc}", file=sys.stderr)
        return 2
    configure(args.gpus, args.processes_per_gpu, gpm=args.gpm)
    if args.proc_tree is not None:
        write_proc_tree_for(args.proc_tree, args.gpus, args.processes_per_gpu)
        exporter_args += ["--proc-root", str(args.proc_tree)]

    print(
        f"nvml-c: {args.gpus} GPUs x {args.processes_per_gpu} processes, library {path}",
        file=sys.stderr,
    )
    return run_exporter_over(library, exporter_args, threading.Event(), gpm_source_kwargs(args))


if __name__ == "__main__":
    sys.exit(main())

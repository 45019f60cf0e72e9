"""Benchmark of gpuscope-exporter on one busy node: CPU, RSS, scrape latency, series count.

Not a test. It starts the real exporter as a separate process on loopback, waits for
``/readyz``, warms up, then for ``--duration`` seconds scrapes ``/metrics`` once per
``--scrape-interval`` (default: every second) and reports:

* CPU: percent of one core used by the exporter process (all its threads), from the
  ``utime + stime`` delta of ``/proc/<pid>/stat`` over the measured window only (start-up and
  warm-up excluded), divided by the window's wall time;
* RSS: ``VmRSS`` of ``/proc/<pid>/status`` sampled after every scrape (peak and at the end of
  the window) and ``VmHWM`` (the kernel's high-water mark since the process started, so it
  includes start-up);
* scrape latency p50/p99: client side, from sending ``GET /metrics`` to reading the last
  byte, over one kept-alive HTTP/1.1 connection, uncompressed (``Accept-Encoding: identity``,
  no ``Accept`` header, so the Prometheus text format 0.0.4); ``--openmetrics`` and
  ``--gzip`` send what Prometheus sends instead;
* series: the sample lines of the last scrape.

Sources (``--source``):

* ``simulated``: ``python3 -m exporter --source simulated --scenario FILE``, FILE written from
  ``gpuscope.exporter.sources.scenario.synthetic_scenario(gpus, processes_per_gpu)``;
* ``nvml-fake``: ``python3 -m bench.nvml_fake_exporter``, the real NvmlSource and pynvml over
  the FakeNvml double of libnvidia-ml (see that module), with a driver-tick thread in the
  exporter process whose CPU is reported separately. Attribution runs on live inputs as on a
  node: a ``/proc`` tree with a ``stat`` and ``cgroup`` file per fake PID, and (unless
  ``--no-kubelet``) a fake kubelet PodResources server on a unix socket, in a process of its
  own so its CPU is not counted, and (unless ``--no-api-server``) a fake API server (the
  tests' ``FakeApi``, real HTTPS, in a process of its own) that serves this node and its
  pods through a kubeconfig with a CA file and a token file, as a pod's service account has
  them (``--api-plain-http``: plain HTTP), so every process is named per container as on a
  node.
* ``nvml-c``: ``python3 -m bench.nvml_c_exporter``, the same as ``nvml-fake`` (same node,
  ``/proc`` tree and fake kubelet) but libnvidia-ml is ``bench/fake_libnvml/fake_nvml.c``,
  built with gcc and opened with ``ctypes.CDLL``: no Python double is imported or run in the
  exporter process (the benchmark writes the ``/proc`` tree itself), and no driver tick
  thread (the library synthesizes its samples from the clock).

With the NVML sources, GPM (the work signals' SM/tensor/DRAM activity) is answered by the
doubles as on Hopper and sampled at the exporter's own GPM cadence; ``--gpm-interval
SECONDS`` sets it (``0``: every sampling round, the worst case) and ``--no-gpm`` has the
library answer that it has no GPM, to compare.

``--import-costs`` measures instead the RSS and import time that each module the exporter
loads adds, each step in a fresh interpreter. ``--profile FILE`` records a py-spy profile of
the measured window (collapsed stacks), which perturbs the numbers a little.

Run from the repository root::

    python3 bench/exporter_bench.py --source simulated
    python3 bench/exporter_bench.py --source nvml-fake --process-metrics --json
    python3 bench/exporter_bench.py --source nvml-c
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gzip
import http.client
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The node the fake API server serves: tests.exporter.kubernetes.test_apiserver.NODE.
BENCH_NODE = "ip-10-0-12-34.ec2.internal"

# Targets from issue 2, item 7; nvitop-exporter measured on the same load (ANCHORS.md).
TARGET_CPU_PERCENT = 1.0
TARGET_RSS_MIB = 45.0  # issue 13 (with the kubelet and the API server on); was 35
TARGET_P50_MS = 3.0
NVITOP_REFERENCE = {"cpu_percent": 4.0, "rss_mb": 33.0, "scrape_ms": 15.0, "series": 756}

FAKE_TICK_THREAD = "fake-nvml-tick"  # bench/nvml_fake_exporter.py names its thread so


# ---------------------------------------------------------------------------------------------
# /proc readers


def cpu_ticks(pid: int, task: int | None = None) -> int:
    """utime + stime (clock ticks) of a process (all threads) or of one of its threads."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    text = Path(path).read_text()
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of a process, in KiB."""
    wanted = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            out[key] = int(value.split()[0])
    return out


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Per thread (tid): OS thread name and utime + stime ticks."""
    out: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            tid = int(task.name)
            out[tid] = ((task / "comm").read_text().strip(), cpu_ticks(pid, tid))
    return out


# ---------------------------------------------------------------------------------------------
# Machine and versions


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {}
    for dist in ("prometheus-client", "nvidia-ml-py", "PyYAML", "grpcio", "protobuf"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    git: dict[str, str] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
            timeout=10,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "exporter"], cwd=REPO, capture_output=True,
            text=True, timeout=10,
        ).stdout.splitlines()
        git["exporter_changes"] = f"{len(changed)} uncommitted file(s) under exporter/"
    return {
        "git": git,
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "packages": versions,
    }


# ---------------------------------------------------------------------------------------------
# Starting the exporter


def write_scenario(path: Path, gpus: int, processes_per_gpu: int) -> None:
    """Write ``synthetic_document(gpus, processes_per_gpu)`` as a scenario YAML file."""
    import yaml

    from gpuscope.exporter.sources.scenario import load_scenario, synthetic_document

    path.write_text(yaml.safe_dump(synthetic_document(gpus, processes_per_gpu), sort_keys=False),
                    encoding="utf-8")
    load_scenario(path)  # fails loudly here rather than in the exporter


def free_port() -> int:
    """A loopback port for the exporter (``tests/ports.py``: safe beside other test files
    running in parallel; the repository is on ``sys.path`` by then, see :func:`main`)."""
    from tests.ports import free_port as pick

    return pick()


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the benchmark process dies (Linux), so no exporter is
    left behind even if the benchmark is killed with SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class Exporter:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    command: list[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> int | None:
        return stop_process(self.proc)


def serve_fake_kubelet(socket_path: Path, gpus: int, processes_per_gpu: int) -> None:
    """A PodResources v1 ``List`` server on a unix socket (grpcio), answering the allocations
    of the nvml-fake node: each GPU shared by up to four pods through time-slicing replicas
    (device IDs ``<uuid>::<replica>``), as in ``synthetic_scenario``. Runs until SIGTERM, in
    a process of its own (``--serve-fake-kubelet``), so neither its CPU nor grpc's fork
    handlers touch the benchmark or the exporter."""
    from concurrent import futures

    import grpc

    from bench.nvml_fake_exporter import build_node, pods_per_gpu
    from tests.kubelet_api import podresources_v1_pb2 as pb2
    from tests.kubelet_api import podresources_v1_pb2_grpc as pb2_grpc

    pods = []
    n = pods_per_gpu(processes_per_gpu)
    for gpu in build_node(gpus, 0).gpus:
        for r in range(n):
            device = pb2.ContainerDevices(
                resource_name="nvidia.com/gpu",
                device_ids=[f"{gpu.uuid}::{r}" if n > 1 else gpu.uuid],
            )
            pods.append(pb2.PodResources(
                name=f"synth-{gpu.index}-{r}", namespace="synthetic",
                containers=[pb2.ContainerResources(name="main", devices=[device])],
            ))
    answer = pb2.ListPodResourcesResponse(pod_resources=pods)

    class Servicer(pb2_grpc.PodResourcesListerServicer):
        def List(self, request: Any, context: Any) -> Any:  # the generated method name
            return answer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_PodResourcesListerServicer_to_server(  # type: ignore[no-untyped-call]
        Servicer(), server
    )
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    _die_with_parent()
    with sigterm_as_exit(), contextlib.suppress(SystemExit, KeyboardInterrupt):
        server.wait_for_termination()
    server.stop(grace=None).wait(5)


def start_fake_kubelet(args: argparse.Namespace, socket_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve-fake-kubelet", str(socket_path),
         "--gpus", str(args.gpus), "--processes-per-gpu", str(args.processes_per_gpu)],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise RuntimeError("the fake kubelet did not start")
        time.sleep(0.05)
    return proc


def serve_fake_api(
    port_file: Path, gpus: int, processes_per_gpu: int, tls_dir: Path | None = None
) -> None:
    """An API server (``FakeApi`` of the tests, real HTTP) serving this node and the pods of
    the nvml-fake node, with the pod UIDs and container IDs of the ``/proc`` tree, so the
    exporter names every process as on a node. Over HTTPS with ``tls_dir``'s
    ``server.crt``/``server.key``. Writes its port to ``port_file``, then runs until SIGTERM
    in a process of its own (``--serve-fake-api``)."""
    import ssl

    from bench.nvml_fake_exporter import container_id, pod_uid, pods_per_gpu
    from tests.exporter.kubernetes.test_apiserver import FakeApi, pod_json

    tls = None
    if tls_dir is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(str(tls_dir / "server.crt"), str(tls_dir / "server.key"))
    api = FakeApi(port=0, tls=tls)
    n = pods_per_gpu(processes_per_gpu)
    for gpu in range(gpus):
        for r in range(n):
            api.put(pod_json(
                f"synth-{gpu}-{r}", pod_uid(gpu, r), namespace="synthetic",
                labels={"job-name": f"train-{gpu}"},
                owners=[{"apiVersion": "batch/v1", "kind": "Job", "name": f"train-{gpu}",
                         "uid": f"job-{gpu}", "controller": True}],
                containers=[("main", container_id(gpu, r))],
            ))
    api.start()
    port_file.write_text(str(api.port))
    _die_with_parent()
    with sigterm_as_exit(), contextlib.suppress(SystemExit, KeyboardInterrupt):
        threading.Event().wait()
    api.stop()


def start_fake_api(args: argparse.Namespace, workdir: Path) -> subprocess.Popen[bytes]:
    """``serve_fake_api`` in its own process, and a kubeconfig for the exporter to reach it
    (``workdir/kubeconfig``). As in a pod's service account: HTTPS with the cluster's CA
    certificate in a file and a bearer token file; ``--api-plain-http``: plain HTTP and the
    token in the kubeconfig (no CA, so the client loads the system trust store)."""
    from tests.exporter.kubernetes.test_apiserver import TOKEN, write_kubeconfig

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    port_file = workdir / "api.port"
    tls_args: list[str] = []
    if not args.api_plain_http:
        from tests.pki import TestCA

        ca = TestCA("bench-cluster-ca")
        server = ca.issue("kube-apiserver", server=True, sans=["127.0.0.1"])
        (workdir / "ca.crt").write_bytes(ca.cert_pem)
        (workdir / "server.crt").write_bytes(server.cert_pem)
        (workdir / "server.key").write_bytes(server.key_pem)
        (workdir / "token").write_text(TOKEN)
        tls_args = ["--fake-api-tls-dir", str(workdir)]
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve-fake-api", str(port_file),
         "--gpus", str(args.gpus), "--processes-per-gpu", str(args.processes_per_gpu),
         *tls_args],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise RuntimeError("the fake API server did not start")
        time.sleep(0.05)
    port = port_file.read_text()
    if args.api_plain_http:
        write_kubeconfig(workdir / "kubeconfig", f"http://127.0.0.1:{port}", {"token": TOKEN})
    else:
        write_kubeconfig(workdir / "kubeconfig", f"https://127.0.0.1:{port}",
                         {"tokenFile": str(workdir / "token")},
                         {"certificate-authority": str(workdir / "ca.crt")})
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, then SIGKILL after 10 s; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


def python_argv(args: argparse.Namespace) -> list[str]:
    """The interpreter, with ``-S`` under ``--no-site`` (see :func:`child_env`)."""
    return [args.python, "-S"] if args.no_site else [args.python]


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment of the exporter and the import probes: this checkout first on the path,
    no ``GPUSCOPE_*`` from the caller (the flags are the whole config), no in-cluster API
    server settings. Under ``--no-site``
    the interpreter runs with ``-S`` and finds its site-packages through ``PYTHONPATH``
    instead, so no ``.pth`` file runs at start-up: what a slim container image does, and not
    what a developer machine whose ``.pth`` hooks import extra modules into every process
    does."""
    env = {
        k: v for k, v in os.environ.items()
        # Loopback only: no in-cluster API server even when run inside a pod.
        if not k.startswith(("GPUSCOPE_", "KUBERNETES_SERVICE_")) and k != "NODE_NAME"
    }
    paths = [str(REPO)]
    if args.no_site:
        out = subprocess.run(
            [args.python, "-c", "import site, json; print(json.dumps(site.getsitepackages()))"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        paths += json.loads(out.stdout)
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def exporter_command(
    args: argparse.Namespace, port: int, scenario: Path | None, workdir: Path
) -> list[str]:
    common = [
        "--listen", f"127.0.0.1:{port}",
        "--interval", f"{args.interval:g}",
        "--node-name", "bench",
        "--log-level", args.log_level,
    ]
    if args.process_metrics:
        common.append("--process-metrics")
    if args.source == "simulated":
        assert scenario is not None
        return [*python_argv(args), "-m", "gpuscope.exporter", "--source", "simulated",
                "--scenario", str(scenario), *common]
    if args.source == "nvml-c" and args.gpm_interval is None:
        # The console script's own module, nothing of the benchmark in the process: pynvml
        # finds the C library as libnvidia-ml.so.1 on LD_LIBRARY_PATH (start_exporter), as it
        # finds the driver's on a node.
        return [*python_argv(args), "-m", "gpuscope.exporter", "--source", "nvml", *common,
                "--proc-root", str(workdir / "proc"),
                "--kubelet-socket", str(workdir / "kubelet.sock"),
                *(["--kubeconfig", str(workdir / "kubeconfig"), "--node-name", BENCH_NODE]
                  if args.api_server else [])]
    runner = ["-m", "bench.nvml_fake_exporter"]
    if args.source == "nvml-c":
        runner = ["-m", "bench.nvml_c_exporter", "--library", str(args.fake_library)]
    if args.gpm_interval is not None:
        runner += ["--gpm-interval", f"{args.gpm_interval:g}"]
    if not args.gpm:
        runner.append("--no-gpm")
    # The /proc tree of the fake PIDs: nvml-fake writes it from its double; for nvml-c the
    # benchmark writes it (start_exporter), so that no Python double of the node is built or
    # imported in the exporter process (it added ~1.6 MiB RSS there, issue 13 round 4).
    proc_tree = ["--proc-tree", str(workdir / "proc")]
    if args.source == "nvml-c":
        proc_tree = []
        common += ["--proc-root", str(workdir / "proc")]
    return [*python_argv(args), *runner,
            "--gpus", str(args.gpus), "--processes-per-gpu", str(args.processes_per_gpu),
            *proc_tree, "--",
            *common, "--kubelet-socket", str(workdir / "kubelet.sock"),
            *(["--kubeconfig", str(workdir / "kubeconfig"), "--node-name", BENCH_NODE]
              if args.api_server else [])]


# What --bytecode installs beside gpuscope.exporter: what bench/nvml_fake_exporter.py imports.
INSTALLED_FILES = ("tests/__init__.py", "tests/exporter/__init__.py",
                   "tests/exporter/sources/__init__.py", "tests/exporter/sources/fake_nvml.py")

#: The environment the exporter image sets for the exporter (Dockerfile, stage ``exporter``;
#: tests/deploy/test_dockerfile.py keeps the two equal). ``PYTHONOPTIMIZE=2``: no docstrings
#: and no ``assert`` in memory, from bytecode the image compiles at that level;
#: ``MALLOC_ARENA_MAX=2``: the exporter's threads share two glibc arenas instead of one each.
IMAGE_ENV = {"PYTHONOPTIMIZE": "2", "MALLOC_ARENA_MAX": "2"}


def precompile(args: argparse.Namespace, workdir: Path) -> Path:
    """A copy of this checkout's ``exporter`` package laid out as installed
    (``gpuscope/exporter``), with ``bench`` and the fake NVML, byte-compiled in place as
    ``pip install`` compiles an installed package (at the interpreter's optimization level:
    ``PYTHONOPTIMIZE`` of the exporter's environment); returns its root, to run the exporter
    from (first on ``PYTHONPATH``, so ``gpuscope.exporter`` is found there before the
    checkout's editable install).

    Without it an interpreter with ``PYTHONDONTWRITEBYTECODE`` set (this machine, and the
    image) compiles every gpuscope module from source at each start. (Not
    ``PYTHONPYCACHEPREFIX``: that would make every other module, site-packages included,
    compile from source too.)"""
    root = workdir / "installed"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "exporter", root / "gpuscope" / "exporter", ignore=ignore)
    shutil.copytree(REPO / "bench", root / "bench", ignore=ignore)
    for name in INSTALLED_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    subprocess.run(
        [args.python, "-m", "compileall", "-q", str(root)], cwd=root, env=exporter_env(args),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=300, check=True,
    )
    return root


def exporter_env(args: argparse.Namespace) -> dict[str, str]:
    """:func:`child_env`, with :data:`IMAGE_ENV` under ``--as-image``."""
    env = child_env(args)
    if args.as_image:
        env.update(IMAGE_ENV)
    return env


def compile_libraries(args: argparse.Namespace) -> None:
    """Under ``--as-image``: the interpreter's standard library and site-packages
    byte-compiled at the image's optimization level, in place, as the image's build does
    (``python -m compileall -o 2``; files already compiled are skipped, so only the first
    run takes time). Without them an optimizing interpreter compiles every module it imports
    from source, at every start."""
    level = IMAGE_ENV["PYTHONOPTIMIZE"]
    out = subprocess.run(
        [args.python, "-c", "import json, site, sysconfig; print(json.dumps("
         "[sysconfig.get_path('stdlib'), *site.getsitepackages()]))"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    dirs = [d for d in json.loads(out.stdout) if os.path.isdir(d)]
    done = subprocess.run(
        [args.python, "-m", "compileall", "-q", "-j", "0", "-o", level, *dirs],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        timeout=900, check=False, text=True,
    )
    if done.returncode != 0:  # e.g. a read-only system library: said, not fatal
        lines = done.stderr.strip().splitlines()
        print(f"exporter_bench: warning: compileall -o {level} returned {done.returncode}"
              f"{': ' + lines[-1] if lines else ''}", file=sys.stderr)


def fake_library_env(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """What the exporter's environment needs for ``--source nvml-c``: the node the C library
    plays (``bench.nvml_c_exporter.library_env``) and, for the plain console-script command,
    a directory on ``LD_LIBRARY_PATH`` where the library is ``libnvidia-ml.so.1``."""
    from bench.nvml_c_exporter import library_env

    env = library_env(args.gpus, args.processes_per_gpu, gpm=args.gpm)
    libdir = workdir / "lib"
    libdir.mkdir(exist_ok=True)
    (libdir / "libnvidia-ml.so.1").symlink_to(Path(args.fake_library).resolve())
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(libdir), os.environ.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def start_exporter(args: argparse.Namespace, workdir: Path) -> Exporter:
    scenario = None
    if args.source == "simulated":
        scenario = workdir / f"synthetic-{args.gpus}x{args.processes_per_gpu}.yaml"
        write_scenario(scenario, args.gpus, args.processes_per_gpu)
    elif args.source == "nvml-c":
        from bench.nvml_c_exporter import write_proc_tree_for

        write_proc_tree_for(workdir / "proc", args.gpus, args.processes_per_gpu)
    port = free_port()
    command = exporter_command(args, port, scenario, workdir)
    log_path = workdir / "exporter.log"
    env = exporter_env(args)
    if args.source == "nvml-c":
        env.update(fake_library_env(args, workdir))
    cwd = REPO
    if args.bytecode:
        cwd = precompile(args, workdir)
        env["PYTHONPATH"] = os.pathsep.join([str(cwd), env["PYTHONPATH"]])
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            preexec_fn=_die_with_parent,
        )
    return Exporter(proc, port, log_path, command)


def wait_ready(exp: Exporter, timeout: float) -> float:
    """Poll /readyz until 200; returns seconds from spawn. Raises on exit or timeout."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if exp.proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {exp.proc.returncode}:\n{exp.log_tail()}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=2)
            try:
                conn.request("GET", "/readyz")
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    return time.monotonic() - started
            finally:
                conn.close()
        time.sleep(0.05)
    raise RuntimeError(f"exporter not ready after {timeout:g} s:\n{exp.log_tail()}")


# ---------------------------------------------------------------------------------------------
# Scraping


class Scraper:
    """GET /metrics over one kept-alive connection (reconnects, and counts it, if dropped)."""

    def __init__(self, port: int, headers: dict[str, str], timeout: float = 5.0) -> None:
        self._port = port
        self._headers = headers
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self.connects = 0
        self.wire_bytes = 0

    def scrape(self) -> tuple[float, bytes]:
        """(latency in seconds, body). The connection is opened outside the timed part;
        ``wire_bytes`` is the size of the last body as sent (compressed or not)."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=self._timeout)
            self._conn.connect()
            self.connects += 1
        conn = self._conn
        try:
            started = time.perf_counter()
            # Without headers http.client sends "Accept-Encoding: identity": no gzip.
            conn.request("GET", "/metrics", headers=self._headers)
            resp = conn.getresponse()
            body = resp.read()
            latency = time.perf_counter() - started
            self.wire_bytes = len(body)
            if resp.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)  # outside the timed part
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered {resp.status}")
        if resp.will_close:
            self.close()
        return latency, body

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


# What Prometheus 2.x/3.x sends by default (OpenMetrics preferred, gzip).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def scrape_headers(args: argparse.Namespace) -> dict[str, str]:
    headers: dict[str, str] = {}
    if args.openmetrics:
        headers["Accept"] = PROMETHEUS_ACCEPT
    if args.gzip:
        headers["Accept-Encoding"] = "gzip"
    return headers


def count_series(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


def describe_format(r: Result) -> str:
    fmt = "OpenMetrics (Prometheus' Accept header)" if r.openmetrics else "text 0.0.4"
    return f"{fmt}, {'gzip' if r.gzip else 'uncompressed'}"


def parse_exposition(body: bytes) -> tuple[int, dict[str, int], dict[str, float]]:
    """(series count, series per metric name, last sampling round's part durations)."""
    per_name: dict[str, int] = {}
    parts: dict[str, float] = {}
    total = 0
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        total += 1
        name = m.group(1)
        per_name[name] = per_name.get(name, 0) + 1
        if name == "gpu_exporter_collector_duration_seconds" and m.group(2):
            part = re.search(r'collector="([^"]*)"', m.group(2))
            if part:
                parts[part.group(1)] = float(m.group(3))
    return total, per_name, parts


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# ---------------------------------------------------------------------------------------------
# Profiling (optional)


def py_spy() -> str | None:
    return shutil.which("py-spy")


def thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name, from ``py-spy dump`` (empty without py-spy)."""
    exe = py_spy()
    if exe is None:
        return {}
    try:
        out = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json"], capture_output=True, timeout=30,
            check=True,
        ).stdout
        dumped = json.loads(out)
    except (subprocess.SubprocessError, OSError, ValueError):
        return {}
    names: dict[int, str] = {}
    for thread in dumped if isinstance(dumped, list) else []:
        tid = thread.get("os_thread_id")
        if isinstance(tid, int):
            names[tid] = str(thread.get("thread_name") or "")
    return names


def start_profile(pid: int, seconds: float, out: Path, rate: int) -> subprocess.Popen[bytes]:
    exe = py_spy()
    if exe is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(int(seconds) + 1),
         "--rate", str(rate), "--format", "raw", "--threads", "--nonblocking",
         "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


# ---------------------------------------------------------------------------------------------
# The measurement


@dataclass
class ThreadCpu:
    tid: int
    os_name: str
    python_name: str
    cpu_percent: float


@dataclass
class Result:
    source: str
    process_metrics: bool
    openmetrics: bool
    gzip: bool
    no_site: bool
    bytecode: bool
    as_image: bool
    gpus: int
    processes_per_gpu: int
    interval_s: float
    scrape_interval_s: float
    duration_s: float
    command: list[str]
    startup_s: float
    rss_at_ready_mib: float
    window_s: float
    cpu_percent: float
    fake_driver_tick_cpu_percent: float | None
    rss_start_mib: float
    rss_peak_mib: float
    rss_end_mib: float
    rss_hwm_mib: float
    rss_anon_end_mib: float
    rss_file_end_mib: float
    scrapes: int
    scrape_failures: int
    connects: int
    scrape_p50_ms: float
    scrape_p99_ms: float
    scrape_max_ms: float
    scrape_mean_ms: float
    body_bytes: int
    wire_bytes: int
    series: int
    series_min: int
    series_max: int
    series_by_metric: dict[str, int]
    sample_parts_s: dict[str, float]
    threads: list[ThreadCpu] = field(default_factory=list)
    profile: str | None = None
    kubelet: bool = False
    api_server: bool = False
    api_https: bool = False  # the fake API server over HTTPS (CA file + token file)
    loadavg: list[float] = field(default_factory=list)  # 1-min load at window start and end
    machine: dict[str, Any] = field(default_factory=dict)
    gpm: str = ""  # NVML sources: how GPM was sampled

    def verdicts(self) -> dict[str, str]:
        return {
            "cpu": verdict(self.cpu_percent, TARGET_CPU_PERCENT, " points"),
            "rss_peak": verdict(self.rss_peak_mib, TARGET_RSS_MIB, " MiB"),
            "rss_end": verdict(self.rss_end_mib, TARGET_RSS_MIB, " MiB"),
            "scrape_p50": verdict(self.scrape_p50_ms, TARGET_P50_MS, " ms"),
        }


def verdict(value: float, target: float, unit: str) -> str:
    if value <= target:
        return "met"
    over = value - target
    return f"missed by {over:.2f}{unit} ({over / target:.0%})"


def measure(args: argparse.Namespace) -> Result:
    if args.source == "nvml-c":
        # Built here, before the exporter starts: a build is not start-up time, and a missing
        # gcc is one line from main().
        from bench.nvml_c_exporter import build_library

        args.fake_library = build_library()
    if args.as_image:
        compile_libraries(args)
    with tempfile.TemporaryDirectory(prefix="gpuscope-bench-") as tmp:
        kubelet = api = None
        if args.source in ("nvml-fake", "nvml-c") and args.kubelet:
            kubelet = start_fake_kubelet(args, Path(tmp) / "kubelet.sock")
        if args.source in ("nvml-fake", "nvml-c") and args.api_server:
            api = start_fake_api(args, Path(tmp))
        try:
            exp = start_exporter(args, Path(tmp))
            try:
                result = _measure(args, exp)
            finally:
                code = exp.stop()
                if code not in (0, None) and args.verbose:
                    print(f"exporter exit code {code}:\n{exp.log_tail()}", file=sys.stderr)
        finally:
            if kubelet is not None:
                stop_process(kubelet)
            if api is not None:
                stop_process(api)
        result.kubelet = kubelet is not None
        result.api_server = api is not None
        result.api_https = api is not None and not args.api_plain_http
        return result


def _measure(args: argparse.Namespace, exp: Exporter) -> Result:
    startup = wait_ready(exp, args.startup_timeout)
    rss_at_ready = memory_kib(exp.pid)["VmRSS"] / 1024
    scraper = Scraper(exp.port, scrape_headers(args))
    profiler: subprocess.Popen[bytes] | None = None
    try:
        # Warm-up: first scrapes pay one-off costs (lazy imports, first allocations).
        warm_end = time.monotonic() + args.warmup
        while time.monotonic() < warm_end:
            scraper.scrape()
            time.sleep(min(args.scrape_interval, max(0.0, warm_end - time.monotonic())))

        profile_path: Path | None = None
        if args.profile:
            profile_path = Path(args.profile).resolve()
            profiler = start_profile(exp.pid, args.duration, profile_path, args.profile_rate)

        load_before = os.getloadavg()
        threads_before = thread_ticks(exp.pid)
        ticks_before = cpu_ticks(exp.pid)
        started = time.monotonic()
        latencies: list[float] = []
        rss_seen: list[int] = []
        series_seen: list[int] = []
        failures = 0
        body = b""
        n = 0
        while True:
            due = started + n * args.scrape_interval
            if due >= started + args.duration:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            if exp.proc.poll() is not None:
                raise RuntimeError(f"exporter died during the run:\n{exp.log_tail()}")
            try:
                latency, body = scraper.scrape()
                latencies.append(latency)
                series_seen.append(count_series(body))
            except (OSError, http.client.HTTPException, RuntimeError):
                failures += 1
            rss_seen.append(memory_kib(exp.pid)["VmRSS"])
            n += 1
        time.sleep(max(0.0, started + args.duration - time.monotonic()))
        ticks_after = cpu_ticks(exp.pid)
        window = time.monotonic() - started
        threads_after = thread_ticks(exp.pid)
        mem_end = memory_kib(exp.pid)
        load_after = os.getloadavg()
        # While the scrape connection (and so its handler thread) still exists.
        names = thread_names(exp.pid) if args.thread_names else {}
    finally:
        scraper.close()
        if profiler is not None:
            try:
                profiler.wait(30)
            except subprocess.TimeoutExpired:
                profiler.kill()
                profiler.wait()
    if not latencies:
        raise RuntimeError(f"no successful scrape:\n{exp.log_tail()}")

    def pct(ticks: int) -> float:
        return ticks / CLK_TCK / window * 100

    threads: list[ThreadCpu] = []
    fake_tick: float | None = None
    for tid, (os_name, after) in sorted(threads_after.items()):
        before = threads_before.get(tid, (os_name, 0))[1]
        share = pct(after - before)
        if os_name == FAKE_TICK_THREAD:
            fake_tick = (fake_tick or 0.0) + share
        threads.append(ThreadCpu(tid, os_name, names.get(tid, ""), round(share, 3)))

    series, per_name, parts = parse_exposition(body)
    ms = [x * 1000 for x in latencies]
    return Result(
        source=args.source,
        process_metrics=args.process_metrics,
        openmetrics=args.openmetrics,
        gzip=args.gzip,
        no_site=args.no_site,
        bytecode=args.bytecode,
        as_image=args.as_image,
        gpus=args.gpus,
        processes_per_gpu=args.processes_per_gpu,
        interval_s=args.interval,
        scrape_interval_s=args.scrape_interval,
        duration_s=args.duration,
        command=exp.command,
        startup_s=round(startup, 3),
        rss_at_ready_mib=round(rss_at_ready, 2),
        window_s=round(window, 3),
        cpu_percent=round(pct(ticks_after - ticks_before), 3),
        fake_driver_tick_cpu_percent=None if fake_tick is None else round(fake_tick, 3),
        rss_start_mib=round(rss_seen[0] / 1024, 2),
        rss_peak_mib=round(max(rss_seen) / 1024, 2),
        rss_end_mib=round(mem_end["VmRSS"] / 1024, 2),
        rss_hwm_mib=round(mem_end["VmHWM"] / 1024, 2),
        rss_anon_end_mib=round(mem_end.get("RssAnon", 0) / 1024, 2),
        rss_file_end_mib=round(mem_end.get("RssFile", 0) / 1024, 2),
        scrapes=len(latencies),
        scrape_failures=failures,
        connects=scraper.connects,
        scrape_p50_ms=round(percentile(ms, 50), 3),
        scrape_p99_ms=round(percentile(ms, 99), 3),
        scrape_max_ms=round(max(ms), 3),
        scrape_mean_ms=round(statistics.fmean(ms), 3),
        body_bytes=len(body),
        wire_bytes=scraper.wire_bytes,
        series=series,
        series_min=min(series_seen),
        series_max=max(series_seen),
        series_by_metric=per_name,
        sample_parts_s=parts,
        threads=threads,
        profile=str(profile_path) if profile_path else None,
        machine=machine_info(),
        loadavg=[round(load_before[0], 2), round(load_after[0], 2)],
        gpm=describe_gpm(args),
    )


def describe_gpm(args: argparse.Namespace) -> str:
    if args.source == "simulated":
        return ""
    if not args.gpm:
        return "off (the library has none)"
    if args.gpm_interval is None:
        return "on, at the exporter's default GPM cadence"
    if args.gpm_interval == 0:
        return "on, every sampling round"
    return f"on, every {args.gpm_interval:g} s"


def print_result(r: Result) -> None:
    v = r.verdicts()
    pm = "on" if r.process_metrics else "off"
    site = (", python -S" if r.no_site else "") + (", bytecode" if r.bytecode else "")
    if r.as_image:
        image_env = ", ".join(f"{k}={v}" for k, v in IMAGE_ENV.items())
        site += f", as the image runs it ({image_env})"
    print(f"gpuscope-exporter benchmark: source={r.source}, {r.gpus} GPUs x "
          f"{r.processes_per_gpu} processes, process metrics {pm}{site}")
    print(f"  sampling every {r.interval_s:g} s, scraped every {r.scrape_interval_s:g} s "
          f"for {r.window_s:.1f} s ({r.scrapes} scrapes, {r.scrape_failures} failed, "
          f"{r.connects} connection(s))")
    if r.source in ("nvml-fake", "nvml-c"):
        kubelet = "a fake kubelet (PodResources List)" if r.kubelet else "no kubelet socket"
        api = (f"a fake API server over {'HTTPS, CA and token files' if r.api_https else 'HTTP'}"
               " (pods of this node, the node; list + watch)" if r.api_server
               else "no API server")
        print(f"  attribution inputs: a /proc tree for the fake PIDs, {kubelet}, {api}")
        print(f"  GPM: {r.gpm}")
    print(f"  start-up to /readyz: {r.startup_s:.2f} s, RSS then {r.rss_at_ready_mib:.1f} MiB")
    print(f"  CPU:   {r.cpu_percent:.2f} % of one core   (target <= {TARGET_CPU_PERCENT:g} %: "
          f"{v['cpu']})")
    if r.fake_driver_tick_cpu_percent is not None:
        print(f"         of which the fake driver's tick thread: "
              f"{r.fake_driver_tick_cpu_percent:.2f} %")
    elif r.source == "nvml-c":
        print("         (no driver tick thread: the C library makes its samples from the clock)")
    print(f"  RSS:   peak {r.rss_peak_mib:.1f} MiB ({v['rss_peak']}), end {r.rss_end_mib:.1f} MiB "
          f"({v['rss_end']}); start of window {r.rss_start_mib:.1f} MiB, high-water mark "
          f"incl. start-up {r.rss_hwm_mib:.1f} MiB")
    print(f"         at end: anonymous {r.rss_anon_end_mib:.1f} MiB, "
          f"file-backed {r.rss_file_end_mib:.1f} MiB")
    size = f"{r.body_bytes} bytes" + (f", {r.wire_bytes} on the wire" if r.gzip else "")
    print(f"  scrape (GET /metrics, keep-alive, {describe_format(r)}, {size}): "
          f"p50 {r.scrape_p50_ms:.2f} ms ({v['scrape_p50']}), p99 {r.scrape_p99_ms:.2f} ms, "
          f"max {r.scrape_max_ms:.2f} ms")
    print(f"  series: {r.series} in the last scrape ({r.series_min}..{r.series_max} during the "
          f"window)")
    if r.sample_parts_s:
        parts = ", ".join(f"{k} {s * 1000:.2f} ms" for k, s in r.sample_parts_s.items())
        print(f"  last sampling round: {parts}")
    busy = [t for t in r.threads if t.cpu_percent > 0]
    if busy:
        shown = ", ".join(
            f"{t.python_name or t.os_name}[{t.tid}] {t.cpu_percent:.2f} %"
            for t in sorted(busy, key=lambda t: -t.cpu_percent)
        )
        print(f"  CPU by thread: {shown}")
    if r.profile:
        print(f"  py-spy profile (collapsed stacks): {r.profile}")
    print(f"  machine: {r.machine.get('nproc')} CPUs, 1-min load {r.loadavg[0]:.2f} at start, "
          f"{r.loadavg[1]:.2f} at end of the window")
    print(f"  reference, nvitop-exporter on this load: ~{NVITOP_REFERENCE['cpu_percent']:g} %, "
          f"{NVITOP_REFERENCE['rss_mb']:g} MB, ~{NVITOP_REFERENCE['scrape_ms']:g} ms, "
          f"{NVITOP_REFERENCE['series']} series")


# ---------------------------------------------------------------------------------------------
# --import-costs: what each module the exporter loads adds to RSS and start-up time

# Cumulative steps in the order the exporter imports them. Each is run in a fresh interpreter
# that imports every step up to and including it, then reports VmRSS.
# A run-time step, not carried into the later steps: what the API client's TLS context with
# the cluster's CA certificate (one, as in a pod) adds.
TLS_STEP = "the API client's TLS context, one CA certificate (run time, as in a pod)"
# Third-party and standard-library modules first, in the order the exporter needs them,
# then gpuscope's own modules on top (what is left to us), then what loads only at run time.
# The steps name top-level modules; each pulls in what it imports.
IMPORT_STEPS: tuple[tuple[str, str], ...] = (
    ("python3 (bare interpreter)", ""),
    ("stdlib for serving HTTP (http.server, logging, gzip, threading, argparse, ssl)",
     "import http.server, logging, gzip, threading, argparse, ssl"),
    ("prometheus_client", "import prometheus_client"),
    ("pynvml (nvidia-ml-py)", "import pynvml"),
    ("kubelet client libraries: h2 (hpack, hyperframe), protobuf",
     "import h2.config, h2.connection, h2.errors, h2.events, h2.exceptions, h2.settings, "
     "google.protobuf.message, google.protobuf.internal.builder, "
     "google.protobuf.runtime_version, google.protobuf.symbol_database"),
    ("API-server client libraries: lightkube, lightkube-models, httpx2, msgspec, yaml",
     "import lightkube, lightkube.generic_resource, lightkube.config.client_adapter, httpx2, "
     "msgspec, yaml"),
    ("httpx2's transport (httpcore2, h11, anyio; loaded when the API client is built)",
     "import httpcore2"),
    ("gpuscope: exporter core, attribution, NVML source",
     "import gpuscope.exporter.cli, gpuscope.exporter.sources.nvml"),
    ("gpuscope: kubelet client (PodResources call, generated stubs)",
     "import gpuscope.exporter.kubernetes.podresources.call"),
    ("gpuscope: API-server client (apiclient)",
     "import gpuscope.exporter.kubernetes.apiclient"),
    (TLS_STEP, "import ssl; _ctx = ssl.create_default_context(cafile={ca_file!r})"),
    ("yaml (PyYAML; simulated source)", "import yaml"),
    ("sources.scenario, sources.simulated, kubernetes.simulated (simulated source)",
     "import gpuscope.exporter.sources.scenario, gpuscope.exporter.sources.simulated, "
     "gpuscope.exporter.kubernetes.simulated"),
)

_PROBE = """
import time as _time
def _rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
_before = _rss()
_started = _time.perf_counter()
{statement}
_ms = (_time.perf_counter() - _started) * 1000
print(_before, _rss(), _ms)
"""


def import_costs(args: argparse.Namespace, runs: int = 5) -> list[dict[str, Any]]:
    """Each step in fresh interpreters that first import every earlier step, then time the
    step's own imports and read VmRSS before and after them."""
    from tests.pki import TestCA

    env = exporter_env(args)
    rows: list[dict[str, Any]] = []
    prior = ""
    ca_file = Path(tempfile.mkdtemp(prefix="gpuscope-bench-")) / "ca.crt"
    ca_file.write_bytes(TestCA("bench-cluster-ca").cert_pem)
    cwd = REPO
    if args.bytecode:  # gpuscope's modules from bytecode too, as installed
        cwd = precompile(args, ca_file.parent)
        env["PYTHONPATH"] = os.pathsep.join([str(cwd), env["PYTHONPATH"]])
    for label, template in IMPORT_STEPS:
        statement = template.format(ca_file=str(ca_file))
        code = prior + _PROBE.format(statement=statement or "pass")
        samples: list[tuple[int, int, float]] = []
        for _ in range(runs):
            out = subprocess.run(
                [*python_argv(args), "-c", code], cwd=cwd, env=env, capture_output=True,
                text=True, timeout=60,
            )
            if out.returncode != 0:
                break
            before, after, ms = out.stdout.split()[-3:]
            samples.append((int(before), int(after), float(ms)))
        if len(samples) < runs:
            rows.append({"step": label, "error": "import failed"})
            continue
        rows.append({
            "step": label,
            "rss_mib": round(statistics.median(s[1] for s in samples) / 1024, 2),
            "delta_mib": round(statistics.median(s[1] - s[0] for s in samples) / 1024, 2),
            # The fastest run: the one least disturbed by other load on the machine.
            "import_ms": round(min(s[2] for s in samples), 1),
        })
        if statement and label != TLS_STEP:
            prior += statement + "\n"
    shutil.rmtree(ca_file.parent, ignore_errors=True)
    return rows


def print_import_costs(rows: list[dict[str, Any]]) -> None:
    print("RSS after each step's imports (fresh interpreters that import the earlier steps")
    print("first; median of 5), what the step adds, and its import time (fastest of 5):")
    print(f"  {'step':<79} {'RSS MiB':>7} {'+MiB':>6} {'ms':>6}")
    for row in rows:
        if "error" in row:
            print(f"  {row['step']:<79} {row['error']}")
            continue
        print(f"  {row['step']:<79} {row['rss_mib']:>7.1f} {row['delta_mib']:>+6.1f} "
              f"{row['import_ms']:>6.1f}")


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 bench/exporter_bench.py",
        description="Benchmark gpuscope-exporter: CPU, RSS, scrape latency, series count.",
    )
    p.add_argument("--source", choices=("simulated", "nvml-fake", "nvml-c"),
                   default="simulated")
    p.add_argument("--process-metrics", action="store_true",
                   help="export per-process series too (one per process and metric)")
    p.add_argument("--openmetrics", action="store_true",
                   help="send Prometheus' Accept header (OpenMetrics preferred) instead of none "
                        "(text format 0.0.4)")
    p.add_argument("--gzip", action="store_true",
                   help="send Accept-Encoding: gzip, as Prometheus does (default: uncompressed)")
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds (default 60)")
    p.add_argument("--interval", type=float, default=1.0,
                   help="exporter sampling interval in seconds (default 1)")
    p.add_argument("--scrape-interval", type=float, default=1.0,
                   help="seconds between scrapes (default 1)")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds of scraping after /readyz before measuring (default 5)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--processes-per-gpu", type=int, default=64)
    p.add_argument("--no-kubelet", dest="kubelet", action="store_false",
                   help="nvml-fake, nvml-c: no fake kubelet socket (no allocations, no grpc "
                        "import)")
    p.add_argument("--gpm-interval", type=float, metavar="SECONDS",
                   help="nvml-fake, nvml-c: GPM cadence (0: every round; default: the "
                        "exporter's)")
    p.add_argument("--no-gpm", dest="gpm", action="store_false",
                   help="nvml-fake, nvml-c: the fake library has no GPM")
    p.add_argument("--startup-timeout", type=float, default=60.0)
    p.add_argument("--python", default=sys.executable, help="interpreter for the exporter")
    p.add_argument("--no-site", action="store_true",
                   help="run the exporter with python -S (site-packages via PYTHONPATH): no "
                        ".pth start-up hooks, as in a slim container image")
    p.add_argument("--bytecode", action="store_true",
                   help="load gpuscope's modules from bytecode compiled beforehand, as an "
                        "installed package does, instead of compiling them at start-up")
    p.add_argument("--as-image", action="store_true",
                   help="run the exporter as the exporter image does: gpuscope, the "
                        "standard library and site-packages byte-compiled at optimization "
                        "level 2 (--bytecode; the first run compiles the libraries in place), "
                        "and the image's environment (" + ", ".join(
                            f"{k}={v}" for k, v in IMAGE_ENV.items()) + ")")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="exporter log level (default info, the exporter's own default)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--profile", metavar="FILE",
                   help="py-spy record the measured window into FILE (collapsed stacks)")
    p.add_argument("--profile-rate", type=int, default=500, help="py-spy samples/s (default 500)")
    p.add_argument("--no-thread-names", dest="thread_names", action="store_false",
                   help="do not ask py-spy dump for Python thread names after the run")
    p.add_argument("--import-costs", action="store_true",
                   help="only measure RSS and import time of each module the exporter loads")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--no-api-server", dest="api_server", action="store_false",
                   help="nvml-fake, nvml-c: no fake API server (no pod names, no lightkube)")
    p.add_argument("--serve-fake-kubelet", type=Path, metavar="SOCKET", help=argparse.SUPPRESS)
    p.add_argument("--api-plain-http", action="store_true",
                   help="the fake API server speaks plain HTTP, the token in the kubeconfig "
                        "(default: HTTPS with a CA file and a token file, as in a pod)")
    p.add_argument("--serve-fake-api", type=Path, metavar="PORT_FILE", help=argparse.SUPPRESS)
    p.add_argument("--fake-api-tls-dir", type=Path, help=argparse.SUPPRESS)
    p.set_defaults(fake_library=None)  # nvml-c: the built library (measure() sets it)
    args = p.parse_args(argv)
    for name in ("duration", "interval", "scrape_interval"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.warmup < 0 or args.gpus < 0 or args.processes_per_gpu < 0:
        p.error("--warmup, --gpus and --processes-per-gpu must not be negative")
    if args.as_image:
        args.bytecode = True
    return args


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so the finally blocks stop the exporter."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # The scenario writer imports the exporter from this checkout.
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if args.serve_fake_api:
        serve_fake_api(args.serve_fake_api, args.gpus, args.processes_per_gpu,
                       args.fake_api_tls_dir)
        return 0
    if args.serve_fake_kubelet:
        serve_fake_kubelet(args.serve_fake_kubelet, args.gpus, args.processes_per_gpu)
        return 0
    if args.import_costs:
        if args.as_image:
            compile_libraries(args)
        rows = import_costs(args)
        if args.json:
            print(json.dumps({"import_costs": rows, "machine": machine_info()}, indent=2))
        else:
            print_import_costs(rows)
        return 0
    with sigterm_as_exit():
        try:
            result = measure(args)
        except RuntimeError as exc:
            print(f"exporter_bench: error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        out = asdict(result)
        out["verdicts"] = result.verdicts()
        out["targets"] = {"cpu_percent": TARGET_CPU_PERCENT, "rss_mib": TARGET_RSS_MIB,
                          "scrape_p50_ms": TARGET_P50_MS}
        out["nvitop_exporter_reference"] = NVITOP_REFERENCE
        print(json.dumps(out, indent=2))
    else:
        print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

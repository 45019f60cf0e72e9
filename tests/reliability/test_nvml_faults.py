"""NVML faults against the whole exporter: the library missing at start and installed later,
and an XID storm through the NVML double's event set into NvmlSource's XID thread.

The NVML C library is ``FakeNvml`` (``tests/exporter/sources/fake_nvml.py``) under the real pynvml;
the rest is the production code, wired by ``exporter.cli.run()`` or the real ``Sampler``.
Every wait is bounded.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import gpuscope.exporter.sources.nvml
from gpuscope.exporter import cli
from gpuscope.exporter.config import parse_config
from gpuscope.exporter.model import Snapshot
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.conftest import free_port, wait_for
from tests.exporter.sources.fake_nvml import FakeNvml, restored_pynvml


@pytest.fixture(autouse=True)
def pynvml_state() -> Iterator[None]:
    with restored_pynvml():
        yield


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# ---------------------------------------------------------------------------------------------
# 1. The NVML library absent at start, then installed (e.g. by the GPU operator)


class Library:
    """A loader for NvmlSource: raises OSError, as dlopen does, until the library is
    'installed'; counts the attempts."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake
        self.installed = False
        self.attempts: list[float] = []

    def __call__(self) -> FakeNvml:
        self.attempts.append(time.monotonic())
        if not self.installed:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file")
        return self.fake


def test_library_absent_at_start_then_installed_whole_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNvml(2)
    library = Library(fake)
    # The production wiring (cli.run: NvmlSource, attribution, sampler, collectors, HTTP),
    # with only NVML's library loader and its retry backoff (1 s .. 60 s) made test-sized.
    monkeypatch.setattr(gpuscope.exporter.sources.nvml, "NvmlSource", functools.partial(
        NvmlSource, library_loader=library, retry_initial_seconds=0.1,
        retry_max_seconds=0.4, xid_wait_timeout_ms=50,
    ))
    port = free_port()
    cfg = parse_config([
        "--source", "nvml", "--interval", "0.1", "--listen", f"127.0.0.1:{port}",
        "--node-name", "node-a", "--kubelet-socket", str(tmp_path / "no-kubelet.sock"),
        "--proc-root", str(tmp_path),
    ], environ={})
    stop = threading.Event()
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(cli.run(cfg, stop)), daemon=True)
    runner.start()
    url = f"http://127.0.0.1:{port}"

    def get(path: str) -> requests.Response | None:
        try:
            return requests.get(url + path, timeout=2)
        except requests.RequestException:
            return None

    try:
        # Serving, alive, not ready, and saying why.
        wait_for(lambda: len(library.attempts) >= 3, 30, "three library load attempts")
        metrics = get("/metrics")
        assert metrics is not None and metrics.status_code == 200
        got = samples(metrics.text)
        assert got[("gpu_exporter_nvml_up", ())] == 0.0
        assert not [k for k in got if k[0] in ("gpu_info", "gpu_up")]
        assert got[("gpu_exporter_collector_success", (("collector", "nvml_devices"),))] == 0.0
        healthz, readyz = get("/healthz"), get("/readyz")
        assert healthz is not None and healthz.status_code == 200
        assert readyz is not None and readyz.status_code == 503
        # Retried with backoff, not in a loop: gaps 0.1, 0.2, 0.4, 0.4 ... seconds.
        gaps = [b - a for a, b in zip(library.attempts, library.attempts[1:], strict=False)]
        assert all(g >= 0.09 for g in gaps), gaps

        library.installed = True  # nobody restarts anything: the exporter finds it by itself
        wait_for(lambda: (r := get("/readyz")) is not None and r.status_code == 200, 30,
                 "/readyz 200 after the library appeared")
        got = samples(requests.get(url + "/metrics", timeout=2).text)
        assert got[("gpu_exporter_nvml_up", ())] == 1.0
        up = {dict(k[1])["uuid"]: v for k, v in got.items() if k[0] == "gpu_up"}
        assert up == {gpu.uuid: 1.0 for gpu in fake.gpus}
        assert got[("gpu_exporter_collector_success", (("collector", "nvml_devices"),))] == 1.0
        assert fake.init_count == 1  # initialised once, when the library appeared
    finally:
        stop.set()
        runner.join(15)
    assert result == [0]
    assert fake.init_count == 0  # shut down on exit


# ---------------------------------------------------------------------------------------------
# 2. An NVML call that never returns, then SIGTERM


def test_shutdown_with_an_nvml_call_hung_ends_within_its_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A call stuck in the driver holds NvmlSource's lock: closing the source behind it
    (nvmlShutdown) waited for it forever, so the exporter never exited on SIGTERM (the
    kubelet's SIGKILL after the grace period ended it; a Ctrl-C never did)."""
    fake = FakeNvml(2)
    hang, entered, release = threading.Event(), threading.Event(), threading.Event()
    check = fake._check

    def hanging_check(name: str) -> None:
        if hang.is_set() and name == "nvmlDeviceGetPowerUsage":
            entered.set()
            release.wait(60)
        check(name)

    monkeypatch.setattr(fake, "_check", hanging_check)
    made: list[NvmlSource] = []

    def make(*args: Any, **kwargs: Any) -> NvmlSource:
        made.append(NvmlSource(*args, library_loader=lambda: fake, xid_wait_timeout_ms=50,
                               **kwargs))
        return made[-1]

    monkeypatch.setattr(gpuscope.exporter.sources.nvml, "NvmlSource", make)
    port = free_port()
    cfg = parse_config([
        "--source", "nvml", "--interval", "0.1", "--listen", f"127.0.0.1:{port}",
        "--node-name", "node-a", "--kubelet-socket", str(tmp_path / "no-kubelet.sock"),
        "--proc-root", str(tmp_path),
    ], environ={})
    stop = threading.Event()
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(cli.run(cfg, stop)), daemon=True)
    runner.start()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(url + "/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(ready, 30, "/readyz 200")
        hang.set()
        assert entered.wait(10), "the sampler never reached the hanging call"
        wait_for(lambda: not ready(), 10, "/readyz 503 while the round hangs")
        stop.set()  # what SIGTERM does
        started = time.monotonic()
        runner.join(15)
        took = time.monotonic() - started
        assert not runner.is_alive(), "cli.run() still running 15 s after SIGTERM"
        assert result == [0]
        assert took < 10, took  # the sampler's 5 s join, then no wait on the hung call
        assert any("still inside a sampling round" in r.getMessage() for r in caplog.records)
    finally:
        stop.set()
        release.set()
        runner.join(15)
        # run() leaves the source open (its call hung): closed here, once the call returned,
        # so that its XID thread does not outlive the test and wait on the next test's NVML
        # (pynvml's library is one per process): the XID storm test after it found no event
        # set now and then.
        for source in made:
            source.close()


# ---------------------------------------------------------------------------------------------
# 3. XID storm: 1000 events/s for 3 s


STORM_SECONDS = 3.0
STORM_RATE = 1000  # events per second
XIDS = (13, 31, 43, 48, 79)
# What the NVML source package holds on to (every module of it), for tracemalloc.
NVML_PACKAGE_FILES = os.path.join(os.path.dirname(gpuscope.exporter.sources.nvml.__file__), "*")


def thread_cpu_seconds(native_id: int) -> float:
    """User + system CPU time of one thread of this process (Linux /proc)."""
    stat = Path(f"/proc/self/task/{native_id}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_xid_storm_counts_exactly_without_disturbing_sampling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml(2)
    mig = fake.add_mig_slice(1, "3g.40gb", gpu_instance_id=5)
    source = NvmlSource(library_loader=lambda: fake, xid_wait_timeout_ms=100)
    interval = 0.25
    round_seconds: list[float] = []  # NVML time of each sampling round, from its parts

    def record(snap: Snapshot) -> None:
        round_seconds.append(sum(p.duration_seconds for p in snap.parts))

    sampler = Sampler(source, interval, listeners=(record,))
    caplog.set_level(logging.INFO, "gpuscope.exporter.sources.nvml")
    try:
        sampler.start()
        wait_for(lambda: sampler.rounds >= 2, 30, "sampling")
        session = source._session
        assert session is not None and session.xid is not None and session.xid.alive()
        xid_thread = session.xid._thread.native_id
        assert xid_thread is not None
        tracemalloc.start()
        kept_before = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, NVML_PACKAGE_FILES)])
        caplog.clear()

        sent: Counter[tuple[str, int]] = Counter()
        cpu_before = thread_cpu_seconds(xid_thread)
        rounds_before, missed_before = sampler.rounds, sampler.missed_rounds
        round_seconds.clear()
        started = time.monotonic()
        n = 0
        while (elapsed := time.monotonic() - started) < STORM_SECONDS:
            # Paced against the clock: every event due by now, then a short sleep.
            while n < int(elapsed * STORM_RATE):
                xid = XIDS[n % len(XIDS)]
                if n % 7 == 3:  # one in seven hits the MIG instance of GPU 1
                    fake.inject_xid(1, xid, gpu_instance_id=5)
                    sent[(mig.uuid, xid)] += 1
                else:
                    gpu = fake.gpus[n % 2]
                    fake.inject_xid(gpu, xid)
                    sent[(gpu.uuid, xid)] += 1
                n += 1
            time.sleep(0.002)
        storm = time.monotonic() - started
        wait_for(lambda: fake.pending_events() == 0, 30, "the XID thread to drain the queue")
        drained = time.monotonic() - started
        cpu = thread_cpu_seconds(xid_thread) - cpu_before
        rounds = sampler.rounds - rounds_before
        missed = sampler.missed_rounds - missed_before
        slowest_round = max(round_seconds)

        # Exact: every event counted once, on the device (or MIG slice) it hit.
        wait_for(lambda: sum(c.count for d in (sampler.latest() or source.sample()).devices
                             for c in d.xid_errors) == n, 5, "the counts in a snapshot")
        snap = sampler.latest()
        assert snap is not None
        counted = {(d.uuid, c.xid): c.count for d in snap.devices for c in d.xid_errors}
        assert n >= STORM_SECONDS * STORM_RATE * 0.95
        assert counted == dict(sent)

        # The sampler kept its interval while the XID thread was busy.
        assert missed == 0
        assert rounds >= int(storm / interval) - 1, (rounds, storm)
        assert slowest_round < interval / 2, round_seconds
        # The XID thread kept up (no backlog past the storm) at a reasonable cost.
        assert drained - storm < 1.0
        assert cpu < 0.5 * storm, f"XID thread used {cpu:.2f} s CPU in {storm:.2f} s"
        # Memory: what nvml.py holds on to does not grow with the number of events.
        kept_after = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, NVML_PACKAGE_FILES)])
        growth = sum(s.size_diff for s in kept_after.compare_to(kept_before, "filename"))
        assert growth < 64 * 1024, growth
    finally:
        tracemalloc.stop()
        sampler.stop()
        source.close()
    assert fake.init_count == 0
    # The log is not flooded: the first events one by one, the rest summed up in one line
    # (here when the thread stops; in a long storm once a minute).
    lines = [r.getMessage() for r in caplog.records
             if r.name.startswith("gpuscope.exporter.sources.nvml")]
    one_by_one = [m for m in lines if m.startswith("XID ")]
    summary = [m for m in lines if "more XID events" in m]
    assert len(one_by_one) == 10, lines[:20]
    assert len(summary) == 1, summary
    assert summary[0].startswith(f"{n - 10} more XID events in ")
    assert f"XID 79 on {mig.uuid}: " in summary[0]

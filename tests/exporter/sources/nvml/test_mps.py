"""CUDA MPS through the real pynvml over FakeNvml, down to the series /metrics serves.

The node is what an H200 with driver 580.159.04 showed (docs/real-gpu.md, issue 31): an MPS
server (PID 787, 66 MiB) and two PyTorch clients (752 heavy, 754 light) on GPU 0; the compute
list names all three, the MPS list the two clients with the same bytes, and per-process
utilization has samples for the server's PID only (``mps_client_utilization = False``). The
other behaviour NVML might have, samples per client, is played with
``mps_client_utilization = True``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuscope.exporter.model import ProcessSample, Snapshot
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sources.nvml.mps import MpsBehaviour, ProcessNames
from tests.exporter.sources.fake_nvml import MIB, UNKNOWN, FakeGpu, FakeNvml
from tests.exporter.sources.nvml.conftest import T0_US, FakeClock, SourceFactory, by_uuid

SERVER, HEAVY, LIGHT = 787, 752, 754
# The bytes NVML gave on the H200 (both lists agree for the clients).
SERVER_BYTES, HEAVY_BYTES, LIGHT_BYTES = 69_206_016, 5_209_325_568, 1_786_773_504

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def plant_mps(gpu: FakeGpu, *, heavy_sm: int = 70, light_sm: int = 25) -> None:
    gpu.add_process(SERVER, used_memory=SERVER_BYTES, mps="server")
    gpu.add_process(HEAVY, used_memory=HEAVY_BYTES, mps="client", sm_util=heavy_sm)
    gpu.add_process(LIGHT, used_memory=LIGHT_BYTES, mps="client", sm_util=light_sm)


def write_proc(root: Path, pid: int, comm: str, cmdline: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    """/proc as the H200 showed it: the server, two python clients."""
    root = tmp_path / "proc"
    write_proc(root, SERVER, "nvidia-cuda-mps", "nvidia-cuda-mps-server")
    write_proc(root, HEAVY, "python3", "/usr/bin/python3 -c heavy")
    write_proc(root, LIGHT, "python3", "/usr/bin/python3 -c light")
    return root


def series(snap: Snapshot, uuid: str) -> Series:
    got: Series = {}
    for family in GpuCollector(lambda: snap, process_metrics=True).collect():
        for s in family.samples:
            if s.labels.get("uuid") == uuid:
                rest = tuple(sorted((k, v) for k, v in s.labels.items()
                                    if k not in ("gpu", "uuid")))
                got[(s.name, rest)] = s.value
    return got


def mps_series(snap: Snapshot, uuid: str) -> Series:
    return {k: v for k, v in series(snap, uuid).items()
            if k[0].startswith(("gpu_mps_", "gpu_process_"))}


def processes(snap: Snapshot, uuid: str) -> dict[int, ProcessSample]:
    return {p.pid: p for p in by_uuid(snap, uuid).processes}


def sample_after_tick(fake: FakeNvml, source_sample: object, wall: FakeClock) -> Snapshot:
    """One driver sampling tick (``record_process_samples``), then a sampling round."""
    wall.advance(1.0)
    fake.record_process_samples(int(wall.now * 1_000_000) - 1000)
    assert callable(source_sample)
    snap = source_sample()
    assert isinstance(snap, Snapshot)
    return snap


def test_clients_and_server_merged_by_pid_each_byte_once_as_on_the_h200(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    plant_mps(gpu)
    source = make_source(proc_root=str(proc_root))
    snap = sample_after_tick(fake, source.sample, wall)
    procs = processes(snap, gpu.uuid)
    assert {pid: (p.kinds, p.mps, p.memory_used_bytes) for pid, p in procs.items()} == {
        SERVER: (("compute",), "server", SERVER_BYTES),
        HEAVY: (("compute",), "client", HEAVY_BYTES),
        LIGHT: (("compute",), "client", LIGHT_BYTES),
    }
    # Listed twice (compute and MPS lists), counted once.
    assert sum(p.memory_used_bytes or 0 for p in procs.values()) == (
        SERVER_BYTES + HEAVY_BYTES + LIGHT_BYTES)
    assert fake.calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] >= 2  # size + list
    # The other GPU runs no MPS: no roles, nothing MPS served.
    other = by_uuid(snap, fake.gpus[1].uuid)
    assert not other.runs_mps and other.mps_client_utilization_reported is None
    assert not any(k[0].startswith("gpu_mps_") for k in series(snap, other.uuid))


def test_server_samples_only_clients_get_no_utilization_never_zero(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    plant_mps(gpu)  # mps_client_utilization False: the server's PID carries 70 + 25 %
    source = make_source(proc_root=str(proc_root))
    snap = sample_after_tick(fake, source.sample, wall)
    procs = processes(snap, gpu.uuid)
    assert procs[SERVER].sm_utilization_ratio == pytest.approx(0.95)
    assert procs[HEAVY].sm_utilization_ratio is None
    assert procs[LIGHT].sm_utilization_ratio is None
    assert by_uuid(snap, gpu.uuid).mps_client_utilization_reported is False
    assert mps_series(snap, gpu.uuid) == {
        ("gpu_mps_server_memory_used_bytes", ()): float(SERVER_BYTES),
        ("gpu_mps_client_utilization_reported", ()): 0.0,
        # Per-process series: the server's utilization is its samples' (every client's
        # work); the clients have memory and no utilization series (unknown, not 0).
        ("gpu_process_utilization_ratio", (("pid", str(SERVER)),)): pytest.approx(0.95),
        ("gpu_process_memory_used_bytes", (("pid", str(SERVER)),)): float(SERVER_BYTES),
        ("gpu_process_memory_used_bytes", (("pid", str(HEAVY)),)): float(HEAVY_BYTES),
        ("gpu_process_memory_used_bytes", (("pid", str(LIGHT)),)): float(LIGHT_BYTES),
    }
    # An idle round (no new sample, NVML answers NOT_FOUND) keeps what was learnt.
    wall.advance(1.0)
    snap = source.sample()
    assert by_uuid(snap, gpu.uuid).mps_client_utilization_reported is False
    assert processes(snap, gpu.uuid)[HEAVY].sm_utilization_ratio is None


def test_per_client_samples_are_used_where_nvml_gives_them(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    gpu.mps_client_utilization = True
    plant_mps(gpu)
    source = make_source(proc_root=str(proc_root))
    snap = sample_after_tick(fake, source.sample, wall)
    procs = processes(snap, gpu.uuid)
    assert (procs[HEAVY].sm_utilization_ratio, procs[LIGHT].sm_utilization_ratio) == (0.7, 0.25)
    assert procs[SERVER].sm_utilization_ratio == 0.0
    assert mps_series(snap, gpu.uuid)[("gpu_mps_client_utilization_reported", ())] == 1.0

    # Once seen, for good: a round where only the server has a sample (the clients idle
    # and unsampled) gives them 0, as for any process without a sample.
    gpu.processes[1].sm_util = gpu.processes[2].sm_util = 0
    wall.advance(1.0)
    gpu.add_util_sample(SERVER, int(wall.now * 1_000_000) - 1000, 3)
    snap = source.sample()
    procs = processes(snap, gpu.uuid)
    assert by_uuid(snap, gpu.uuid).mps_client_utilization_reported is True
    assert (procs[HEAVY].sm_utilization_ratio, procs[LIGHT].sm_utilization_ratio) == (0.0, 0.0)


def test_before_any_sample_the_behaviour_is_unknown(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path
) -> None:
    gpu = fake.gpus[0]
    plant_mps(gpu)
    snap = make_source(proc_root=str(proc_root)).sample()  # no sample recorded yet
    dev = by_uuid(snap, gpu.uuid)
    assert dev.mps_client_utilization_reported is None
    assert [p.sm_utilization_ratio for p in dev.processes] == [None, None, 0.0]  # 752 754 787
    assert mps_series(snap, gpu.uuid).keys() >= {("gpu_mps_server_memory_used_bytes", ())}
    assert ("gpu_mps_client_utilization_reported", ()) not in series(snap, gpu.uuid)


def test_a_client_exiting_leaves_the_other_and_the_server_exact(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    plant_mps(gpu)
    source = make_source(proc_root=str(proc_root))
    sample_after_tick(fake, source.sample, wall)
    gpu.remove_process(LIGHT)
    snap = sample_after_tick(fake, source.sample, wall)
    procs = processes(snap, gpu.uuid)
    assert {pid: (p.mps, p.memory_used_bytes) for pid, p in procs.items()} == {
        SERVER: ("server", SERVER_BYTES), HEAVY: ("client", HEAVY_BYTES),
    }
    assert procs[SERVER].sm_utilization_ratio == 0.7
    # Every client gone: the server stays (it keeps its context), still infrastructure.
    gpu.remove_process(HEAVY)
    snap = sample_after_tick(fake, source.sample, wall)
    procs = processes(snap, gpu.uuid)
    assert {pid: p.mps for pid, p in procs.items()} == {SERVER: "server"}
    assert mps_series(snap, gpu.uuid)[("gpu_mps_server_memory_used_bytes", ())] == float(
        SERVER_BYTES)


def test_without_names_the_server_is_the_compute_process_beside_the_clients(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    plant_mps(gpu)
    source = make_source()  # no proc root: nothing read under /proc
    snap = sample_after_tick(fake, source.sample, wall)
    assert {p.pid: p.mps for p in by_uuid(snap, gpu.uuid).processes} == {
        SERVER: "server", HEAVY: "client", LIGHT: "client"}
    # With no client left, nothing tells the server from any process without its name.
    gpu.remove_process(HEAVY)
    gpu.remove_process(LIGHT)
    snap = sample_after_tick(fake, source.sample, wall)
    assert {p.pid: p.mps for p in by_uuid(snap, gpu.uuid).processes} == {SERVER: None}


def test_names_tell_a_plain_process_beside_mps_clients_from_the_server(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    # Compute mode DEFAULT (as on the H200): a process that did not go through MPS can run
    # beside the clients; its name says it is not the server.
    gpu = fake.gpus[0]
    plant_mps(gpu)
    gpu.add_process(900, used_memory=300 * MIB, sm_util=5)
    write_proc(proc_root, 900, "python3", "python3 train.py")
    # The control daemon has the server's comm; its cmdline tells them apart.
    gpu.add_process(901, used_memory=1 * MIB)
    write_proc(proc_root, 901, "nvidia-cuda-mps", "nvidia-cuda-mps-control -d")
    snap = sample_after_tick(fake, make_source(proc_root=str(proc_root)).sample, wall)
    assert {p.pid: p.mps for p in by_uuid(snap, gpu.uuid).processes} == {
        HEAVY: "client", LIGHT: "client", SERVER: "server", 900: None, 901: None}


def test_process_names(tmp_path: Path) -> None:
    write_proc(tmp_path, 1, "nvidia-cuda-mps", "/usr/bin/nvidia-cuda-mps-server")
    write_proc(tmp_path, 2, "nvidia-cuda-mps", "nvidia-cuda-mps-control -d")
    write_proc(tmp_path, 3, "python3", "python3")
    (tmp_path / "4").mkdir()
    (tmp_path / "4" / "comm").write_text("nvidia-cuda-mps\n")  # no cmdline: the server
    names = ProcessNames(str(tmp_path))
    assert [names.is_mps_server(pid) for pid in (1, 2, 3, 4, 5)] == [
        True, False, False, True, None]
    (tmp_path / "1" / "comm").write_text("python3\n")
    assert names.is_mps_server(1) is True  # read once per PID...
    names.retain([2, 3])
    assert names.is_mps_server(1) is False  # ...until it leaves every list
    assert not ProcessNames(None).enabled and ProcessNames(None).is_mps_server(1) is None


def test_behaviour_is_learnt_from_which_pids_have_samples() -> None:
    b = MpsBehaviour()
    assert b.learn([1, 2], []) is None  # idle: nothing learnt
    assert b.learn([], [9]) is None  # no client: nothing learnt
    assert b.learn([1, 2], [9]) is False  # the server's samples only
    assert b.learn([1, 2], []) is False
    assert b.learn([1, 2], [2, 9]) is True  # a client's sample
    assert b.learn([1, 2], [9]) is True  # for good


def test_clients_listed_only_as_mps_processes(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    gpu.mps_clients_in_compute_list = False
    plant_mps(gpu)
    snap = sample_after_tick(fake, make_source(proc_root=str(proc_root)).sample, wall)
    assert {p.pid: (p.kinds, p.mps, p.memory_used_bytes)
            for p in by_uuid(snap, gpu.uuid).processes} == {
        SERVER: (("compute",), "server", SERVER_BYTES),
        HEAVY: (("compute",), "client", HEAVY_BYTES),
        LIGHT: (("compute",), "client", LIGHT_BYTES),
    }


def test_mps_list_not_supported_is_asked_once_per_device(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock
) -> None:
    for gpu in fake.gpus:
        gpu.mps_supported = False  # before Volta
        gpu.add_process(100 + gpu.index)
    source = make_source()
    for _ in range(3):
        snap = sample_after_tick(fake, source.sample, wall)
    assert fake.calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == len(fake.gpus)
    assert all(p.mps is None for d in snap.devices for p in d.processes)
    assert all(p.success for p in snap.parts)


def test_a_driver_without_the_v3_mps_call_is_asked_v2(
    make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    fake = FakeNvml(1, missing_functions={"nvmlDeviceGetMPSComputeRunningProcesses_v3"})
    fake.now_us = lambda: T0_US
    plant_mps(fake.gpus[0])
    source = make_source(library_loader=lambda: fake, proc_root=str(proc_root))
    for _ in range(2):
        snap = sample_after_tick(fake, source.sample, wall)
    assert fake.missing_lookups["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 1
    assert fake.calls["nvmlDeviceGetMPSComputeRunningProcesses_v2"] >= 2
    assert {p.pid: p.mps for p in snap.devices[0].processes} == {
        SERVER: "server", HEAVY: "client", LIGHT: "client"}
    source.close()
    assert fake.init_count == 0


def test_a_failing_mps_list_leaves_mps_out_and_the_processes_in(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = fake.gpus[0]
    plant_mps(gpu)
    gpu.errors["nvmlDeviceGetMPSComputeRunningProcesses_v3"] = UNKNOWN
    source = make_source()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            snap = sample_after_tick(fake, source.sample, wall)
    dev = by_uuid(snap, gpu.uuid)
    assert dev.up
    assert {p.pid: p.mps for p in dev.processes} == {SERVER: None, HEAVY: None, LIGHT: None}
    assert dict((p.name, p.success) for p in snap.parts)["nvml_processes"] is False
    assert sum("listing MPS processes" in r.message for r in caplog.records) == 1
    del gpu.errors["nvmlDeviceGetMPSComputeRunningProcesses_v3"]
    snap = sample_after_tick(fake, source.sample, wall)
    assert {p.pid: p.mps for p in by_uuid(snap, gpu.uuid).processes} == {
        SERVER: "server", HEAVY: "client", LIGHT: "client"}


def test_a_failing_mps_list_beside_a_named_server_leaves_the_clients_unknown_not_idle(
    fake: FakeNvml, make_source: SourceFactory, proc_root: Path, wall: FakeClock
) -> None:
    # The server's samples carry the clients' 95 %: while the MPS list fails, the clients
    # are unlisted compute processes beside the server, their share of it unknown (never 0,
    # which would read as allocated-but-idle for as long as the list fails).
    gpu = fake.gpus[0]
    plant_mps(gpu)
    source = make_source(proc_root=str(proc_root))
    sample_after_tick(fake, source.sample, wall)
    gpu.errors["nvmlDeviceGetMPSComputeRunningProcesses_v3"] = UNKNOWN
    for _ in range(2):
        snap = sample_after_tick(fake, source.sample, wall)
        procs = processes(snap, gpu.uuid)
        assert {pid: (p.mps, p.sm_utilization_ratio) for pid, p in procs.items()} == {
            SERVER: ("server", pytest.approx(0.95)), HEAVY: (None, None), LIGHT: (None, None)}
        assert by_uuid(snap, gpu.uuid).mps_client_utilization_reported is False
    # Where NVML reports each client, their own samples stand while the list fails.
    gpu.mps_client_utilization = True
    del gpu.errors["nvmlDeviceGetMPSComputeRunningProcesses_v3"]
    sample_after_tick(fake, source.sample, wall)
    gpu.errors["nvmlDeviceGetMPSComputeRunningProcesses_v3"] = UNKNOWN
    procs = processes(sample_after_tick(fake, source.sample, wall), gpu.uuid)
    assert {pid: p.sm_utilization_ratio for pid, p in procs.items()} == {
        SERVER: 0.0, HEAVY: pytest.approx(0.7), LIGHT: pytest.approx(0.25)}

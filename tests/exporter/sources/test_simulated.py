"""The simulated source: values the scenario defines, at chosen scenario times."""

from __future__ import annotations

import itertools
import statistics
import textwrap

import pytest

from gpuscope.exporter.model import (
    GPM_SIGNALS,
    THROTTLE_REASONS,
    DeviceSample,
    PartResult,
    RowRemapping,
    Snapshot,
    Source,
    XidCount,
)
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sources.scenario import Scenario, load_default_scenario, scenario_from_yaml
from gpuscope.exporter.sources.scenario import synthetic_scenario as synthetic
from gpuscope.exporter.sources.simulated import SimulatedSource

GIB = 2**30


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def scenario(text: str) -> Scenario:
    return scenario_from_yaml(textwrap.dedent(text), "test.yaml")


def at(src: SimulatedSource, t: float) -> Snapshot:
    return src.sample_at(t)


def device(snap: Snapshot, index: str) -> DeviceSample:
    for d in snap.devices:
        if d.index == index:
            return d
    raise KeyError(index)


SIMPLE = """
    node: {driver_version: "535.104.05", seed: 5}
    gpus:
      - {power_idle: 100, power_limit: 300, temperature: {idle: 30, busy: 80},
         sm_clock: {idle: 210MHz, busy: 1410MHz}, memory_clock: 1593MHz,
         memory_reserved: 1GiB, memory_utilization_factor: 0.5,
         fan_speed: {idle: 0.3, busy: 0.9}, ecc: {corrected: 4, uncorrected: 1}}
      - {}
    processes:
      - {pid: 100, gpu: 0, memory: 10GiB, utilization: 0.25}
      - pid: 101
        gpu: 0
        memory: 5GiB
        utilization: {pattern: stepped, steps: [[0, 0.1], [60, 0.5]]}
        start: 100
        stop: 400
      - pid: 102
        gpu: 1
        memory: 2GiB
        kind: [graphics, compute]
        utilization: {pattern: bursty, low: 0.2, high: 0.8, period: 10, duty: 0.5}
        every: {period: 100, on: 30}
"""


def test_source_protocol_and_sample_uses_clock_and_start() -> None:
    clock = FakeClock(5000.0)
    src: Source = SimulatedSource(scenario(SIMPLE), clock=clock, start=4850.0)
    assert src.name == "simulated"
    snap = src.sample()
    assert snap.timestamp == 5000.0
    assert snap.source_up
    assert snap.driver_version == "535.104.05"
    assert len(snap.parts) == 1
    part = snap.parts[0]
    assert isinstance(part, PartResult)
    assert (part.name, part.success) == ("simulated", True)
    assert 0 <= part.duration_seconds < 1
    # t = 150: process 101 runs (started at 100, 50 s in: value 0.1)
    gpu0 = device(snap, "0")
    assert gpu0.utilization_ratio == pytest.approx(0.35)
    src.close()


def test_default_start_is_the_clock_at_construction() -> None:
    clock = FakeClock(123.0)
    src = SimulatedSource(scenario(SIMPLE), clock=clock)
    assert src.start == 123.0
    clock.now = 123.0 + 150.0
    assert src.sample().devices == at(src, 150.0).devices
    clock.now = 100.0  # before start: scenario time 0
    assert src.sample().devices == at(src, 0.0).devices


def test_derived_device_values_follow_processes() -> None:
    src = SimulatedSource(scenario(SIMPLE), clock=FakeClock(), start=0.0)
    d = device(at(src, 50.0), "0")  # only pid 100 runs: u = 0.25
    assert d.up
    assert d.utilization_ratio == 0.25
    assert d.memory_utilization_ratio == 0.125
    assert d.memory_used_bytes == 11 * GIB
    assert d.memory_total_bytes == 80 * GIB
    assert d.power_watts == 150.0
    assert d.power_limit_watts == 300.0
    assert d.temperature_celsius == 42.5
    assert d.sm_clock_hertz == 1410e6
    assert d.memory_clock_hertz == 1593e6
    assert d.fan_speed_ratio == pytest.approx(0.45)
    assert d.ecc_corrected_errors == 4 and d.ecc_uncorrected_errors == 1
    assert d.architecture == "Ampere"
    assert d.pci_bus_id == "00000000:10:00.0"
    assert [(p.pid, p.kinds, p.memory_used_bytes, p.sm_utilization_ratio)
            for p in d.processes] == [(100, ("compute",), 10 * GIB, 0.25)]
    # t = 200: pid 101 is 100 s into its life, stepped value 0.5
    d = device(at(src, 200.0), "0")
    assert d.utilization_ratio == 0.75
    assert d.memory_used_bytes == 16 * GIB
    assert [p.sm_utilization_ratio for p in d.processes] == [0.25, 0.5]


def test_idle_gpu_reports_idle_values() -> None:
    src = SimulatedSource(scenario("gpus: [{}]"), clock=FakeClock(), start=0.0)
    d = device(at(src, 10.0), "0")
    assert d.utilization_ratio == 0.0
    assert d.memory_used_bytes == 0
    assert d.power_watts == 60.0
    assert d.sm_clock_hertz == 210e6
    assert d.temperature_celsius == 32.0
    assert d.fan_speed_ratio is None  # no fan_speed: NOT_SUPPORTED (SXM)
    assert d.processes == ()
    assert d.xid_errors == ()


def test_utilization_is_clamped_to_one() -> None:
    src = SimulatedSource(scenario("""
        gpus: [{base_utilization: 0.3}]
        processes:
          - {pid: 1, gpu: 0, utilization: 0.6}
          - {pid: 2, gpu: 0, utilization: 0.7}
    """), clock=FakeClock(), start=0.0)
    d = device(at(src, 1.0), "0")
    assert d.utilization_ratio == 1.0
    assert [p.sm_utilization_ratio for p in d.processes] == [0.6, 0.7]
    assert d.power_watts == 400.0


@pytest.mark.parametrize(
    ("t", "running", "value"),
    [
        (0.0, False, None), (99.9, False, None), (100.0, True, 0.1), (159.9, True, 0.1),
        (160.0, True, 0.5), (399.9, True, 0.5), (400.0, False, None), (10_000.0, False, None),
    ],
)
def test_start_stop_process_comes_and_goes(t: float, running: bool, value: float | None) -> None:
    src = SimulatedSource(scenario(SIMPLE), clock=FakeClock(), start=0.0)
    procs = {p.pid: p for p in device(at(src, t), "0").processes}
    assert (101 in procs) is running
    if running:
        assert procs[101].sm_utilization_ratio == value


@pytest.mark.parametrize(
    ("t", "value"),
    [(0.0, 0.8), (4.9, 0.8), (5.0, 0.2), (29.9, 0.2), (30.0, None), (99.0, None),
     (100.0, 0.8), (105.0, 0.2), (130.0, None)],
)
def test_periodic_process_restarts_its_pattern(t: float, value: float | None) -> None:
    src = SimulatedSource(scenario(SIMPLE), clock=FakeClock(), start=0.0)
    d = device(at(src, t), "1")
    if value is None:
        assert d.processes == ()
        assert d.utilization_ratio == 0.0
        assert d.memory_used_bytes == 0
    else:
        (p,) = d.processes
        assert p.kinds == ("compute", "graphics")
        assert p.sm_utilization_ratio == value
        assert d.utilization_ratio == value
        assert d.memory_used_bytes == 2 * GIB


MIG = """
    gpus:
      - model: NVIDIA H100 80GB HBM3
        power_idle: 70
        power_limit: 700
        memory_reserved: 1GiB
        mig:
          - {profile: 3g.40gb, gpu_instance_id: 1, utilization_supported: true}
          - {profile: 2g.20gb, gpu_instance_id: 5}
          - {profile: 1g.10gb, gpu_instance_id: 13}
    processes:
      - {pid: 1, gpu: "0/1", memory: 20GiB, utilization: 0.7}
      - {pid: 2, gpu: "0/5", memory: 8GiB, utilization: 0.35}
      - {pid: 3, gpu: "0/5", memory: 4GiB, utilization: 0.35}
"""


def test_mig_slices_are_devices_of_their_own() -> None:
    src = SimulatedSource(scenario(MIG), clock=FakeClock(), start=0.0)
    snap = at(src, 10.0)
    assert [d.index for d in snap.devices] == ["0", "0/1", "0/5", "0/13"]
    parent, s1, s5, s13 = snap.devices
    assert parent.uuid.startswith("GPU-") and not parent.is_mig
    assert parent.utilization_ratio is None
    assert parent.memory_utilization_ratio is None
    assert parent.processes == ()
    assert parent.memory_used_bytes == 33 * GIB
    # activity = 3/7 * 0.7 + 2/7 * 0.7 = 0.5
    assert parent.power_watts == pytest.approx(70 + 630 * 0.5)
    for s in (s1, s5, s13):
        assert s.uuid.startswith("MIG-")
        assert s.parent_uuid == parent.uuid
        assert s.is_mig
        assert s.pci_bus_id == parent.pci_bus_id
        assert s.power_watts is None and s.temperature_celsius is None
        assert s.energy_joules is None
    assert (s1.mig_profile, s1.model) == ("3g.40gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb")
    assert s1.memory_total_bytes == 40 * GIB
    assert s1.memory_used_bytes == 20 * GIB
    assert s1.utilization_ratio == 0.7  # GPM: utilization_supported
    assert s1.processes[0].sm_utilization_ratio == 0.7
    assert s5.utilization_ratio is None  # no per-slice utilization without GPM
    assert s5.memory_used_bytes == 12 * GIB
    assert [(p.pid, p.sm_utilization_ratio) for p in s5.processes] == [(2, None), (3, None)]
    assert (s13.memory_used_bytes, s13.processes) == (0, ())


FAULTS = """
    gpus:
      - {}
      - mig: [{profile: 7g.80gb, gpu_instance_id: 0}]
    processes:
      - {pid: 1, gpu: 0, utilization: 0.5}
      - {pid: 2, gpu: "1/0", utilization: 0.5}
    faults:
      - {type: lost, gpu: 0, at: 100, for: 50}
      - {type: lost, gpu: 1, at: 1000}
      - {type: xid, gpu: 0, code: 79, at: 100}
      - {type: xid, gpu: 0, code: 13, at: 10, every: 60, count: 5}
      - {type: xid, gpu: 0, code: 13, at: 500}
      - {type: nvml_down, at: 300, for: 20}
      - {type: not_supported, gpu: 0, fields: [power_watts, process_utilization], at: 600,
         for: 10}
      - {type: not_supported, gpu: "1/0", fields: [memory_used_bytes]}
"""


def test_lost_gpu_window() -> None:
    src = SimulatedSource(scenario(FAULTS), clock=FakeClock(), start=0.0)
    assert device(at(src, 99.0), "0").up
    lost = device(at(src, 100.0), "0")
    assert not lost.up
    assert lost.uuid.startswith("GPU-") and lost.model == "NVIDIA A100-SXM4-80GB"
    for name in ("utilization_ratio", "memory_used_bytes", "memory_total_bytes",
                 "temperature_celsius", "power_watts", "energy_joules", "sm_clock_hertz",
                 "ecc_corrected_errors"):
        assert getattr(lost, name) is None, name
    assert lost.processes == ()
    assert lost.xid_errors == (XidCount(13, 2), XidCount(79, 1))  # counters survive
    assert device(at(src, 149.9), "0").up is False
    assert device(at(src, 150.0), "0").up
    # a lost MIG parent takes its slices with it, for good (no 'for')
    snap = at(src, 5000.0)
    assert [(d.index, d.up) for d in snap.devices] == [("0", True), ("1", False), ("1/0", False)]
    assert device(snap, "1/0").processes == ()


def test_xid_counts_are_a_function_of_time() -> None:
    src = SimulatedSource(scenario(FAULTS), clock=FakeClock(), start=0.0)
    counts = {t: device(at(src, t), "0").xid_errors for t in (0, 10, 69.9, 70, 99, 100, 499)}
    assert counts == {
        0: (), 10: (XidCount(13, 1),), 69.9: (XidCount(13, 1),), 70: (XidCount(13, 2),),
        99: (XidCount(13, 2),), 100: (XidCount(13, 2), XidCount(79, 1)),
        499: (XidCount(13, 5), XidCount(79, 1)),
    }
    # a second fault with the same code adds to the same counter
    assert device(at(src, 500), "0").xid_errors == (XidCount(13, 6), XidCount(79, 1))
    assert device(at(src, 0), "1").xid_errors == ()
    # each code's last event, in wall-clock time (start + scenario time)
    late = SimulatedSource(scenario(FAULTS), clock=FakeClock(), start=1_000.0)
    assert [(c.xid, c.last_seen) for c in device(at(late, 99), "0").xid_errors] == [
        (13, 1_070.0)]
    assert [(c.xid, c.last_seen) for c in device(at(late, 500), "0").xid_errors] == [
        (13, 1_500.0), (79, 1_100.0)]


def test_nvml_down_window() -> None:
    clock = FakeClock(300.0)
    src = SimulatedSource(scenario(FAULTS), clock=clock, start=0.0)
    down = src.sample()
    assert not down.source_up
    assert down.devices == ()
    assert down.timestamp == 300.0
    assert [(p.name, p.success) for p in down.parts] == [("simulated", False)]
    clock.now = 319.9
    assert not src.sample().source_up
    clock.now = 320.0
    up = src.sample()
    assert up.source_up and len(up.devices) == 3
    assert up.parts[0].success


def test_not_supported_fields() -> None:
    src = SimulatedSource(scenario(FAULTS), clock=FakeClock(), start=0.0)
    before = device(at(src, 599.0), "0")
    assert before.power_watts is not None
    assert before.processes[0].sm_utilization_ratio == 0.5
    during = device(at(src, 600.0), "0")
    assert during.power_watts is None
    assert during.processes[0].sm_utilization_ratio is None
    assert during.utilization_ratio == 0.5
    assert device(at(src, 610.0), "0").power_watts is not None
    assert device(at(src, 0.0), "1/0").memory_used_bytes is None
    # static per-GPU `unsupported`
    s = SimulatedSource(scenario("""
        gpus: [{unsupported: [energy_joules, ecc_corrected_errors, process_memory]}]
        processes: [{pid: 4, gpu: 0, memory: 1GiB}]
    """), clock=FakeClock(), start=0.0)
    d = device(at(s, 5.0), "0")
    assert d.energy_joules is None and d.ecc_corrected_errors is None
    assert d.ecc_uncorrected_errors == 0
    assert d.memory_used_bytes == GIB
    assert d.processes[0].memory_used_bytes is None


HEALTH = """
    gpus:
      - count: 2
      - {model: Tesla V100-SXM2-32GB}
      - {mig: [{profile: 7g.80gb, gpu_instance_id: 0}], remapped_rows: {correctable: 5}}
    processes:
      - {pid: 1, gpu: 1, utilization: 0.9}
    faults:
      # GPU 1 goes bad at 2 min: an uncorrectable ECC error (XIDs 94 and 63) and a row
      # remap pending until the GPU is reset at 10 min; from then on the row is remapped.
      - {type: ecc, gpu: 1, uncorrected: 1, at: 2m}
      - {type: xid, gpu: 1, code: 94, at: 2m}
      - {type: xid, gpu: 1, code: 63, at: 2m}
      - {type: row_remap, gpu: 1, at: 2m, for: 8m, uncorrectable: 1, pending: true}
      - {type: row_remap, gpu: 1, at: 10m, uncorrectable: 1}
      # GPU 0: a remap fails at 1 h; it falls off the bus at 2 h.
      - {type: row_remap, gpu: 0, at: 1h, uncorrectable: 512, failed: true}
      - {type: xid, gpu: 0, code: 79, at: 2h}
      - {type: lost, gpu: 0, at: 2h}
      - {type: ecc, gpu: 2, corrected: 3, at: 10, every: 10, count: 2}
      - {type: not_supported, gpu: 3, fields: [row_remapping], at: 50, for: 10}
"""
HEALTHY = RowRemapping(0, 0, pending=False, failed=False)


def test_a_gpu_planted_broken_reports_ecc_xids_and_a_pending_row_remap() -> None:
    src = SimulatedSource(scenario(HEALTH), clock=FakeClock(), start=0.0)
    before = device(at(src, 119.0), "1")
    assert (before.row_remapping, before.ecc_uncorrected_errors, before.xid_errors) == (
        HEALTHY, 0, ())
    bad = device(at(src, 120.0), "1")
    assert bad.up and bad.utilization_ratio == 0.9  # still runs its work
    assert bad.ecc_uncorrected_errors == 1 and bad.ecc_corrected_errors == 0
    assert bad.xid_errors == (XidCount(63, 1), XidCount(94, 1))
    assert bad.row_remapping == RowRemapping(0, 1, pending=True, failed=False)
    assert device(at(src, 599.9), "1").row_remapping == bad.row_remapping
    reset = device(at(src, 600.0), "1")  # reset: the row is remapped, nothing pending
    assert reset.row_remapping == RowRemapping(0, 1, pending=False, failed=False)
    assert reset.ecc_uncorrected_errors == 1
    assert device(at(src, 600.0), "0").row_remapping == HEALTHY


def test_a_failed_row_remap_then_a_gpu_fallen_off_the_bus() -> None:
    src = SimulatedSource(scenario(HEALTH), clock=FakeClock(), start=0.0)
    failed = device(at(src, 3600.0), "0")
    assert failed.up
    assert failed.row_remapping == RowRemapping(0, 512, pending=False, failed=True)
    lost = device(at(src, 7200.0), "0")
    assert not lost.up
    assert lost.row_remapping is None and lost.ecc_uncorrected_errors is None
    assert lost.xid_errors == (XidCount(79, 1),)
    assert device(at(src, 7200.0), "1").up


def test_ecc_fault_events_add_to_the_counts() -> None:
    src = SimulatedSource(scenario(HEALTH), clock=FakeClock(), start=0.0)
    corrected = [device(at(src, t), "2").ecc_corrected_errors for t in (0, 10, 19.9, 20, 1e5)]
    assert corrected == [0, 3, 3, 6, 6]  # 3 errors an event, two events
    assert device(at(src, 20), "2").ecc_uncorrected_errors == 0


def test_row_remapper_only_where_the_gpu_has_one() -> None:
    src = SimulatedSource(scenario(HEALTH), clock=FakeClock(), start=0.0)
    snap = at(src, 30.0)
    assert device(snap, "2").row_remapping is None  # Volta: before Ampere
    assert device(snap, "3").row_remapping == RowRemapping(5, 0, pending=False, failed=False)
    assert device(snap, "3/0").row_remapping is None  # a MIG slice: its parent's
    assert device(at(src, 55.0), "3").row_remapping is None  # not_supported window
    assert device(at(src, 60.0), "3").row_remapping is not None
    # Through the collector: absent, not 0, where there is no row remapper.
    remap = {(s.name, s.labels["gpu"], s.labels.get("cause")): s.value
             for family in GpuCollector(lambda: snap).collect() for s in family.samples
             if s.name in ("gpu_remapped_rows", "gpu_row_remap_pending",
                           "gpu_row_remap_failed")}
    assert {gpu for _, gpu, _ in remap} == {"0", "1", "3"}
    assert remap[("gpu_remapped_rows", "3", "correctable")] == 5.0
    assert remap[("gpu_row_remap_pending", "3", None)] == 0.0


def test_same_time_same_snapshot_regardless_of_prior_calls() -> None:
    text = SIMPLE + """
    faults: [{type: xid, gpu: 1, code: 48, at: 7, every: 11}]
    """
    s = scenario(text.replace("utilization: 0.25", "utilization: "
                              "{pattern: random, low: 0.1, high: 0.5, interval: 3, smooth: true}"))
    times = [0.0, 0.5, 7.25, 150.3, 333.3, 1234.5, 3601.7, 3599.99]
    fresh = [SimulatedSource(s, clock=FakeClock(), start=0.0).sample_at(t) for t in times]
    one = SimulatedSource(s, clock=FakeClock(), start=0.0)
    # dense forward, then backwards and jumping
    for t in range(0, 4000, 7):
        one.sample_at(t / 1.7)
    again = [one.sample_at(t) for t in reversed(times)][::-1]
    assert again == fresh
    assert [one.sample_at(t) for t in times] == fresh


def test_energy_integrates_power_and_is_monotonic() -> None:
    src = SimulatedSource(scenario("""
        gpus: [{power_idle: 100, power_limit: 300}]
        processes:
          - {pid: 1, gpu: 0, utilization: 0.5}
          - {pid: 2, gpu: 0, utilization: 0.5, start: 100, stop: 200}
    """), clock=FakeClock(), start=0.0)
    energy = [device(at(src, t), "0").energy_joules for t in (0, 0.5, 10, 100, 150, 200, 250)]
    # 200 W for 100 s, 300 W for 100 s, then 200 W again
    assert energy == pytest.approx([0, 100, 2000, 20000, 35000, 50000, 60000])
    ts = [i * 0.37 for i in range(1000)]
    series = [device(at(src, t), "0").energy_joules or 0.0 for t in ts]
    assert all(b >= a for a, b in itertools.pairwise(series))


def test_energy_does_not_depend_on_sampling_frequency() -> None:
    s = load_default_scenario()
    sparse = SimulatedSource(s, clock=FakeClock(), start=0.0)
    dense = SimulatedSource(s, clock=FakeClock(), start=0.0)
    for t in range(0, 1800, 3):
        dense.sample_at(t + 0.25)
    a = [d.energy_joules for d in sparse.sample_at(1800.6).devices]
    b = [d.energy_joules for d in dense.sample_at(1800.6).devices]
    assert a == b


def test_default_scenario_shows_what_it_promises() -> None:
    src = SimulatedSource(load_default_scenario(), clock=FakeClock(), start=0.0)
    snap = at(src, 1000.0)
    assert snap.driver_version == "550.127.05"
    assert [d.index for d in snap.devices] == [
        "0", "1", "2", "3", "4", "5", "6", "7", "7/1", "7/5", "7/13", "7/14"]
    util = {d.index: d.utilization_ratio for d in snap.devices}
    assert util["0"] == 0.93 and util["1"] == 0.91
    assert util["5"] == 0.0 and util["6"] == 0.0
    assert util["7"] is None and util["7/5"] is None
    assert util["7/1"] is not None
    assert util["4"] is not None and util["4"] >= 0.9
    assert device(snap, "5").memory_used_bytes == 14 * GIB  # allocated, idle, memory held
    assert device(snap, "6").processes == ()
    assert len(device(snap, "4").processes) == 4
    # bursty worker 2: high for 6 s of every 20 s
    assert device(at(src, 3.0), "2").utilization_ratio == 0.95
    assert device(at(src, 10.0), "2").utilization_ratio == 0.05
    # stepped eval job on GPU 3 (repeats every 720 s)
    assert [device(at(src, t), "3").utilization_ratio for t in (0, 130, 310, 600, 720)] == [
        0.15, 0.6, 0.85, 0.25, 0.15]
    # XID 31 on GPU 3 every 900 s from 300 s
    assert device(at(src, 299.0), "3").xid_errors == ()
    assert device(at(src, 1300.0), "3").xid_errors == (XidCount(31, 2),)
    # cron job on 7/5 runs 240 s of every 600 s; dev process on 7/13 from 120 s to 2400 s
    assert [p.pid for p in device(at(src, 100.0), "7/5").processes] == [81020]
    assert device(at(src, 300.0), "7/5").processes == ()
    assert device(at(src, 100.0), "7/13").processes == ()
    assert [p.pid for p in device(at(src, 200.0), "7/13").processes] == [82731]
    assert device(at(src, 2400.0), "7/13").processes == ()


def test_synthetic_8x64_samples() -> None:
    # Its cost per round (the sampler thread pays it every second) is bench/hot_paths.py's.
    clock = FakeClock(0.0)
    src = SimulatedSource(synthetic(8, 64), clock=clock, start=0.0)
    for _ in range(60):
        clock.now += 1.0
        snap = src.sample()
    assert len(snap.devices) == 8
    assert sum(len(d.processes) for d in snap.devices) > 8 * 40  # some come and go


# --- work signals: exact integrals of scenario time

WORK = """
    gpus:
      - model: NVIDIA H100 80GB HBM3        # Hopper: GPM by default
        power_idle: 70
        power_limit: 700
        throttle:
          thermal: {pattern: bursty, low: 0.0, high: 1.0, period: 10, duty: 0.5}
          power: 0.25
      - model: NVIDIA H100 80GB HBM3
        mig:
          - {profile: 3g.40gb, gpu_instance_id: 1, utilization_supported: true}
          - {profile: 1g.10gb, gpu_instance_id: 9}
      - {model: NVIDIA A100-SXM4-80GB}      # Ampere: no GPM
    processes:
      - pid: 1
        gpu: 0
        utilization: 0.5
        activity: {sm: 0.6, tensor: 0.4, dram: 0.3, occupancy: 0.5, pcie_rx: 1GiB,
                   nvlink_tx: 10GiB}
      - pid: 2
        gpu: 0
        utilization: {pattern: bursty, low: 0.05, high: 0.45, period: 20, duty: 0.3}
        activity: {sm: 0.2, tensor: 0.0, dram: 0.5}
      - pid: 3
        gpu: "1/1"
        utilization: {pattern: stepped, steps: [[0, 0.8], [30, 0.2]], repeat: 60}
        activity: {sm: 0.9, tensor: 0.5, power: 0.8}
      - {pid: 4, gpu: 2, utilization: 0.7}
"""


def increase(src: SimulatedSource, index: str, name: str, t1: float, t2: float) -> float:
    a = getattr(device(src.sample_at(t1), index), name)
    b = getattr(device(src.sample_at(t2), index), name)
    return float(b - a)


@pytest.mark.parametrize(("t1", "t2"), [(0.0, 60.0), (13.7, 133.7), (1000.0, 1600.0),
                                        (3600.25, 7200.5)])
def test_counters_increase_by_activity_times_elapsed(t1: float, t2: float) -> None:
    src = SimulatedSource(scenario(WORK), clock=FakeClock(), start=0.0)
    elapsed = t2 - t1
    # Means over the window, from the patterns (the bursty and stepped ones over whole
    # periods where the window holds whole periods; else against a fine numerical mean).
    util0 = [0.5 + (0.45 if (s % 20) < 6 else 0.05) for s in fine(t1, t2)]
    busy_mean = statistics.fmean(util0)
    assert increase(src, "0", "busy_seconds", t1, t2) == pytest.approx(
        busy_mean * elapsed, rel=0.01)
    sm0 = [0.5 * 0.6 + 0.2 * (0.45 if (s % 20) < 6 else 0.05) for s in fine(t1, t2)]
    assert increase(src, "0", "sm_active_seconds", t1, t2) == pytest.approx(
        statistics.fmean(sm0) * elapsed, rel=0.01)
    assert increase(src, "0", "tensor_active_seconds", t1, t2) == pytest.approx(
        0.5 * 0.4 * elapsed, rel=1e-9)
    assert increase(src, "0", "pcie_receive_bytes", t1, t2) == pytest.approx(
        0.5 * GIB * elapsed, rel=1e-9)
    assert increase(src, "0", "nvlink_transmit_bytes", t1, t2) == pytest.approx(
        0.5 * 10 * GIB * elapsed, rel=1e-9)
    assert increase(src, "0", "pcie_transmit_bytes", t1, t2) == 0.0
    # Throttling: a square wave at half duty and a constant quarter.
    thermal = [1.0 if (s % 10) < 5 else 0.0 for s in fine(t1, t2)]
    throttle = {
        t.reason: t.seconds for t in device(src.sample_at(t2), "0").throttle_seconds
    }
    before = {t.reason: t.seconds for t in device(src.sample_at(t1), "0").throttle_seconds}
    assert throttle["thermal"] - before["thermal"] == pytest.approx(
        statistics.fmean(thermal) * elapsed, rel=0.01)
    assert throttle["power"] - before["power"] == pytest.approx(0.25 * elapsed, rel=1e-9)
    assert throttle["reliability"] == 0.0
    # A MIG slice: its own processes' activity.
    slice_util = [0.8 if (s % 60) < 30 else 0.2 for s in fine(t1, t2)]
    assert increase(src, "1/1", "busy_seconds", t1, t2) == pytest.approx(
        statistics.fmean(slice_util) * elapsed, rel=0.01)
    assert increase(src, "1/1", "sm_active_seconds", t1, t2) == pytest.approx(
        0.9 * statistics.fmean(slice_util) * elapsed, rel=0.01)


def fine(t1: float, t2: float, step: float = 0.01) -> list[float]:
    """Midpoints of ``step``-second slices of [t1, t2]."""
    n = round((t2 - t1) / step)
    return [t1 + (i + 0.5) * step for i in range(n)]


def test_work_signals_where_the_device_gives_them_and_nowhere_else() -> None:
    src = SimulatedSource(scenario(WORK), clock=FakeClock(), start=0.0)
    snap = src.sample_at(100.0)
    h100, parent, busy_slice, idle_slice, a100 = snap.devices
    assert h100.sm_occupancy_ratio == pytest.approx(0.25)  # a gauge: 0.5 x 0.5 now
    assert [t.reason for t in h100.throttle_seconds] == list(THROTTLE_REASONS)
    # The MIG parent: no utilization, so no busy time; GPM weighted by compute share.
    assert parent.busy_seconds is None
    assert parent.sm_active_seconds == pytest.approx(3 / 7 * busy_slice.sm_active_seconds)
    assert parent.throttle_seconds and not busy_slice.throttle_seconds
    # A slice without utilization has no busy time, but GPM it has (idle: a true 0).
    assert idle_slice.busy_seconds is None
    assert idle_slice.sm_active_seconds == 0.0
    assert busy_slice.busy_seconds is not None
    # No GPM on Ampere: absent, never 0. Busy time and throttling it has.
    assert {name: getattr(a100, name) for name in GPM_SIGNALS} == dict.fromkeys(GPM_SIGNALS)
    assert a100.busy_seconds == pytest.approx(70.0)
    assert len(a100.throttle_seconds) == len(THROTTLE_REASONS)


def test_unsupported_work_signals_are_absent() -> None:
    src = SimulatedSource(scenario("""
        gpus:
          - model: NVIDIA H100 80GB HBM3
            unsupported: [busy_seconds, nvlink_receive_bytes, throttle_seconds]
          - {model: NVIDIA H100 80GB HBM3, gpm: false}
        processes: [{pid: 1, gpu: 0, utilization: 0.5}, {pid: 2, gpu: 1, utilization: 0.5}]
        faults:
          - {type: not_supported, gpu: 1, fields: [sm_active_seconds], at: 10, for: 10}
    """), clock=FakeClock(), start=0.0)
    first, second = src.sample_at(15.0).devices
    assert first.busy_seconds is None and first.nvlink_receive_bytes is None
    assert first.throttle_seconds == ()
    assert first.sm_active_seconds == pytest.approx(7.5)  # default activity: sm = 1
    assert first.tensor_active_seconds == 0.0
    assert second.sm_active_seconds is None  # gpm: false
    assert second.busy_seconds == pytest.approx(7.5)


def test_work_counters_are_monotonic_and_order_independent() -> None:
    text = WORK + """
      - {pid: 5, gpu: 2, utilization: {pattern: random, low: 0.3, high: 0.9, interval: 3}}
      - {pid: 6, gpu: 2, utilization: {pattern: sine, low: 0.1, high: 0.5, period: 50}}
    """
    times = [0.0, 0.3, 5.0, 17.2, 99.9, 100.0, 250.5, 3601.0, 3700.0]
    forward = SimulatedSource(scenario(text), clock=FakeClock(), start=0.0)
    snaps = [forward.sample_at(t) for t in times]
    backward = SimulatedSource(scenario(text), clock=FakeClock(), start=0.0)
    assert [backward.sample_at(t) for t in reversed(times)][::-1] == snaps
    names = ("busy_seconds", *(n for n in GPM_SIGNALS if n != "sm_occupancy_ratio"))
    for earlier, later in itertools.pairwise(snaps):
        for a, b in zip(earlier.devices, later.devices, strict=True):
            for name in names:
                if getattr(a, name) is not None:
                    assert getattr(b, name) >= getattr(a, name), (a.index, name)
    # GPU 2 can add up to more than 1 (0.7 + 0.9 + 0.5): its integral is numerical, and
    # still close to the mean of its clamped utilization.
    src = SimulatedSource(scenario(text), clock=FakeClock(), start=0.0)
    u = [device(src.sample_at(s), "2").utilization_ratio for s in fine(100.0, 160.0, 0.05)]
    got = increase(src, "2", "busy_seconds", 100.0, 160.0)
    assert got == pytest.approx(statistics.fmean(u) * 60.0, rel=0.01)


def test_power_follows_what_the_processes_draw() -> None:
    # A hung collective: every GPU 100 % "utilized", spinning, drawing little.
    src = SimulatedSource(scenario("""
        gpus: [{model: NVIDIA H100 80GB HBM3, power_idle: 72, power_limit: 700}]
        processes:
          - {pid: 1, gpu: 0, utilization: 1.0,
             activity: {sm: 0.1, tensor: 0, dram: 0, power: 0.1}}
    """), clock=FakeClock(), start=0.0)
    dev = device(src.sample_at(600.0), "0")
    assert dev.utilization_ratio == 1.0
    assert dev.power_watts == pytest.approx(72 + 628 * 0.1)
    assert dev.power_watts < 0.25 * 700
    assert dev.sm_active_seconds == pytest.approx(60.0)
    assert dev.tensor_active_seconds == 0.0
    assert dev.energy_joules == pytest.approx(600 * (72 + 62.8))

"""GPM through the real pynvml (its ``c_nvmlGpmMetricsGet_t``, ``c_nvmlGpmSupport_t`` and
sample handles) over FakeNvml: per GPU and per MIG GPU instance, the means become counters of
active seconds and bytes."""

from __future__ import annotations

import pynvml
import pytest

from gpuscope.exporter.model import GPM_SIGNALS, DeviceSample
from tests.exporter.sources.fake_nvml import FakeGpu, FakeNvml
from tests.exporter.sources.nvml.conftest import FakeClock, SourceFactory, by_uuid

MIB = 1048576
SM = pynvml.NVML_GPM_METRIC_SM_UTIL
TENSOR = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
GRAPHICS = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
PCIE_RX = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
PCIE_TX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
NVLINK_RX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
NVLINK_TX = pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC

BUSY = {SM: 40.0, TENSOR: 25.0, DRAM: 60.0, GRAPHICS: 90.0, OCCUPANCY: 30.0,
        PCIE_RX: 100.0, PCIE_TX: 50.0, NVLINK_RX: 1000.0, NVLINK_TX: 2000.0}


def hopper(gpu: FakeGpu, means: dict[int, float] | None = None) -> FakeGpu:
    gpu.architecture = pynvml.NVML_DEVICE_ARCH_HOPPER
    gpu.name = "NVIDIA H100 80GB HBM3"
    gpu.gpm_supported = True
    gpu.gpm = dict(BUSY if means is None else means)
    return gpu


def gpm_values(dev: DeviceSample) -> dict[str, float | None]:
    return {name: getattr(dev, name) for name in GPM_SIGNALS}


def expected(means: dict[int, float], seconds: float) -> dict[str, float]:
    return {
        "sm_active_seconds": means[SM] / 100 * seconds,
        "tensor_active_seconds": means[TENSOR] / 100 * seconds,
        "dram_active_seconds": means[DRAM] / 100 * seconds,
        "graphics_active_seconds": means[GRAPHICS] / 100 * seconds,
        "sm_occupancy_ratio": means[OCCUPANCY] / 100,
        "pcie_receive_bytes": means[PCIE_RX] * MIB * seconds,
        "pcie_transmit_bytes": means[PCIE_TX] * MIB * seconds,
        "nvlink_receive_bytes": means[NVLINK_RX] * MIB * seconds,
        "nvlink_transmit_bytes": means[NVLINK_TX] * MIB * seconds,
    }


def test_gpm_means_become_counters_per_gpu(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0])
    source = make_source()

    first = by_uuid(source.sample(), gpu.uuid)
    # One sample is not an interval: no GPM series yet (absent, not 0).
    assert gpm_values(first) == dict.fromkeys(GPM_SIGNALS)

    mono.advance(2.0)
    second = by_uuid(source.sample(), gpu.uuid)
    assert gpm_values(second) == pytest.approx(expected(BUSY, 2.0))

    idle = {**BUSY, SM: 10.0, TENSOR: 0.0, DRAM: 0.0, OCCUPANCY: 5.0, NVLINK_TX: 0.0}
    gpu.gpm = dict(idle)
    mono.advance(3.0)
    third = by_uuid(source.sample(), gpu.uuid)
    want = {k: v + expected(idle, 3.0)[k] for k, v in expected(BUSY, 2.0).items()}
    want["sm_occupancy_ratio"] = 0.05  # a gauge: the last interval's mean
    assert gpm_values(third) == pytest.approx(want)

    # Two buffers for the one target, allocated once and reused every round.
    assert fake.calls["nvmlGpmSampleAlloc"] == 2
    assert fake.gpm_samples_allocated() == 2
    assert fake.calls["nvmlGpmSampleGet"] == 3
    assert [(first_seq, second_seq) for _, first_seq, second_seq in fake.gpm_requests] == [
        (1, 2), (2, 3)
    ]
    # The A100 beside it has no GPM: nothing is asked of it, nothing reported.
    other = by_uuid(source.sample(), fake.gpus[1].uuid)
    assert gpm_values(other) == dict.fromkeys(GPM_SIGNALS)
    source.close()
    assert fake.gpm_samples_allocated() == 0  # freed with the session


def test_gpm_per_mig_gpu_instance(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0], {**BUSY, SM: 55.0})
    busy = fake.add_mig_slice(gpu, "3g.40gb", gpu_instance_id=1)
    idle = fake.add_mig_slice(gpu, "1g.10gb", gpu_instance_id=9)
    busy.gpm = {**BUSY, SM: 85.0, TENSOR: 70.0}
    idle.gpm = dict.fromkeys(BUSY, 0.0)
    source = make_source()
    source.sample()
    mono.advance(1.5)
    snap = source.sample()

    assert gpm_values(by_uuid(snap, busy.uuid)) == pytest.approx(
        expected({**BUSY, SM: 85.0, TENSOR: 70.0}, 1.5))
    assert gpm_values(by_uuid(snap, idle.uuid)) == pytest.approx(
        expected(dict.fromkeys(BUSY, 0.0), 1.5))
    # The parent: the whole GPU's own sample.
    assert by_uuid(snap, gpu.uuid).sm_active_seconds == pytest.approx(0.55 * 1.5)
    # One sample per GPU and per GPU instance per round, each pair from one target.
    targets = sorted({target for target, _, _ in fake.gpm_requests})
    assert targets == sorted([(gpu.address, -1), (gpu.address, 1), (gpu.address, 9)])
    assert fake.calls["nvmlGpmMigSampleGet"] == 4
    assert fake.gpm_samples_allocated() == 6


def test_a_destroyed_mig_instance_frees_its_gpm_buffers_and_a_new_one_starts_afresh(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0], dict(BUSY))
    old = fake.add_mig_slice(gpu, "3g.40gb", gpu_instance_id=1)
    old.gpm = dict(BUSY)
    source = make_source(mig_layout_interval_seconds=5.0)
    source.sample()
    mono.advance(1.5)
    source.sample()
    assert fake.gpm_samples_allocated() == 4  # the GPU's two buffers, the instance's two

    # The instance is destroyed and another created under the same GPU-instance id (MIG
    # reconfigured, no driver reload): its first GPM interval starts at its first sample.
    fake.remove_mig_slice(old)
    new = fake.add_mig_slice(gpu, "1g.10gb", gpu_instance_id=1,
                             uuid="MIG-5e1f0a2b-3c4d-4e5f-8a6b-7c8d9e0f1a2b")
    new.gpm = {**BUSY, SM: 10.0}
    mono.advance(5.0)
    snap = source.sample()
    assert [d.uuid for d in snap.devices if d.is_mig] == [new.uuid]
    assert gpm_values(by_uuid(snap, new.uuid)) == dict.fromkeys(GPM_SIGNALS)
    assert fake.gpm_samples_allocated() == 4  # the old instance's two freed, two new
    mono.advance(1.5)
    snap = source.sample()
    assert by_uuid(snap, new.uuid).sm_active_seconds == pytest.approx(0.10 * 1.5)


def test_a_destroyed_compute_instance_leaves_its_siblings_gpm(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    # Two compute instances of one GPU instance read its GPM target: destroying one freed
    # the buffers the other still read (its counter then lost an interval).
    gpu = hopper(fake.gpus[0], dict(BUSY))
    one = fake.add_mig_slice(gpu, "3g.40gb", gpu_instance_id=1)
    two = fake.add_mig_slice(gpu, "3g.40gb", gpu_instance_id=1,
                             uuid="MIG-6e1f0a2b-3c4d-4e5f-8a6b-7c8d9e0f1a2b")
    one.gpm = two.gpm = dict(BUSY)
    source = make_source(mig_layout_interval_seconds=5.0)
    source.sample()
    mono.advance(1.5)
    first = by_uuid(source.sample(), two.uuid).sm_active_seconds
    fake.remove_mig_slice(one)
    mono.advance(5.0)
    snap = source.sample()
    assert [d.uuid for d in snap.devices if d.is_mig] == [two.uuid]
    assert first is not None
    assert by_uuid(snap, two.uuid).sm_active_seconds == pytest.approx(first + 0.40 * 5.0)


def test_a_gpu_without_gpm_has_no_gpm_series(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    fake.gpus[0].gpm = dict(BUSY)  # would answer, but the GPU says it has no GPM
    source = make_source()
    for _ in range(3):
        snap = source.sample()
        mono.advance(1.0)
    for dev in snap.devices:
        assert gpm_values(dev) == dict.fromkeys(GPM_SIGNALS)
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 2
    assert fake.calls["nvmlGpmSampleGet"] == 0
    assert fake.calls["nvmlGpmSampleAlloc"] == 0


def test_an_nvml_without_gpm_entry_points_has_no_gpm(
    make_source: SourceFactory, mono: FakeClock
) -> None:
    fake = FakeNvml(1, missing_functions={"nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet"})
    hopper(fake.gpus[0])
    source = make_source(library_loader=lambda: fake)
    source.sample()
    mono.advance(1.0)
    snap = source.sample()
    assert snap.devices[0].up
    assert gpm_values(snap.devices[0]) == dict.fromkeys(GPM_SIGNALS)
    source.close()
    assert fake.init_count == 0


def test_one_unsupported_metric_is_absent_and_the_others_kept(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0])
    gpu.gpm_unsupported = {NVLINK_RX, NVLINK_TX}  # a GPU without NVLink
    source = make_source()
    source.sample()
    mono.advance(1.0)
    dev = by_uuid(source.sample(), gpu.uuid)
    want: dict[str, float | None] = dict(expected(BUSY, 1.0))
    want["nvlink_receive_bytes"] = want["nvlink_transmit_bytes"] = None
    assert gpm_values(dev) == pytest.approx(want)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -5.0])
def test_a_non_finite_or_negative_mean_is_absent_and_does_not_poison_the_counter(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock, bad: float
) -> None:
    # One interval's SM mean NaN, infinite or negative (a driver's bad answer): that
    # interval's SM is unknown (absent), and the counter goes on from what it had: NaN added
    # once would hold it NaN, and a negative mean would take it back, for the process' life.
    gpu = hopper(fake.gpus[0])
    source = make_source()
    source.sample()
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).sm_active_seconds == pytest.approx(0.4)
    gpu.gpm = {**BUSY, SM: bad}
    mono.advance(1.0)
    dev = by_uuid(source.sample(), gpu.uuid)
    assert dev.sm_active_seconds is None
    assert dev.tensor_active_seconds == pytest.approx(0.5)
    gpu.gpm = dict(BUSY)
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).sm_active_seconds == pytest.approx(0.8)


def test_gpm_counters_never_go_back_through_gpu_loss(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0])
    source = make_source()
    source.sample()
    mono.advance(1.0)
    before = by_uuid(source.sample(), gpu.uuid).sm_active_seconds
    assert before == pytest.approx(0.4)

    gpu.lost = True
    mono.advance(1.0)
    lost = by_uuid(source.sample(), gpu.uuid)
    assert not lost.up and lost.sm_active_seconds is None

    mono.advance(60.0)
    gpu.lost = False
    back = by_uuid(source.sample(), gpu.uuid)
    # Back with the count it had: the outage is no GPM interval (no sample spans it).
    assert back.up and back.sm_active_seconds == pytest.approx(0.4)
    mono.advance(2.0)
    later = by_uuid(source.sample(), gpu.uuid)
    assert later.sm_active_seconds == pytest.approx(0.4 + 0.8)
    assert fake.gpm_samples_allocated() == 2  # the same two buffers throughout


def test_gpm_counters_survive_a_driver_reload(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0])
    source = make_source()
    source.sample()
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).sm_active_seconds == pytest.approx(0.4)

    fake.driver_loaded = False
    assert not source.sample().source_up
    fake.driver_loaded = True
    mono.advance(1.0)
    snap = source.sample()  # a new session: the first sample again
    assert snap.source_up
    assert by_uuid(snap, gpu.uuid).sm_active_seconds == pytest.approx(0.4)
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).sm_active_seconds == pytest.approx(0.8)


def test_gpm_has_its_own_cadence(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0])
    source = make_source(gpm_interval_seconds=10.0)
    values = []
    for _ in range(25):
        values.append(by_uuid(source.sample(), gpu.uuid).sm_active_seconds)
        mono.advance(1.0)
    # GPM at rounds 0, 10 and 20; in between the series keeps its last count.
    assert fake.calls["nvmlGpmSampleGet"] == 3
    assert values[:10] == [None] * 10
    assert values[10:20] == pytest.approx([4.0] * 10)
    assert values[20:] == pytest.approx([8.0] * 5)


def test_gpm_is_stretched_when_it_costs_more_than_its_budget(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    hopper(fake.gpus[0])
    ticks = FakeClock(100.0)

    def slow_monotonic() -> float:
        ticks.advance(0.001)  # every reading of the clock: 1 ms of work went by
        return ticks.now

    source = make_source(monotonic=slow_monotonic, gpm_interval_seconds=0.0,
                         gpm_cpu_budget=0.001)
    for _ in range(20):
        source.sample()
        ticks.advance(0.5)
    # A GPM round measured at >= 1 ms at a budget of 0.1 %: >= 1 s between GPM rounds.
    assert 3 <= fake.calls["nvmlGpmSampleGet"] <= 10


def test_gpm_off(fake: FakeNvml, make_source: SourceFactory, mono: FakeClock) -> None:
    hopper(fake.gpus[0])
    source = make_source(gpm=False)
    source.sample()
    mono.advance(1.0)
    assert gpm_values(source.sample().devices[0]) == dict.fromkeys(GPM_SIGNALS)
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 0


def test_mig_devices_of_one_gpu_instance_share_its_sample(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0])
    # Two compute instances of GPU instance 3: two MIG devices, one GPM target.
    first = fake.add_mig_slice(gpu, "4g.40gb", gpu_instance_id=3,
                               uuid="MIG-00000000-0000-0000-0000-0000000000c1")
    second = fake.add_mig_slice(gpu, "4g.40gb", gpu_instance_id=3,
                                uuid="MIG-00000000-0000-0000-0000-0000000000c2")
    first.gpm = {**BUSY, SM: 60.0}
    source = make_source()
    source.sample()
    mono.advance(1.0)
    snap = source.sample()
    assert by_uuid(snap, first.uuid).sm_active_seconds == pytest.approx(0.6)
    assert by_uuid(snap, second.uuid).sm_active_seconds == pytest.approx(0.6)
    assert fake.calls["nvmlGpmMigSampleGet"] == 2  # one per round, not one per device


def test_a_failing_gpm_read_leaves_the_gpu_up(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = hopper(fake.gpus[0])
    source = make_source()
    source.sample()
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).sm_active_seconds == pytest.approx(0.4)
    gpu.errors["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_UNKNOWN
    mono.advance(1.0)
    dev = by_uuid(source.sample(), gpu.uuid)
    assert dev.up and dev.sm_active_seconds == pytest.approx(0.4)  # kept, not advanced
    del gpu.errors["nvmlGpmSampleGet"]
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).sm_active_seconds == pytest.approx(1.2)

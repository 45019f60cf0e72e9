"""``gpu_busy_seconds_total`` through the real pynvml (``nvmlDeviceGetSamples`` and its
``c_nvmlSample_t`` array) over FakeNvml: the driver's utilization samples integrated over
their timestamps with a per-device cursor, or the sampled utilization where there are none."""

from __future__ import annotations

import itertools

import pytest

from tests.exporter.sources.fake_nvml import FakeNvml
from tests.exporter.sources.nvml.conftest import T0_US, FakeClock, SourceFactory, by_uuid

MS = 1000  # µs


def exact(samples: list[tuple[int, int]]) -> float:
    """Busy seconds of consecutive samples: each value over the time since the one before."""
    return sum(v / 100 * (t - t0) / 1e6 for (t0, _), (t, v) in itertools.pairwise(samples))


def test_samples_are_integrated_each_exactly_once(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    # Older than the cursor's start (1 s before the exporter started): not counted.
    gpu.add_busy_sample(T0_US - 3000 * MS, 100)
    seen = [(T0_US - 500 * MS, 50), (T0_US - 250 * MS, 100)]
    for ts, v in seen:
        gpu.add_busy_sample(ts, v)
    source = make_source()
    # The first sample read anchors the count; the second adds 100 % x 0.25 s.
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(0.25)

    values = []
    for k in range(1, 9):  # the driver samples every 1/6 s; the exporter reads every second
        for j in range(6):
            ts = T0_US + (k - 1) * 1_000_000 + j * 166_667
            v = (k * 7 + j * 13) % 101
            gpu.add_busy_sample(ts, v)
            seen.append((ts, v))
        wall.advance(1.0)
        values.append(by_uuid(source.sample(), gpu.uuid).busy_seconds)
    assert values[-1] == pytest.approx(exact(seen), rel=1e-12)
    assert values == sorted(values)

    # Rounds with no new sample (NOT_FOUND) add nothing; nothing is counted twice.
    for _ in range(3):
        assert by_uuid(source.sample(), gpu.uuid).busy_seconds == values[-1]
    # The cursor travels: each read asks only for samples after the newest one seen.
    assert fake.calls["nvmlDeviceGetSamples"] > 0


def test_no_sample_lost_when_rounds_are_late(
    fake: FakeNvml, make_source: SourceFactory
) -> None:
    gpu = fake.gpus[0]
    source = make_source()
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == 0.0  # no sample yet
    seen = [(T0_US + i * 200 * MS, (i * 37) % 100) for i in range(50)]  # 10 s of samples
    for ts, v in seen[:3]:
        gpu.add_busy_sample(ts, v)
    first = by_uuid(source.sample(), gpu.uuid).busy_seconds
    for ts, v in seen[3:]:  # a slow round: 47 samples arrive before the next read
        gpu.add_busy_sample(ts, v)
    total = by_uuid(source.sample(), gpu.uuid).busy_seconds
    assert first == pytest.approx(exact(seen[:3]))
    assert total == pytest.approx(exact(seen))


def test_a_gap_longer_than_the_driver_buffer_is_not_integrated(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock
) -> None:
    gpu = fake.gpus[0]
    source = make_source()
    gpu.add_busy_sample(T0_US, 100)
    gpu.add_busy_sample(T0_US + 1_000_000, 100)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(1.0)
    gpu.add_busy_sample(T0_US + 61_000_000, 100)  # a minute without samples (GPU reset)
    gpu.add_busy_sample(T0_US + 62_000_000, 50)
    wall.advance(62.0)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(1.5)


def test_without_driver_samples_the_sampled_utilization_is_integrated(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = fake.gpus[0]
    for each in fake.gpus:
        each.busy_samples_supported = False
    gpu.util_gpu = 50
    source = make_source()
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == 0.0
    mono.advance(2.0)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(1.0)
    gpu.util_gpu = 100
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(2.0)
    # Asked once whether there are samples; never again this session.
    assert fake.calls["nvmlDeviceGetSamples"] == 2  # one per GPU


def test_an_nvml_without_the_samples_call_falls_back_too(
    make_source: SourceFactory, mono: FakeClock
) -> None:
    fake = FakeNvml(1, missing_functions={"nvmlDeviceGetSamples"})
    fake.gpus[0].util_gpu = 25
    source = make_source(library_loader=lambda: fake)
    source.sample()
    mono.advance(4.0)
    assert source.sample().devices[0].busy_seconds == pytest.approx(1.0)
    source.close()


def test_mig_devices_have_no_busy_time(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    mig = fake.add_mig_slice(0, "3g.40gb", gpu_instance_id=1)
    source = make_source()
    source.sample()
    mono.advance(1.0)
    snap = source.sample()
    # NVML gives neither samples nor utilization for a MIG parent or slice: absent, not 0.
    assert by_uuid(snap, fake.gpus[0].uuid).busy_seconds is None
    assert by_uuid(snap, mig.uuid).busy_seconds is None
    assert by_uuid(snap, fake.gpus[1].uuid).busy_seconds == 0.0


def test_busy_time_never_goes_back_through_gpu_loss(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = fake.gpus[0]
    gpu.busy_samples_supported = False
    gpu.util_gpu = 100
    source = make_source()
    source.sample()
    mono.advance(3.0)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(3.0)
    gpu.lost = True
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds is None
    mono.advance(30.0)
    gpu.lost = False
    # Back with its count; the outage is not counted as busy.
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(3.0)
    mono.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(4.0)


def test_busy_time_survives_a_driver_reload(
    fake: FakeNvml, make_source: SourceFactory, mono: FakeClock
) -> None:
    gpu = fake.gpus[0]
    source = make_source()
    gpu.add_busy_sample(T0_US, 0)
    gpu.add_busy_sample(T0_US + 2_000_000, 100)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(2.0)
    fake.driver_loaded = False
    assert not source.sample().source_up
    fake.driver_loaded = True
    gpu.add_busy_sample(T0_US + 3_000_000, 100)
    mono.advance(1.0)
    # The cursor outlives the session: the old samples are not read again.
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(3.0)


def test_busy_time_keeps_counting_after_the_wall_clock_steps_back(
    fake: FakeNvml, make_source: SourceFactory, wall: FakeClock, mono: FakeClock
) -> None:
    # The driver stamps its samples with the wall clock. When NTP steps it back (a node
    # that booted with its clock an hour ahead), every new sample is older than the cursor:
    # read past the cursor, none came for an hour, and the GPU read idle while it worked.
    gpu = fake.gpus[0]
    source = make_source()
    for i in range(6):
        gpu.add_busy_sample(T0_US + i * 200 * MS, 100)
    wall.advance(1.0)
    assert by_uuid(source.sample(), gpu.uuid).busy_seconds == pytest.approx(0.8)
    stepped = T0_US + 1_000_000 - 3600 * 1_000_000  # the wall clock, an hour back
    wall.advance(-3600.0)
    values = []
    for k in range(3):
        for j in range(5):  # 100 % busy, samples every 200 ms on the new clock
            gpu.add_busy_sample(stepped + k * 1_000_000 + (j + 1) * 200 * MS, 100)
        wall.advance(1.0)
        mono.advance(1.0)
        values.append(by_uuid(source.sample(), gpu.uuid).busy_seconds)
    # The first sample on the new clock anchors the count again (the jump back is not
    # integrated, nor are the samples stamped before it read again); then every second
    # busy adds a second.
    assert values == pytest.approx([1.6, 2.6, 3.6])

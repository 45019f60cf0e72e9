"""A device's verdicts agree across sections (issue 29, item 4): a GPU listed as spinning for
the required time counts as idle in its node's verdict and in the idle cost, whatever the
histories of the signals each verdict reads.

The case found in embedded mode 3.5 minutes after start: GPM's counters give their first rate
one scrape later than the busy counter (a rate needs two samples of a counter that appears
a sampling round later), so the spinning rule had a run from GPM's first step and the idle
rule one from utilization's, one step shorter than the history: all 8 GPUs of a p5.48xlarge
listed as spinning, the node missing from the idle nodes and its $55.04/h from the cost.
"""

from __future__ import annotations

import pytest

from gpuscope.dashboard.data import EmbeddedData, Sample
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.views import FleetView, page_view

INTERVAL = 15.0
T0 = 1_800_000_000.0


def _info(uuid: str, gpu: int, instance_type: str) -> list[Sample]:
    return [
        ("gpu_info", {"gpu": str(gpu), "uuid": uuid, "model": "NVIDIA H100 80GB HBM3",
                            "driver_version": "580", "pci_bus_id": f"0000:{gpu:02x}:00.0",
                            "parent_uuid": "", "mig_profile": ""}, 1.0),
        ("gpu_node_info", {"instance_type": instance_type, "zone": "us-east-1a",
                                 "capacity_type": "on-demand"}, 1.0),
    ]


def _spinning_node(store: EmbeddedData, node: str, gpus: int, instance_type: str,
                   scrapes: int, gpm_from: int, gpm: bool = True,
                   working: frozenset[int] = frozenset()) -> None:
    """``gpus`` GPUs at 100 % utilization doing no work: with GPM, SM activity 0.05 and no
    tensor or DRAM activity, the GPM counters first served at scrape ``gpm_from``; without
    GPM, 60 W of a 700 W limit, the energy counter first served at ``gpm_from``. The GPUs
    in ``working`` do work: tensor activity 0.6."""
    for k in range(scrapes):
        t = T0 + k * INTERVAL
        elapsed = k * INTERVAL
        samples: list[Sample] = []
        for g in range(gpus):
            uuid = f"GPU-{node}-{g}"
            lab = {"gpu": str(g), "uuid": uuid}
            samples += _info(uuid, g, instance_type)
            samples.append(("gpu_utilization_ratio", lab, 1.0))
            samples.append(("gpu_busy_seconds_total", lab, 1000.0 + elapsed))
            samples.append(("gpu_power_limit_watts", lab, 700.0))
            samples.append(("gpu_power_watts", lab, 60.0 if not gpm else 120.0))
            if k >= gpm_from:
                since = elapsed - gpm_from * INTERVAL
                if gpm:
                    samples.append(("gpu_sm_active_seconds_total", lab, 0.05 * since))
                    samples.append(("gpu_tensor_active_seconds_total", lab,
                                    0.6 * since if g in working else 0.0))
                    samples.append(("gpu_dram_active_seconds_total", lab, 0.0))
                else:
                    samples.append(("gpu_energy_joules_total", lab, 60.0 * since))
        store.ingest(node, samples, t)


def _view(scrapes: int, build: list[tuple[str, int, str, int, bool]]) -> FleetView:
    end = T0 + (scrapes - 1) * INTERVAL
    store = EmbeddedData([], interval=INTERVAL, clock=lambda: end + 1.0,
                         extra_metrics=registry.step_metrics())
    for node, gpus, instance_type, gpm_from, gpm in build:
        _spinning_node(store, node, gpus, instance_type, scrapes, gpm_from, gpm)
    return page_view(store, 3600.0, bundled_prices())


@pytest.mark.parametrize("gpm_from", [0, 1, 2])
def test_a_gpu_spinning_for_the_required_time_is_idle_in_its_node_and_its_cost(
        gpm_from: int) -> None:
    # 3.5 minutes after start: 15 scrapes. The p5 spins by the GPM rule, with GPM arriving
    # at the first scrape, one scrape after utilization (the case found), or two; the
    # g5.xlarge spins by the power rule, its energy counter as late.
    view = _view(15, [("p5-spin", 8, "p5.48xlarge", gpm_from, True),
                      ("g5-spin", 1, "g5.xlarge", gpm_from, False)])
    spinning = {(r.node, r.gpu) for r in view.spinning_rows}
    assert spinning == {("p5-spin", str(g)) for g in range(8)} | {("g5-spin", "0")}
    idle = {r.node: r for r in view.idle_rows}
    # Every GPU shown as spinning for the required time: the node is idle, all of it spinning.
    assert set(idle) == {"p5-spin", "g5-spin"}
    assert idle["p5-spin"].spinning_gpus == 8 and idle["g5-spin"].spinning_gpus == 1
    assert idle["p5-spin"].price_per_hour == pytest.approx(55.04)
    # The idle run and the spinning runs are the same run: same start, same length.
    for row in view.spinning_rows:
        node = idle[row.node]
        assert row.since == pytest.approx(node.idle_since)
        assert row.seconds == pytest.approx(node.idle_seconds)
    assert view.kpis.burning_per_hour == pytest.approx(55.04 + 1.006)


def test_a_node_with_one_working_gpu_is_not_idle() -> None:
    # The near miss: 7 of 8 GPUs spin, the eighth works (tensor activity 0.6). The node is
    # not idle and costs nothing idle; the seven are listed as spinning.
    end = T0 + 14 * INTERVAL
    store = EmbeddedData([], interval=INTERVAL, clock=lambda: end + 1.0,
                         extra_metrics=registry.step_metrics())
    _spinning_node(store, "p5", 8, "p5.48xlarge", 15, 1, True, working=frozenset({7}))
    view = page_view(store, 3600.0, bundled_prices())
    assert {r.gpu for r in view.spinning_rows} == {str(g) for g in range(7)}
    assert view.idle_rows == ()
    assert view.kpis.burning_per_hour == 0.0

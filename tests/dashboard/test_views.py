"""``dashboard/views.py``'s parts judged without a store: what a row says a container holds."""

from __future__ import annotations

import pytest

from gpuscope.dashboard.prices import NodePrice
from gpuscope.dashboard.series import ContainerRef, GpuInfo, Window
from gpuscope.dashboard.verdicts.mig import slice_shares
from gpuscope.dashboard.verdicts.page import PageContext
from gpuscope.dashboard.views import _Holding, _Prices


@pytest.mark.parametrize(("model", "profile", "holds"), [
    ("NVIDIA A100-SXM4-40GB", "3g.20gb", "MIG 3g.20gb (3/7 of GPU 0)"),
    ("NVIDIA A30", "2g.12gb", "MIG 2g.12gb (2/4 of GPU 0)"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "4g.96gb", "MIG 4g.96gb (4/4 of GPU 0)"),
])
def test_a_slice_is_said_in_its_models_compute_slices(model: str, profile: str,
                                                      holds: str) -> None:
    parent = GpuInfo("n1", "0", "GPU-0", model)
    piece = GpuInfo("n1", "0/1", "MIG-1", model, parent_uuid="GPU-0", mig_profile=profile)
    gpus = {parent.ref: parent, piece.ref: piece}
    prices = _Prices({"n1": NodePrice(8.0, "on-demand")}, lambda node: 1)
    context = PageContext(Window(0.0, 3600.0, 60.0), 0.0, gpus)
    holding = _Holding(gpus, prices, {}, context, slice_shares(gpus), {})
    text, price = holding(ContainerRef("n1", "ns", "pod", "c", "MIG-1"))
    assert text == holds
    assert price == pytest.approx(8.0 * slice_shares(gpus)[piece.ref])

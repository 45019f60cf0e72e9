"""Tests of the benchmark scripts (``bench/``) and the data sets they build."""

from __future__ import annotations

from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.views import FleetView
from gpuscope.dashboard.views import page_view as page_of
from tests.stores import Store


def page_view(store: Store, end: float) -> FleetView:
    """The fleet page's view of the last hour before ``end`` from ``store``, as the dashboard
    builds it (the bundled prices)."""
    source = PrometheusData(store.url, clock=lambda: end, timeout=60)
    try:
        return page_of(source, 3600, bundled_prices())
    finally:
        source.close()

"""Fixtures the fault-injection tests share with the rest of the suite, imported from
where they live (each module imports the autouse ones it needs itself, so they apply
only there)."""

from tests.e2e.test_attribution_live import bench  # noqa: F401
from tests.exporter.sinks.cloudwatch.conftest import moto, moto_server, proxy  # noqa: F401

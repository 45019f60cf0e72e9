"""gpuscope exporter: NVML (or simulated) GPU metrics for Prometheus and CloudWatch."""

from gpuscope.exporter.flags import version

__version__ = version()

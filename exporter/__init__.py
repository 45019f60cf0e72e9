"""gpuscope exporter: NVML (or simulated) GPU metrics for Prometheus and CloudWatch."""

__version__ = "0.1.0"

"""The NVML source (see :mod:`.source`)."""

from gpuscope.exporter.sources.nvml.source import NvmlSource

__all__ = ["NvmlSource"]

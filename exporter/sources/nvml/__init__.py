"""The NVML source: every GPU, MIG slice and GPU process on this node, read through pynvml.

:class:`NvmlSource` (``source``) is the one public name. The package's modules:
``calls`` (the one wrapper of NVML calls, their error mapping and the thin typed accessors),
``xid`` (the XID event thread and its log), ``busy`` (busy time from the driver's utilization
samples), ``throttle`` (throttle time per reason), ``gpm`` (GPM activity per GPU and MIG GPU
instance), ``mps`` (CUDA MPS: the MPS process list, the MPS server by name, which PIDs get
utilization samples).
"""

from gpuscope.exporter.sources.nvml.source import NvmlSource

__all__ = ["NvmlSource"]

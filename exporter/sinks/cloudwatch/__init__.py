"""CloudWatch publishing: the CloudWatch agent's GPU metrics in ``CWAgent``, plus Container
Insights-style pod and node rollups, aggregated per interval and batched (``docs/cloudwatch.md``).

- :mod:`~gpuscope.exporter.sinks.cloudwatch.series`: names, units, dimensions; snapshot ->
  observations
- :mod:`~gpuscope.exporter.sinks.cloudwatch.aggregate`: per-interval aggregates ->
  ``Values``/``Counts`` datums
- :mod:`~gpuscope.exporter.sinks.cloudwatch.batching`: PutMetricData limits and request sizes
- :mod:`~gpuscope.exporter.sinks.cloudwatch.publish`: boto3 (imported lazily) or a dry run to stdout
- :mod:`~gpuscope.exporter.sinks.cloudwatch.sink`: the sampler listener, the send buffer and the
  flush thread
- :mod:`~gpuscope.exporter.sinks.cloudwatch.imds`: the instance ID from EC2 instance metadata
  (opt-in)

Importing this package does not import boto3.
"""

from gpuscope.exporter.sinks.cloudwatch.series import Identity
from gpuscope.exporter.sinks.cloudwatch.sink import CloudWatchSink, SinkSettings, SinkStats

__all__ = ["CloudWatchSink", "Identity", "SinkSettings", "SinkStats"]

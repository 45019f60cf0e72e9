"""CloudWatch publishing: the CloudWatch agent's GPU metrics in ``CWAgent``, plus Container
Insights-style pod and node rollups, aggregated per interval and batched (``docs/cloudwatch.md``).

- :mod:`~exporter.cloudwatch.series`: names, units, dimensions; snapshot -> observations
- :mod:`~exporter.cloudwatch.aggregate`: per-interval aggregates -> ``Values``/``Counts`` datums
- :mod:`~exporter.cloudwatch.batching`: PutMetricData limits and request sizes
- :mod:`~exporter.cloudwatch.publish`: boto3 (imported lazily) or a dry run to stdout
- :mod:`~exporter.cloudwatch.sink`: the sampler listener, the send buffer and the flush thread
- :mod:`~exporter.cloudwatch.imds`: the instance ID from EC2 instance metadata (opt-in)

Importing this package does not import boto3.
"""

from exporter.cloudwatch.series import Identity
from exporter.cloudwatch.sink import CloudWatchSink, SinkSettings, SinkStats

__all__ = ["CloudWatchSink", "Identity", "SinkSettings", "SinkStats"]

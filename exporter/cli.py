"""``gpuscope-exporter``: wires a source, the sampler, the collectors and the HTTP server.

Bad input (a flag, an env var, a scenario file) ends in one ``gpuscope-exporter: error: ...``
line and exit code 2, never a traceback. Runtime faults (no driver, a lost GPU) do not end the
process: they show up in ``gpu_up``, ``gpu_exporter_nvml_up`` and ``/readyz``.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry

from exporter.attribution import AttributionInputs, Attributor, LiveInputs
from exporter.collectors.container import ContainerCollector
from exporter.collectors.exporter import ExporterCollector
from exporter.collectors.gpu import GpuCollector
from exporter.config import Config, parse_config
from exporter.flags import StartupError, run_main
from exporter.kube_model import NodeInfo
from exporter.model import Source
from exporter.sampler import Sampler
from exporter.server import ExporterServer

if TYPE_CHECKING:  # the CloudWatch sink (and boto3) is imported only when switched on
    from exporter.cloudwatch import CloudWatchSink

log = logging.getLogger("gpuscope.exporter")


def build_source(cfg: Config) -> tuple[Source, AttributionInputs]:
    """The GPU source and where attribution gets its facts (live node or scenario)."""
    if cfg.source == "simulated":
        # Imported here: the simulated source (and PyYAML) is not needed on a real node.
        from exporter.scenario import ScenarioError, load_scenario
        from exporter.simulated import SimulatedSource
        from exporter.simulated_attribution import ScenarioInputs

        try:
            scenario = load_scenario(cfg.scenario)
        except ScenarioError as exc:
            raise StartupError(str(exc)) from None
        return SimulatedSource(scenario), ScenarioInputs(scenario)

    from exporter.kube import KubeConfigError, MetadataDisabled, PodMetadataWatcher, load_config
    from exporter.nvml import NvmlSource

    try:
        kube = load_config(cfg.kubeconfig)
    except KubeConfigError as exc:
        raise StartupError(f"--kubeconfig: {exc}") from None
    watcher = None
    if isinstance(kube, MetadataDisabled):
        log.warning("pod and node names off: %s", kube.reason)
    else:
        watcher = PodMetadataWatcher(kube, cfg.node_name)
    inputs = LiveInputs(
        kubelet_socket=cfg.kubelet_socket, proc_root=cfg.proc_root,
        metadata_watcher=watcher, resource_names=cfg.gpu_resources,
    )
    return NvmlSource(), inputs


def build_cloudwatch(cfg: Config, attributor: Attributor) -> CloudWatchSink | None:
    """The CloudWatch sink when ``--cloudwatch`` is on (docs/cloudwatch.md), else None.

    boto3 is imported here, and only when the sink is on and not a dry run; a region that
    cannot be resolved is a one-line startup error."""
    if not cfg.cloudwatch:
        return None
    from exporter.cloudwatch import CloudWatchSink, Identity, SinkSettings
    from exporter.cloudwatch.publish import ClientError, make_client
    from exporter.cloudwatch.series import DeviceDimensions

    instance_id = cfg.instance_id
    if instance_id == "imds":
        from exporter.cloudwatch.imds import instance_id_from_imds

        instance_id = instance_id_from_imds()
    identity = Identity(
        host=cfg.node_name, cluster_name=cfg.cluster_name, instance_id=instance_id,
        instance_type=cfg.instance_type,
        device_dimensions=cast(DeviceDimensions, cfg.cloudwatch_device_dimensions),
    )
    settings = SinkSettings(
        namespace=cfg.cloudwatch_namespace, interval=cfg.cloudwatch_interval,
        buffer_seconds=cfg.cloudwatch_buffer, dry_run=cfg.cloudwatch_dry_run,
    )

    def client() -> object:
        return make_client(cfg.cloudwatch_region, cfg.cloudwatch_endpoint_url)

    try:
        sink = CloudWatchSink(settings, identity, client_factory=client,
                              attribution=attributor.latest)
    except ClientError as exc:
        raise StartupError(str(exc)) from None
    if not cfg.cluster_name:
        log.warning("CloudWatch: no --cluster-name, so no pod_gpu_* / node_gpu_* rollups")
    return sink


def build_registry(
    cfg: Config, sampler: Sampler, attributor: Attributor,
    cloudwatch: CloudWatchSink | None = None,
) -> CollectorRegistry:
    # Our own registry, never the global one: no process/platform collectors we did not ask
    # for, and tests can build as many exporters as they like in one process.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(sampler.latest, process_metrics=cfg.process_metrics))
    registry.register(ContainerCollector(attributor.latest))
    registry.register(ExporterCollector(sampler, extra_parts=(attributor.parts,)))
    if cloudwatch is not None:
        from exporter.collectors.cloudwatch import CloudWatchCollector

        registry.register(CloudWatchCollector(cloudwatch.stats))
    return registry


def run(cfg: Config, stop: threading.Event) -> int:
    source, inputs = build_source(cfg)
    attributor = Attributor(
        inputs, node_fallback=NodeInfo(instance_type=cfg.instance_type or "")
    )
    try:
        cloudwatch = build_cloudwatch(cfg, attributor)
    except StartupError:
        attributor.close()
        source.close()
        raise
    # The sink runs after the attributor, so it reads the attribution of the same round.
    listeners = (attributor,) if cloudwatch is None else (attributor, cloudwatch)
    sampler = Sampler(source, cfg.interval, listeners=listeners)
    registry = build_registry(cfg, sampler, attributor, cloudwatch)
    try:
        server = ExporterServer(
            cfg.listen_host, cfg.listen_port, registry, sampler.alive, sampler.ready
        )
    except OSError as exc:
        attributor.close()
        source.close()
        raise StartupError(f"cannot listen on {cfg.listen_host}:{cfg.listen_port}: "
                           f"{exc.strerror or exc}") from None
    sampler.start()
    if cloudwatch is not None:
        cloudwatch.start()
    server.start()
    log.info(
        "serving on %s:%d, source=%s, interval=%gs, node=%s",
        cfg.listen_host, server.port, cfg.source, cfg.interval, cfg.node_name,
    )
    if cloudwatch is not None:
        log.info(
            "CloudWatch: namespace %s, every %gs%s", cfg.cloudwatch_namespace,
            cfg.cloudwatch_interval, " (dry run: datums on stdout)" if cfg.cloudwatch_dry_run
            else "",
        )
    stop.wait()
    log.info("shutting down")
    server.stop()
    sampler.stop()
    if cloudwatch is not None:
        # No more samples: close the open interval and send what is buffered, bounded by
        # the sink's shutdown timeout (10 s, within Kubernetes' default 30 s grace period).
        cloudwatch.stop()
    attributor.close()
    source.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("gpuscope-exporter", parse_config, lambda cfg: cfg.log_level, run, argv)


if __name__ == "__main__":
    sys.exit(main())

"""``gpuscope-exporter``: wires a source, the sampler, the collectors and the HTTP server.

Bad input (a flag, an env var, a scenario file) ends in one ``gpuscope-exporter: error: ...``
line and exit code 2, never a traceback. Runtime faults (no driver, a lost GPU) do not end the
process: they show up in ``gpu_up``, ``gpu_exporter_nvml_up`` and ``/readyz``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry

from gpuscope.exporter.cardinality import DroppedSeries, ProcessSeriesCap
from gpuscope.exporter.config import Config, parse_config
from gpuscope.exporter.flags import StartupError, run_main
from gpuscope.exporter.kubernetes.attribution import AttributionInputs, Attributor, LiveInputs
from gpuscope.exporter.kubernetes.metadata import NodeInfo
from gpuscope.exporter.model import Source
from gpuscope.exporter.sampler import Listener, Sampler
from gpuscope.exporter.sinks.prometheus.collectors.container import ContainerCollector
from gpuscope.exporter.sinks.prometheus.collectors.exporter import ExporterCollector
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sinks.prometheus.collectors.guard import Guarded, RenderErrors
from gpuscope.exporter.sinks.prometheus.server import ConnectionStats, ExporterServer
from gpuscope.exporter.sinks.prometheus.tls import ReloadingContext, TLSError

if TYPE_CHECKING:  # the CloudWatch sink (and boto3) is imported only when switched on
    from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink

log = logging.getLogger("gpuscope.exporter")


def build_source(cfg: Config) -> tuple[Source, AttributionInputs]:
    """The GPU source and where attribution gets its facts (live node or scenario)."""
    if cfg.source == "simulated":
        # Imported here: the simulated source (and PyYAML) is not needed on a real node.
        from gpuscope.exporter.kubernetes.simulated import ScenarioInputs
        from gpuscope.exporter.sources.scenario import ScenarioError, load_scenario
        from gpuscope.exporter.sources.simulated import SimulatedSource

        try:
            scenario = load_scenario(cfg.scenario)
        except ScenarioError as exc:
            raise StartupError(str(exc)) from None
        return SimulatedSource(scenario), ScenarioInputs(scenario)

    from gpuscope.exporter.kubernetes.apiserver import (
        KubeConfigError,
        MetadataDisabled,
        PodMetadataWatcher,
        load_config,
    )
    from gpuscope.exporter.sources.nvml import NvmlSource

    watcher = None
    try:
        kube = load_config(cfg.kubeconfig)
        if isinstance(kube, MetadataDisabled):
            log.warning("pod and node names off: %s", kube.reason)
        else:  # loads the TLS material and credentials: a bad file is a startup error too
            watcher = PodMetadataWatcher(kube, cfg.node_name)
    except KubeConfigError as exc:
        raise StartupError(f"--kubeconfig: {exc}") from None
    inputs = LiveInputs(
        kubelet_socket=cfg.kubelet_socket, proc_root=cfg.proc_root,
        metadata_watcher=watcher, resource_names=cfg.gpu_resources, node_name=cfg.node_name,
    )
    # The proc root also names the MPS server (nvidia-cuda-mps-server) among GPU processes.
    return NvmlSource(proc_root=cfg.proc_root), inputs


def build_cloudwatch(cfg: Config, attributor: Attributor) -> CloudWatchSink | None:
    """The CloudWatch sink when ``--cloudwatch`` is on (docs/cloudwatch.md), else None.

    boto3 is imported here, and only when the sink is on and not a dry run; a region that
    cannot be resolved is a one-line startup error."""
    if not cfg.cloudwatch:
        return None
    from gpuscope.exporter.sinks.cloudwatch import CloudWatchSink, Identity, SinkSettings
    from gpuscope.exporter.sinks.cloudwatch.publish import ClientError, make_client
    from gpuscope.exporter.sinks.cloudwatch.series import DeviceDimensions

    instance_id = cfg.instance_id
    if instance_id == "imds":
        from gpuscope.exporter.sinks.cloudwatch.imds import instance_id_from_imds

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
    *, process_cap: ProcessSeriesCap | None = None, dropped: DroppedSeries | None = None,
    connections: ConnectionStats | None = None,
) -> CollectorRegistry:
    # Our own registry, never the global one: no process/platform collectors we did not ask
    # for, and tests can build as many exporters as they like in one process.
    registry = CollectorRegistry(auto_describe=False)
    # Each collector's fault is its own: its families left out of that scrape and counted
    # (the exporter's own, which reports it, is not guarded).
    errors = RenderErrors()
    registry.register(Guarded("gpu", GpuCollector(
        sampler.latest, process_metrics=cfg.process_metrics, process_cap=process_cap), errors))
    registry.register(Guarded("container", ContainerCollector(
        attributor.series, node_name=cfg.node_name, cluster=cfg.cluster_name), errors))
    registry.register(ExporterCollector(
        sampler, extra_parts=(attributor.parts,),
        dropped_series=dropped.totals if dropped is not None else None,
        render_errors=errors.totals,
        connections_closed=connections.totals if connections is not None else None,
    ))
    if cloudwatch is not None:
        from gpuscope.exporter.sinks.prometheus.collectors.cloudwatch import CloudWatchCollector

        registry.register(Guarded("cloudwatch", CloudWatchCollector(cloudwatch.stats), errors))
    return registry


def build_tls(cfg: Config) -> ReloadingContext | None:
    """The TLS context for the endpoints with ``--tls-cert-file`` (docs/security.md), built
    anew when its files change, else None; an unusable file is a one-line startup error."""
    if cfg.tls_cert_file is None or cfg.tls_key_file is None:
        return None
    try:
        return ReloadingContext(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
    except TLSError as exc:
        raise StartupError(str(exc)) from None


def run(cfg: Config, stop: threading.Event) -> int:
    ssl_context = build_tls(cfg)  # first: nothing to clean up when a file is bad
    source, inputs = build_source(cfg)
    if cfg.node_name_is_hostname and cfg.source == "simulated":
        from gpuscope.exporter.sources.simulated import SimulatedSource

        if isinstance(source, SimulatedSource):
            # A simulated exporter is its scenario's node (gpu_node_info{node_name},
            # CloudWatch host): two on one machine must not both take the machine's name.
            cfg = dataclasses.replace(cfg, node_name=source.scenario.node.name)
    dropped = DroppedSeries()
    attributor = Attributor(
        inputs, node_fallback=NodeInfo(instance_type=cfg.instance_type or ""),
        max_containers=cfg.max_container_series, dropped=dropped,
    )
    try:
        cloudwatch = build_cloudwatch(cfg, attributor)
    except StartupError:
        attributor.close()
        source.close()
        raise
    # The sink runs after the attributor, so it reads the attribution of the same round.
    listeners: tuple[Listener, ...] = (attributor,)
    if cloudwatch is not None:
        listeners += (cloudwatch,)
    process_cap = None
    if cfg.process_metrics:
        process_cap = ProcessSeriesCap(cfg.max_process_series, dropped)
        listeners += (process_cap,)
    sampler = Sampler(source, cfg.interval, listeners=listeners)
    connections = ConnectionStats()  # both servers' (gpu_exporter_http_connections_*)
    registry = build_registry(cfg, sampler, attributor, cloudwatch,
                              process_cap=process_cap, dropped=dropped,
                              connections=connections)
    try:
        server = ExporterServer(
            cfg.listen_host, cfg.listen_port, registry, sampler.alive, sampler.ready,
            ssl_context=ssl_context,
            # Re-render /metrics after each sampling round, and at least once per interval
            # (a stuck round still lets the workers' self-metrics through).
            render_key=lambda: (sampler.rounds, int(time.monotonic() // cfg.interval)),
            max_connections=cfg.max_connections, connection_stats=connections,
        )
    except OSError as exc:
        attributor.close()
        source.close()
        raise StartupError(f"cannot listen on {cfg.listen_host}:{cfg.listen_port}: "
                           f"{exc.strerror or exc}") from None
    probes = None
    if cfg.probe_listen is not None:  # plain-HTTP /healthz and /readyz for the kubelet
        probe_host, probe_port = cfg.probe_listen
        try:
            probes = ExporterServer(probe_host, probe_port, registry, sampler.alive,
                                    sampler.ready, probes_only=True,
                                    max_connections=cfg.max_connections,
                                    connection_stats=connections)
        except OSError as exc:
            server.stop()
            attributor.close()
            source.close()
            raise StartupError(f"--probe-listen: cannot listen on {probe_host}:{probe_port}: "
                               f"{exc.strerror or exc}") from None
    sampler.start()
    if cloudwatch is not None:
        cloudwatch.start()
    server.start()
    log.info(
        "serving on %s:%d, source=%s, interval=%gs, node=%s",
        cfg.listen_host, server.port, cfg.source, cfg.interval, cfg.node_name,
    )
    if ssl_context is not None:
        log.info("TLS on%s", ", client certificates required" if cfg.tls_client_ca_file
                 else "")
    if probes is not None:
        probes.start()
        log.info("/healthz and /readyz also over plain HTTP on port %d", probes.port)
    if cloudwatch is not None:
        log.info(
            "CloudWatch: namespace %s, every %gs%s", cfg.cloudwatch_namespace,
            cfg.cloudwatch_interval, " (dry run: datums on stdout)" if cfg.cloudwatch_dry_run
            else "",
        )
    stop.wait()
    log.info("shutting down")
    server.stop()
    if probes is not None:
        probes.stop()
    # A round stuck in the driver holds the source (NVML's lock): closing it would wait for
    # that call forever, and the process would never exit. Exiting frees it all the same.
    sampler_stopped = sampler.stop()
    if not sampler_stopped:
        log.warning("the sampler is still inside a sampling round (a %s call that does not "
                    "return); exiting without closing the source and attribution", cfg.source)
    if cloudwatch is not None:
        # No more samples: close the open interval and send what is buffered, bounded by
        # the sink's shutdown timeout (10 s, within Kubernetes' default 30 s grace period).
        cloudwatch.stop()
    if sampler_stopped:  # else the hung round may hold their locks (the /proc reader's too)
        attributor.close()
        source.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("gpuscope-exporter", parse_config, lambda cfg: cfg.log_level, run, argv)


if __name__ == "__main__":
    sys.exit(main())

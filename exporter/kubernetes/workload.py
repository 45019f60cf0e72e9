"""What a pod and a node mean to the exporter, from their API objects: pure functions, no I/O.

- :func:`pod_from_json`: a Pod object (JSON, as the API server sends it) → :class:`PodInfo`:
  namespace, name, labels, owners, ``workload``, phase, and the container-ID → container-name
  map (regular, init and ephemeral containers, and the previous instance of a restarted one);
  for a static pod's mirror, the UID its cgroups carry (``kubernetes.io/config.mirror``).
- :func:`derive_workload`: ``<Kind>/<name>`` of a pod's top owner, from its owner references
  and labels only (no API reads, so no RBAC on ReplicaSets or Jobs).
- :func:`node_info_from_labels`: instance type, zone and capacity type from a Node's labels
  (the well-known labels reference, plus each provider's spot/on-demand labels).

Objects are read leniently: a missing or malformed field reads as absent, never as an error,
so one odd pod cannot cost the names of the others.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from gpuscope.exporter.kubernetes.metadata import NodeInfo, OwnerRef, PodInfo

__all__ = ["derive_workload", "node_info_from_labels", "pod_from_json"]


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# --------------------------------------------------------------------------------------
# Pods, owners and workloads
# --------------------------------------------------------------------------------------


# Kubeflow training-operator's ``training.kubeflow.org/operator-name`` values → kinds.
_KUBEFLOW_OPERATOR_KINDS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "mpi-operator": "MPIJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
}
# A CronJob names its Jobs ``<cronjob>-<scheduled time in minutes since the epoch>``.
# Requiring a plausible minute count (2014..2100) keeps a ``train-20240101`` Job (a date,
# about 20.2 million) from being taken for a CronJob's.
_CRONJOB_SUFFIX = re.compile(r"^(?P<name>.+)-(?P<minutes>\d{8})$")
_CRONJOB_MINUTES = range(23_000_000, 68_400_000)


def _label_workload(labels: Mapping[str, str]) -> str:
    """A workload from well-known labels, for pods whose owners do not settle it."""
    if name := labels.get("jobset.sigs.k8s.io/jobset-name"):
        return f"JobSet/{name}"
    if name := labels.get("leaderworkerset.sigs.k8s.io/name"):
        return f"LeaderWorkerSet/{name}"
    if name := labels.get("training.kubeflow.org/job-name") or labels.get("pytorch-job-name"):
        operator = labels.get("training.kubeflow.org/operator-name", "")
        return f"{_KUBEFLOW_OPERATOR_KINDS.get(operator, 'PyTorchJob')}/{name}"
    if name := labels.get("ray.io/cluster"):
        return f"RayCluster/{name}"
    return ""


def derive_workload(owners: Sequence[OwnerRef], labels: Mapping[str, str]) -> str:
    """``<Kind>/<name>`` of the pod's top owner, or ``""``.

    The pod's controller reference (else its first owner) is walked up without extra API
    calls, since fetching ReplicaSets and Jobs would need RBAC on them and one request per
    owner:

    - ReplicaSet → Deployment when the RS name is ``<deployment>-<pod-template-hash>``
      (the Deployment controller's naming; the pod carries the hash label); Argo Rollouts
      likewise with ``rollouts-pod-template-hash``; else the ReplicaSet itself.
    - ``batch/v1`` Job → JobSet (label ``jobset.sigs.k8s.io/jobset-name``), a Kubeflow
      launcher's job (``training.kubeflow.org/job-name``), or a CronJob when the Job name
      ends in a plausible ``-<scheduled minute>``; else the Job.
    - StatefulSet → LeaderWorkerSet when labelled so; else the StatefulSet.
    - ``Node`` (static mirror pods) → ``""``: a node is not a workload.
    - Any other owner (PyTorchJob, RayCluster, JobSet, DaemonSet, ...) is the top owner.
    - No owner: JobSet, LeaderWorkerSet, Kubeflow and KubeRay labels, then
      ``batch.kubernetes.io/job-name``/``job-name`` (an orphaned Job pod).
    """
    owner = next((o for o in owners if o.controller), owners[0] if owners else None)
    if owner is None:
        if found := _label_workload(labels):
            return found
        job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
        return f"Job/{job}" if job else ""
    group = owner.api_version.split("/")[0] if "/" in owner.api_version else ""
    if owner.kind == "ReplicaSet" and group == "apps":
        for hash_label, parent in (
            ("pod-template-hash", "Deployment"),
            ("rollouts-pod-template-hash", "Rollout"),
        ):
            pod_hash = labels.get(hash_label)
            if pod_hash and owner.name.endswith(f"-{pod_hash}"):
                return f"{parent}/{owner.name[: -len(pod_hash) - 1]}"
        return f"ReplicaSet/{owner.name}"
    if owner.kind == "Job" and group == "batch":
        if name := labels.get("jobset.sigs.k8s.io/jobset-name"):
            return f"JobSet/{name}"
        if labels.get("training.kubeflow.org/job-name"):
            return _label_workload(labels)
        m = _CRONJOB_SUFFIX.match(owner.name)
        if m and int(m.group("minutes")) in _CRONJOB_MINUTES:
            return f"CronJob/{m.group('name')}"
        return f"Job/{owner.name}"
    if owner.kind == "StatefulSet" and group == "apps":
        if name := labels.get("leaderworkerset.sigs.k8s.io/name"):
            return f"LeaderWorkerSet/{name}"
        return f"StatefulSet/{owner.name}"
    if owner.kind == "Node":
        return ""
    return f"{owner.kind}/{owner.name}"


def _container_id(raw: object) -> str | None:
    """``containerd://<hex>`` / ``cri-o://<hex>`` / ``docker://<hex>`` → ``<hex>``."""
    if not isinstance(raw, str) or not raw:
        return None
    return raw.rpartition("://")[2].lower() or None


def pod_from_json(obj: Mapping[str, Any]) -> PodInfo | None:
    """A :class:`PodInfo` from a Pod object of the API; ``None`` without a UID."""
    meta = _mapping(obj.get("metadata"))
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
    owners = tuple(
        OwnerRef(
            api_version=str(o.get("apiVersion", "")),
            kind=str(o.get("kind", "")),
            name=str(o.get("name", "")),
            uid=str(o.get("uid", "")),
            controller=bool(o.get("controller", False)),
        )
        for o in meta.get("ownerReferences") or ()
        if isinstance(o, dict)
    )
    status = _mapping(obj.get("status"))
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            if not isinstance(cs, dict) or not cs.get("name"):
                continue
            name = str(cs["name"])
            # The previous instance of a restarted container may still hold GPU memory for
            # a moment, so its ID keeps the name too.
            last = _mapping(_mapping(cs.get("lastState")).get("terminated"))
            for raw in (last.get("containerID"), cs.get("containerID")):
                if cid := _container_id(raw):
                    containers[cid] = name
    return PodInfo(
        uid=uid,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        labels=MappingProxyType(labels),
        owners=owners,
        workload=derive_workload(owners, labels),
        containers=MappingProxyType(containers),
        phase=phase if isinstance(phase := status.get("phase"), str) else "",
        mirror_of=_mirror_of(_mapping(meta.get("annotations"))),
    )


# The kubelet's annotation on the mirror pod of a static pod: the static pod's UID as the
# kubelet runs it, which its cgroups name, not the mirror's UID. That is the manifest's own
# metadata.uid where it sets one (kept as written), else a hash of the manifest the kubelet
# makes (32 hex digits: MD5, FNV-128a in newer kubelets); pkg/kubelet/config applyDefaults
# writes it as config.hash, and the mirror client copies that into config.mirror. Only the
# shapes a pod<uid> cgroup is read with (cgroups.py) can ever be joined.
_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_RUN_UID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _mirror_of(annotations: Mapping[str, Any]) -> str:
    value = annotations.get(_MIRROR_ANNOTATION)
    if isinstance(value, str) and _RUN_UID.fullmatch(value.lower()):
        return value.lower()
    return ""


# --------------------------------------------------------------------------------------
# Node
# --------------------------------------------------------------------------------------


def _capacity_type(labels: Mapping[str, str]) -> str:
    eks = labels.get("eks.amazonaws.com/capacityType")
    if eks:  # EKS managed node groups: ON_DEMAND, SPOT (CAPACITY_BLOCK is reserved)
        return "spot" if eks.upper() == "SPOT" else "on-demand"
    karpenter = labels.get("karpenter.sh/capacity-type")
    if karpenter:  # spot, on-demand, reserved (billed like on-demand)
        return "spot" if karpenter.lower() == "spot" else "on-demand"
    if any(
        labels.get(k, "").lower() == "true"
        for k in ("cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible")
    ):
        return "spot"
    if labels.get("cloud.google.com/gke-provisioning", "").lower() == "spot":
        return "spot"
    if labels.get("kubernetes.azure.com/scalesetpriority", "").lower() == "spot":
        return "spot"
    lifecycle = labels.get("node.kubernetes.io/lifecycle", "").lower()  # kops, eksctl
    if lifecycle:
        return "spot" if lifecycle == "spot" else "on-demand"
    # GKE and AKS label only spot nodes; any of their own labels without a spot label
    # means a regular (on-demand) node.
    if "cloud.google.com/gke-nodepool" in labels or "kubernetes.azure.com/agentpool" in labels:
        return "on-demand"
    return ""


def node_info_from_labels(labels: Mapping[str, str]) -> NodeInfo:
    """Instance type, zone and capacity type from a Node's labels (current, then
    deprecated beta keys)."""
    return NodeInfo(
        instance_type=labels.get("node.kubernetes.io/instance-type")
        or labels.get("beta.kubernetes.io/instance-type", ""),
        zone=labels.get("topology.kubernetes.io/zone")
        or labels.get("failure-domain.beta.kubernetes.io/zone", ""),
        capacity_type=_capacity_type(labels),
    )

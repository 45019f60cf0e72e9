"""What pod and node objects mean: workload derivation from owners and labels, the
container-ID map of a pod, node labels. Pure functions, no API server."""

from __future__ import annotations

import pytest

from gpuscope.exporter.kubernetes.metadata import NodeInfo, OwnerRef
from gpuscope.exporter.kubernetes.workload import (
    derive_workload,
    node_info_from_labels,
    pod_from_json,
)
from tests.exporter.kubernetes.test_apiserver import CID, NODE, NODE_LABELS, UID_A, pod_json


def owner(kind: str, name: str, api_version: str, controller: bool = True) -> OwnerRef:
    return OwnerRef(api_version, kind, name, "1f2e3d4c-5b6a-4798-8a9b-0c1d2e3f4a5b", controller)


WORKLOADS: list[tuple[str, list[OwnerRef], dict[str, str], str]] = [
    (
        "deployment",
        [owner("ReplicaSet", "llm-serve-7d9f8b6c5d", "apps/v1")],
        {"app": "llm-serve", "pod-template-hash": "7d9f8b6c5d"},
        "Deployment/llm-serve",
    ),
    (
        "deployment-dashed-name",
        [owner("ReplicaSet", "vllm-llama-3-70b-5f6c7d8e9", "apps/v1")],
        {"pod-template-hash": "5f6c7d8e9"},
        "Deployment/vllm-llama-3-70b",
    ),
    (
        "replicaset-alone",
        [owner("ReplicaSet", "standalone-rs", "apps/v1")],
        {"pod-template-hash": "abc12"},
        "ReplicaSet/standalone-rs",
    ),
    (
        "argo-rollout",
        [owner("ReplicaSet", "canary-api-6b8d9f7c4", "apps/v1")],
        {"rollouts-pod-template-hash": "6b8d9f7c4"},
        "Rollout/canary-api",
    ),
    (
        "cronjob",
        [owner("Job", "nightly-finetune-29417280", "batch/v1")],
        {"batch.kubernetes.io/job-name": "nightly-finetune-29417280"},
        "CronJob/nightly-finetune",
    ),
    (
        "job-with-date-suffix",
        [owner("Job", "train-20240101", "batch/v1")],
        {"job-name": "train-20240101"},
        "Job/train-20240101",
    ),
    ("job", [owner("Job", "eval-bert", "batch/v1")], {}, "Job/eval-bert"),
    (
        "jobset",
        [owner("Job", "llama-pretrain-workers-0", "batch/v1")],
        {
            "jobset.sigs.k8s.io/jobset-name": "llama-pretrain",
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        },
        "JobSet/llama-pretrain",
    ),
    (
        "jobset-owner",
        [owner("JobSet", "llama-pretrain", "jobset.x-k8s.io/v1alpha2")],
        {},
        "JobSet/llama-pretrain",
    ),
    (
        "pytorchjob-owner",
        [owner("PyTorchJob", "ddp-run", "kubeflow.org/v1")],
        {
            "training.kubeflow.org/job-name": "ddp-run",
            "training.kubeflow.org/replica-type": "worker",
        },
        "PyTorchJob/ddp-run",
    ),
    (
        "pytorchjob-label-only",
        [],
        {
            "training.kubeflow.org/job-name": "ddp-run",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
        },
        "PyTorchJob/ddp-run",
    ),
    ("pytorchjob-old-label", [], {"pytorch-job-name": "old-ddp"}, "PyTorchJob/old-ddp"),
    (
        "mpijob-launcher-job",
        [owner("Job", "allreduce-launcher", "batch/v1")],
        {
            "training.kubeflow.org/job-name": "allreduce",
            "training.kubeflow.org/operator-name": "mpi-operator",
        },
        "MPIJob/allreduce",
    ),
    (
        "raycluster-owner",
        [owner("RayCluster", "rc-a100", "ray.io/v1")],
        {"ray.io/cluster": "rc-a100", "ray.io/node-type": "worker"},
        "RayCluster/rc-a100",
    ),
    ("raycluster-label-only", [], {"ray.io/cluster": "rc-a100"}, "RayCluster/rc-a100"),
    (
        "statefulset",
        [owner("StatefulSet", "triton", "apps/v1")],
        {"statefulset.kubernetes.io/pod-name": "triton-0"},
        "StatefulSet/triton",
    ),
    (
        "leaderworkerset",
        [owner("StatefulSet", "vllm-405b-0", "apps/v1")],
        {"leaderworkerset.sigs.k8s.io/name": "vllm-405b"},
        "LeaderWorkerSet/vllm-405b",
    ),
    (
        "daemonset",
        [owner("DaemonSet", "nvidia-device-plugin", "apps/v1")],
        {},
        "DaemonSet/nvidia-device-plugin",
    ),
    ("static-pod", [owner("Node", NODE, "v1")], {"tier": "control-plane"}, ""),
    (
        "volcano-job-no-cron-heuristic",
        [owner("Job", "sweep-29417280", "batch.volcano.sh/v1alpha1")],
        {"volcano.sh/job-name": "sweep-29417280"},
        "Job/sweep-29417280",
    ),
    (
        "controller-owner-wins",
        [owner("ConfigMap", "x", "v1", controller=False), owner("StatefulSet", "db", "apps/v1")],
        {},
        "StatefulSet/db",
    ),
    (
        "orphaned-job-pod",
        [],
        {
            "batch.kubernetes.io/job-name": "orphan-job",
            "batch.kubernetes.io/controller-uid": "9c8b7a6d",
        },
        "Job/orphan-job",
    ),
    ("bare-pod", [], {"app": "debug"}, ""),
]


@pytest.mark.parametrize(
    ("owners", "labels", "expected"), [w[1:] for w in WORKLOADS], ids=[w[0] for w in WORKLOADS]
)
def test_derive_workload(owners: list[OwnerRef], labels: dict[str, str], expected: str) -> None:
    assert derive_workload(owners, labels) == expected


def test_pod_from_json_container_map() -> None:
    obj = pod_json(
        "ddp-run-worker-0",
        UID_A,
        labels={"training.kubeflow.org/job-name": "ddp-run"},
        owners=[
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "ddp-run",
                "uid": "3a4b5c6d-7e8f-4a0b-9c1d-2e3f4a5b6c7d",
                "controller": True,
            }
        ],
        containers=[("pytorch", CID[0])],
    )
    status = obj["status"]
    status["containerStatuses"].append(
        {  # a sidecar restarted: both IDs map to its name
            "name": "metrics",
            "containerID": f"cri-o://{CID[1]}",
            "lastState": {"terminated": {"exitCode": 137, "containerID": f"cri-o://{CID[2]}"}},
        }
    )
    status["containerStatuses"].append({"name": "waiting", "state": {"waiting": {}}})
    status["initContainerStatuses"] = [
        {"name": "fetch-weights", "containerID": f"docker://{CID[3]}"}
    ]
    status["ephemeralContainerStatuses"] = [
        {"name": "debugger-x7k2p", "containerID": f"containerd://{CID[4]}"}
    ]
    pod = pod_from_json(obj)
    assert pod is not None
    assert (pod.uid, pod.namespace, pod.name) == (UID_A, "ml", "ddp-run-worker-0")
    assert pod.workload == "PyTorchJob/ddp-run"
    assert dict(pod.containers) == {
        CID[0]: "pytorch",
        CID[1]: "metrics",
        CID[2]: "metrics",
        CID[3]: "fetch-weights",
        CID[4]: "debugger-x7k2p",
    }
    assert pod.owners[0].kind == "PyTorchJob" and pod.owners[0].controller
    assert pod.labels["training.kubeflow.org/job-name"] == "ddp-run"
    with pytest.raises(TypeError):
        pod.labels["x"] = "y"  # type: ignore[index]
    assert pod_from_json({"metadata": {"name": "no-uid"}}) is None


NODES: list[tuple[str, dict[str, str], NodeInfo]] = [
    ("eks-spot", NODE_LABELS, NodeInfo("p4d.24xlarge", "us-east-1a", "spot")),
    (
        "eks-on-demand",
        {
            "node.kubernetes.io/instance-type": "g5.xlarge",
            "topology.kubernetes.io/zone": "us-west-2b",
            "eks.amazonaws.com/capacityType": "ON_DEMAND",
        },
        NodeInfo("g5.xlarge", "us-west-2b", "on-demand"),
    ),
    ("karpenter-spot", {"karpenter.sh/capacity-type": "spot"}, NodeInfo("", "", "spot")),
    (
        "karpenter-on-demand",
        {"karpenter.sh/capacity-type": "on-demand"},
        NodeInfo("", "", "on-demand"),
    ),
    (
        "karpenter-reserved",
        {"karpenter.sh/capacity-type": "reserved"},
        NodeInfo("", "", "on-demand"),
    ),
    (
        "gke-spot",
        {
            "cloud.google.com/gke-spot": "true",
            "cloud.google.com/gke-nodepool": "a3-spot",
            "node.kubernetes.io/instance-type": "a3-highgpu-8g",
            "topology.kubernetes.io/zone": "us-central1-a",
        },
        NodeInfo("a3-highgpu-8g", "us-central1-a", "spot"),
    ),
    ("gke-preemptible", {"cloud.google.com/gke-preemptible": "true"}, NodeInfo("", "", "spot")),
    ("gke-regular", {"cloud.google.com/gke-nodepool": "a2-pool"}, NodeInfo("", "", "on-demand")),
    (
        "aks-spot",
        {
            "kubernetes.azure.com/scalesetpriority": "spot",
            "kubernetes.azure.com/agentpool": "gpuspot",
        },
        NodeInfo("", "", "spot"),
    ),
    (
        "aks-regular",
        {
            "kubernetes.azure.com/agentpool": "gpu",
            "node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4",
        },
        NodeInfo("Standard_NC24ads_A100_v4", "", "on-demand"),
    ),
    (
        "beta-labels",
        {
            "beta.kubernetes.io/instance-type": "p3.8xlarge",
            "failure-domain.beta.kubernetes.io/zone": "eu-west-1c",
        },
        NodeInfo("p3.8xlarge", "eu-west-1c", ""),
    ),
    ("unknown", {"kubernetes.io/hostname": "bare-metal-7"}, NodeInfo("", "", "")),
]


@pytest.mark.parametrize(("labels", "expected"), [n[1:] for n in NODES], ids=[n[0] for n in NODES])
def test_node_info_from_labels(labels: dict[str, str], expected: NodeInfo) -> None:
    assert node_info_from_labels(labels) == expected


def test_pod_from_json_tolerates_odd_fields() -> None:
    # What a typed model would reject (a null here, a string there) only loses that field.
    pod = pod_from_json({
        "metadata": {
            "uid": UID_A, "name": "odd", "namespace": "ml", "labels": None,
            "ownerReferences": ["junk", {"apiVersion": "batch/v1", "kind": "Job", "name": "j"}],
        },
        "status": {
            "containerStatuses": None,
            "initContainerStatuses": [{"name": "init"}, "junk", {"containerID": "x://y"}],
        },
    })
    assert pod is not None
    assert (pod.name, pod.workload, dict(pod.labels), dict(pod.containers)) == (
        "odd", "Job/j", {}, {}
    )


@pytest.mark.parametrize(("phase", "terminal"), [
    ("Pending", False), ("Running", False), ("Succeeded", True), ("Failed", True),
    ("Unknown", False), (None, False), (7, False),
])
def test_pod_from_json_phase(phase: object, terminal: bool) -> None:
    pod = pod_from_json({"metadata": {"uid": UID_A, "name": "p", "namespace": "ml"},
                         "status": {"phase": phase}})
    assert pod is not None
    assert pod.phase == (phase if isinstance(phase, str) else "")
    assert pod.terminal is terminal


@pytest.mark.parametrize(("annotations", "expected"), [
    ({"kubernetes.io/config.mirror": "6F1C0E9D8B7A4C3E2F1A0B9C8D7E6F5A"},
     "6f1c0e9d8b7a4c3e2f1a0b9c8d7e6f5a"),
    ({"kubernetes.io/config.hash": "6f1c0e9d8b7a4c3e2f1a0b9c8d7e6f5a"}, ""),  # not a mirror
    # A manifest that sets its own metadata.uid: the kubelet keeps that UID (it hashes only
    # when there is none) and writes it as config.hash, then config.mirror, as it is.
    ({"kubernetes.io/config.mirror": "0d2f3b4a-5c6d-4e7f-8a9b-0c1d2e3f4a5b"},
     "0d2f3b4a-5c6d-4e7f-8a9b-0c1d2e3f4a5b"),
    ({"kubernetes.io/config.mirror": "0D2F3B4A-5C6D-4E7F-8A9B-0C1D2E3F4A5B"},
     "0d2f3b4a-5c6d-4e7f-8a9b-0c1d2e3f4a5b"),
    ({"kubernetes.io/config.mirror": "not-a-hash"}, ""),
    ({"kubernetes.io/config.mirror": 5}, ""),
    (None, ""),
])
def test_pod_from_json_mirror_of(annotations: object, expected: str) -> None:
    pod = pod_from_json({"metadata": {"uid": UID_A, "name": "etcd-n1", "namespace": "kube-system",
                                      "annotations": annotations}})
    assert pod is not None
    assert pod.mirror_of == expected

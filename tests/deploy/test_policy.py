"""Policy checks on the rendered objects: what a cluster admin is promised in docs/deploy.md.

Scheduling is checked by evaluating the rendered affinity and tolerations against the labels
and taints real nodes carry (a small evaluator of Kubernetes' matching rules), not by looking
for a key in the YAML.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuscope.exporter.config import parse_config
from tests.deploy.render import (
    KUSTOMIZATIONS,
    PROVIDER_OVERLAYS,
    Obj,
    containers,
    exporter,
    exporter_container,
    find,
    one,
    render,
)

ALL = sorted(KUSTOMIZATIONS)
SOCKET_DIR = "/var/lib/kubelet/pod-resources"
GKE_DRIVER_DIR = "/home/kubernetes/bin/nvidia"
APP_UID = 65532  # the Dockerfile's APP_UID

# ---- nodes as the providers label and taint them -------------------------------------------------

Labels = dict[str, str]
Taint = dict[str, str]

GPU_NODES: dict[str, list[tuple[str, Labels, list[Taint]]]] = {
    "eks": [
        ("auto-mode", {"eks.amazonaws.com/instance-gpu-manufacturer": "nvidia",
                       "eks.amazonaws.com/instance-gpu-count": "1"},
         [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        ("karpenter", {"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
                       "karpenter.sh/nodepool": "gpu"},
         [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]),
        ("eksctl-node-group", {"k8s.amazonaws.com/accelerator": "nvidia-tesla-t4"}, []),
        ("gpu-operator", {"nvidia.com/gpu.present": "true"}, []),
    ],
    "gke": [
        ("gke-managed", {"cloud.google.com/gke-accelerator": "nvidia-l4",
                         "cloud.google.com/gke-nodepool": "gpu"},
         [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
    ],
    "aks": [
        ("aks-gpu-pool", {"kubernetes.azure.com/accelerator": "nvidia",
                          "kubernetes.azure.com/agentpool": "gpunp"},
         [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]),
        # A Spot node pool: AKS itself labels and taints every node of one
        # kubernetes.azure.com/scalesetpriority=spot (the taint cannot be opted out of).
        ("aks-spot-gpu-pool", {"kubernetes.azure.com/accelerator": "nvidia",
                               "kubernetes.azure.com/agentpool": "gpuspot",
                               "kubernetes.azure.com/scalesetpriority": "spot"},
         [{"key": "sku", "value": "gpu", "effect": "NoSchedule"},
          {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot",
           "effect": "NoSchedule"}]),
        ("aks-nfd", {"feature.node.kubernetes.io/pci-10de.present": "true"},
         [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]),
    ],
}
GPU_NODES["eks-cloudwatch"] = GPU_NODES["eks"]

CPU_NODES: list[tuple[str, Labels]] = [
    ("eks-managed", {"eks.amazonaws.com/nodegroup": "general", "node.kubernetes.io/instance-type":
                     "m5.xlarge", "eks.amazonaws.com/capacityType": "ON_DEMAND"}),
    ("eks-auto-mode", {"eks.amazonaws.com/instance-category": "m",
                       "eks.amazonaws.com/instance-gpu-count": "0"}),
    ("karpenter", {"karpenter.k8s.aws/instance-category": "c", "karpenter.sh/nodepool": "default"}),
    ("gke", {"cloud.google.com/gke-nodepool": "default-pool",
             "node.kubernetes.io/instance-type": "e2-standard-4"}),
    ("aks", {"kubernetes.azure.com/agentpool": "nodepool1", "kubernetes.azure.com/mode": "system",
             "node.kubernetes.io/instance-type": "Standard_D4s_v5"}),
    ("aks-spot", {"kubernetes.azure.com/agentpool": "cpuspot",
                  "kubernetes.azure.com/scalesetpriority": "spot",
                  "node.kubernetes.io/instance-type": "Standard_D4s_v5"}),
    ("nfd-cpu", {"feature.node.kubernetes.io/pci-10de.present": "false"}),
]


def _expression_matches(expr: Obj, labels: Labels) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels:
            return False
        have, want = int(labels[key]), int(values[0])
        return have > want if op == "Gt" else have < want
    raise AssertionError(f"unknown operator {op}")


def schedulable_on(pod_spec: Obj, labels: Labels, taints: list[Taint]) -> bool:
    """Kubernetes' rules: nodeSelector AND (any term: all its expressions) AND every
    NoSchedule/NoExecute taint tolerated."""
    merged = {"kubernetes.io/os": "linux", **labels}
    if any(merged.get(k) != v for k, v in pod_spec.get("nodeSelector", {}).items()):
        return False
    required = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is not None:
        terms = required["nodeSelectorTerms"]
        if not any(
            term.get("matchExpressions") and all(
                _expression_matches(e, merged) for e in term["matchExpressions"])
            for term in terms
        ):
            return False
    return all(_tolerated(taint, pod_spec.get("tolerations", [])) for taint in taints
               if taint["effect"] in ("NoSchedule", "NoExecute"))


def _tolerated(taint: Taint, tolerations: list[Obj]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint["effect"]:
            continue
        if tol.get("operator", "Equal") == "Exists":
            if not tol.get("key") or tol["key"] == taint["key"]:
                return True
        elif tol.get("key") == taint["key"] and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _pod_spec(name: str) -> Obj:
    spec: Obj = exporter(render(name))["spec"]["template"]["spec"]
    return spec


# ---- scheduling ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("overlay", "node", "labels", "taints"),
    [(o, n, lab, t) for o, nodes in GPU_NODES.items() for n, lab, t in nodes],
)
def test_exporter_schedules_on_the_providers_gpu_nodes(
    overlay: str, node: str, labels: Labels, taints: list[Taint]
) -> None:
    assert schedulable_on(_pod_spec(overlay), labels, taints), f"{overlay}: not on {node} GPU nodes"


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(("node", "labels"), CPU_NODES)
def test_exporter_never_schedules_on_cpu_nodes(name: str, node: str, labels: Labels) -> None:
    assert not schedulable_on(_pod_spec(name), labels, []), f"{name}: would run on {node} CPU nodes"


@pytest.mark.parametrize("name", ALL)
def test_gpu_affinity_is_required_and_positive(name: str) -> None:
    affinity = _pod_spec(name)["affinity"]["nodeAffinity"]
    required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in required["nodeSelectorTerms"]:
        assert term.get("matchExpressions"), "an empty term"
        for expr in term["matchExpressions"]:
            # NotIn / DoesNotExist match every node that lacks a GPU label.
            assert expr["operator"] in ("In", "Exists"), expr


@pytest.mark.parametrize("name", ALL)
def test_tolerates_the_nvidia_gpu_taint_but_not_everything(name: str) -> None:
    spec = _pod_spec(name)
    for value in ("present", "true", ""):
        assert schedulable_on(spec, {"nvidia.com/gpu.present": "true"},
                              [{"key": "nvidia.com/gpu", "value": value, "effect": "NoSchedule"}])
    # No blanket toleration: a node reserved for something else stays off limits.
    assert not schedulable_on(spec, {"nvidia.com/gpu.present": "true"},
                              [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}])


def test_aks_tolerates_the_sku_gpu_taint() -> None:
    labels = {"kubernetes.azure.com/accelerator": "nvidia"}
    taint = [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]
    assert schedulable_on(_pod_spec("aks"), labels, taint)
    assert not schedulable_on(_pod_spec("base"), {"nvidia.com/gpu.present": "true"}, taint)


@pytest.mark.parametrize("name", ALL)
def test_priority_class_is_shipped_and_never_preempts(name: str) -> None:
    objs = render(name)
    pc_name = _pod_spec(name)["priorityClassName"]
    pc = one(objs, "PriorityClass", pc_name)
    assert pc["preemptionPolicy"] == "Never"
    assert 0 < pc["value"] < 1_000_000_000  # above workloads, below the system-* classes
    assert not pc.get("globalDefault", False)


# ---- host access --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_host_pid_and_nothing_else_from_the_host(name: str) -> None:
    spec = _pod_spec(name)
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    for c in containers(exporter(render(name))):
        assert all("hostPort" not in p for p in c.get("ports", []))


@pytest.mark.parametrize("name", ALL)
def test_host_paths_are_few_and_mounted_read_only(name: str) -> None:
    spec = _pod_spec(name)
    host_volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    allowed = {SOCKET_DIR} | ({GKE_DRIVER_DIR} if name.startswith("gke") else set())
    assert set(host_volumes.values()) <= allowed, host_volumes
    for c in containers(exporter(render(name))):
        for mount in c.get("volumeMounts", []):
            if mount["name"] in host_volumes:
                assert mount.get("readOnly") is True, mount


@pytest.mark.parametrize("name", [n for n in ALL if "nonroot" not in n])
def test_pod_resources_socket_is_mounted_read_only_where_the_exporter_looks(name: str) -> None:
    spec = _pod_spec(name)
    (volume,) = [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == SOCKET_DIR]
    assert volume["hostPath"].get("type") == "Directory"
    c = exporter_container(render(name))
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["mountPath"] == SOCKET_DIR and mount["readOnly"] is True
    socket = _env(c)["GPUSCOPE_KUBELET_SOCKET"]
    assert socket.startswith(mount["mountPath"] + "/")


# ---- privileges ---------------------------------------------------------------------------------

def _workloads(name: str) -> list[Obj]:
    objs = render(name)
    return [*find(objs, "DaemonSet"), *find(objs, "Deployment")]


@pytest.mark.parametrize("name", ALL)
def test_no_privileged_container_except_the_documented_gke_exporter(name: str) -> None:
    for workload in _workloads(name):
        for c in containers(workload):
            sc = c.get("securityContext", {})
            gke_exporter = name.startswith("gke") and c["name"] == "exporter"
            if gke_exporter:
                # GKE's device plugin gives /dev/nvidia* only to GPU requesters
                # (deploy/overlays/gke); the API rejects this flag pair, so it must not be set.
                assert sc["privileged"] is True
                assert "allowPrivilegeEscalation" not in sc
            else:
                assert sc.get("privileged") is False, (workload["metadata"]["name"], c["name"])
                assert sc.get("allowPrivilegeEscalation") is False, c["name"]


@pytest.mark.parametrize("name", ALL)
def test_every_capability_dropped_none_added(name: str) -> None:
    for workload in _workloads(name):
        for c in containers(workload):
            caps = c["securityContext"]["capabilities"]
            assert caps["drop"] == ["ALL"], c["name"]
            assert not caps.get("add"), c["name"]


@pytest.mark.parametrize("name", ALL)
def test_read_only_root_filesystem_and_seccomp(name: str) -> None:
    for workload in _workloads(name):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in containers(workload):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc.get("seccompProfile", {"type": "RuntimeDefault"})["type"] == "RuntimeDefault"


@pytest.mark.parametrize("name", ALL)
def test_user_ids(name: str) -> None:
    objs = render(name)
    exporter_pod = exporter(objs)["spec"]["template"]["spec"]["securityContext"]
    if "nonroot" in name:
        assert exporter_pod["runAsNonRoot"] is True and exporter_pod["runAsUser"] == APP_UID
        assert all(v.get("hostPath", {}).get("path") != SOCKET_DIR
                   for v in exporter(objs)["spec"]["template"]["spec"]["volumes"])
    else:
        # UID 0 for the root-only kubelet socket, as an explicit, visible choice; with every
        # capability dropped (test above) it owns files, nothing more.
        assert exporter_pod["runAsUser"] == 0 and exporter_pod["runAsNonRoot"] is False
    dashboard = one(objs, "Deployment", "gpuscope-dashboard")["spec"]["template"]["spec"]
    assert dashboard["securityContext"]["runAsNonRoot"] is True
    assert dashboard["securityContext"]["runAsUser"] == APP_UID
    assert dashboard["automountServiceAccountToken"] is False


# ---- the exporter container ---------------------------------------------------------------------

def _env(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("name", ALL)
def test_nvidia_runtime_env_without_requesting_a_gpu(name: str) -> None:
    c = exporter_container(render(name))
    env = _env(c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory"}, "must not request nvidia.com/gpu"


@pytest.mark.parametrize("name", ALL)
def test_exporter_env_is_valid_exporter_configuration(name: str) -> None:
    """Every GPUSCOPE_* variable is a real flag with a value the exporter accepts."""
    env = {k: v for k, v in _env(exporter_container(render(name))).items() if isinstance(v, str)}
    config = parse_config([], environ={**env, "NODE_NAME": "node-1"}, hostname=lambda: "unused")
    assert (config.listen_host, config.listen_port) == ("::", 9463)
    assert config.source == "nvml"
    assert config.node_name == "node-1"


def test_gke_mounts_the_driver_and_points_the_loader_at_it() -> None:
    c = exporter_container(render("gke"))
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/usr/local/nvidia"]
    volumes = {v["name"]: v for v in _pod_spec("gke")["volumes"]}
    assert volumes[mount["name"]]["hostPath"]["path"] == GKE_DRIVER_DIR
    assert _env(c)["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    for other in ("eks", "aks"):
        assert "LD_LIBRARY_PATH" not in _env(exporter_container(render(other)))


@pytest.mark.parametrize("name", ALL)
def test_probes(name: str) -> None:
    objs = render(name)
    c = exporter_container(objs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 9463}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    for d in containers(one(objs, "Deployment", "gpuscope-dashboard")):
        assert "livenessProbe" in d and "readinessProbe" in d


def _quantity(value: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


@pytest.mark.parametrize("name", ALL)
def test_requests_and_limits(name: str) -> None:
    for workload in _workloads(name):
        for c in containers(workload):
            res = c["resources"]
            for r in ("cpu", "memory"):
                assert _quantity(res["requests"][r]) <= _quantity(res["limits"][r]), (c["name"], r)
    res = exporter_container(render(name))["resources"]
    # docs/deploy.md#sizing: above what docs/benchmarks.md measures.
    assert res == {"requests": {"cpu": "10m", "memory": "48Mi"},
                   "limits": {"cpu": "200m", "memory": "128Mi"}}


# ---- RBAC ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_rbac_is_read_only_on_pods_nodes_and_resourceslices(name: str) -> None:
    objs = render(name)
    roles = [*find(objs, "ClusterRole"), *find(objs, "Role")]
    assert roles
    allowed = {"": {"pods", "nodes"}, "resource.k8s.io": {"resourceslices"}}
    for role in roles:
        for rule in role["rules"]:
            (group,) = rule["apiGroups"]
            assert set(rule["resources"]) <= allowed[group], rule
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert not rule.get("nonResourceURLs")
    rules = {res: set(rule["verbs"])
             for role in roles for rule in role["rules"] for res in rule["resources"]}
    # No get on pods or ResourceSlices: the exporter lists and watches them (its node's, by
    # field selector) and gets nothing but its own node.
    assert rules == {"pods": {"list", "watch"}, "nodes": {"get"},
                     "resourceslices": {"list", "watch"}}


@pytest.mark.parametrize("name", ALL)
def test_binding_targets_the_exporters_service_account(name: str) -> None:
    objs = render(name)
    ds = exporter(objs)
    (binding,) = find(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] in {r["metadata"]["name"] for r in find(objs, "ClusterRole")}
    assert binding["subjects"] == [{
        "kind": "ServiceAccount",
        "name": ds["spec"]["template"]["spec"]["serviceAccountName"],
        "namespace": ds["metadata"]["namespace"],
    }]
    one(objs, "ServiceAccount", ds["spec"]["template"]["spec"]["serviceAccountName"])


# ---- namespace, service, monitors ---------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_everything_in_one_privileged_namespace(name: str) -> None:
    objs = render(name)
    (ns,) = find(objs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
    for o in objs:
        if o["kind"] not in cluster_scoped:
            assert o["metadata"]["namespace"] == ns["metadata"]["name"], (o["kind"], o["metadata"])


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("name", ALL)
def test_nothing_reaches_the_dashboard_over_the_network(name: str) -> None:
    # The dashboard has no login by default: a policy with no ingress rule isolates its pods
    # (port-forward and the kubelet's probes still reach it). The exporter stays reachable:
    # Prometheus scrapes it from wherever it runs.
    objs = render(name)
    policies = find(objs, "NetworkPolicy")
    dashboard = one(objs, "Deployment", "gpuscope-dashboard")["spec"]["template"]["metadata"]
    isolating = [p for p in policies
                 if _selects(p["spec"]["podSelector"]["matchLabels"], dashboard["labels"])]
    assert isolating, "no NetworkPolicy selects the dashboard's pods"
    for p in isolating:
        assert p["spec"]["policyTypes"] == ["Ingress"] and not p["spec"].get("ingress"), p
    pods = exporter(objs)["spec"]["template"]["metadata"]["labels"]
    assert not [p for p in policies
                if _selects(p["spec"]["podSelector"].get("matchLabels", {}), pods)]


@pytest.mark.parametrize("name", ALL)
def test_service_exposes_metrics_port_of_the_exporter_pods(name: str) -> None:
    objs = render(name)
    svc = one(objs, "Service", "gpuscope-exporter")
    pod_labels = exporter(objs)["spec"]["template"]["metadata"]["labels"]
    assert _selects(svc["spec"]["selector"], pod_labels)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9463, "targetPort": "metrics", "protocol": "TCP"}]


def _monitor_endpoints(name: str) -> list[tuple[Obj, Obj]]:
    objs = render(name)
    found = []
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        for monitor in find(objs, kind):
            found.extend((monitor, ep) for ep in monitor["spec"][key])
    return found


@pytest.mark.parametrize("name", [n for n in ALL if n != "aks-without-operator"])
def test_monitors_add_node_and_keep_the_workload_labels(name: str) -> None:
    objs = render(name)
    endpoints = _monitor_endpoints(name)
    assert len({m["kind"] for m, _ in endpoints}) == 1, "ServiceMonitor or PodMonitor, never both"
    for monitor, ep in endpoints:
        if monitor["kind"] == "ServiceMonitor":
            svc = one(objs, "Service", "gpuscope-exporter")
            assert _selects(monitor["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
            assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
        else:
            pod = exporter(objs)["spec"]["template"]
            assert _selects(monitor["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
            assert ep["port"] in {p["name"] for p in exporter_container(objs)["ports"]}
        assert ep["honorLabels"] is False
        relabels = ep["relabelings"]
        assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                "targetLabel": "node"} in relabels
        (drop,) = [r for r in relabels if r["action"] == "labeldrop"]
        for label in ("namespace", "pod", "container", "service", "endpoint"):
            assert re.fullmatch(drop["regex"], label), label
        for label in ("node", "job", "instance", "uuid", "gpu"):
            assert not re.fullmatch(drop["regex"], label), label


def test_without_operator_component_leaves_no_operator_kinds() -> None:
    kinds = {o["kind"] for o in render("aks-without-operator")}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert "DaemonSet" in kinds


def test_eks_cloudwatch_settings() -> None:
    objs = render("eks-cloudwatch")
    sa = one(objs, "ServiceAccount", "gpuscope-exporter")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    env = _env(exporter_container(objs))
    assert env["GPUSCOPE_CLOUDWATCH"] == "true" and env["GPUSCOPE_CLUSTER_NAME"]
    for plain in PROVIDER_OVERLAYS:
        if plain != "eks-cloudwatch":
            assert "GPUSCOPE_CLOUDWATCH" not in _env(exporter_container(render(plain)))

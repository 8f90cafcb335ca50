"""Which connections Kubernetes NetworkPolicies admit, decided from the objects alone, so a chart test
can ask "may this peer open this port on that pod?" of what the chart renders.

The rules are the NetworkPolicy API's own (networking.k8s.io/v1, ingress side): a pod that no policy
selects admits everything; a selected pod admits a connection when some rule of some selecting policy
matches both its port and its source. A rule without `ports` matches every port, one without `from`
(or with an empty list) every source. A peer with only `podSelector` means pods of the policy's own
namespace; with `namespaceSelector` too, pods of the selected namespaces; `ipBlock` an address range.
Namespaces carry the label `kubernetes.io/metadata.name`. Traffic from a pod's own node (kubelet
probes) is always admitted by Kubernetes and is not modelled here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Peer:
    """Where a connection comes from: a pod (namespace and labels) or an address outside the cluster."""

    name: str
    ip: str
    namespace: str | None = None  # None: not a pod
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace} if self.namespace else {}


def selects(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions) against labels; `{}` selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _peer_matches(entry: Mapping, peer: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in entry:
        ip = ipaddress.ip_address(peer.ip)
        block = entry["ipBlock"]
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(c) for c in block.get("except", []))
    if peer.namespace is None:
        return False  # selectors name pods only
    if "namespaceSelector" in entry:
        in_namespace = selects(entry["namespaceSelector"], peer.namespace_labels)
    else:
        in_namespace = peer.namespace == policy_namespace
    return in_namespace and ("podSelector" not in entry or selects(entry["podSelector"], peer.labels))


def _port_matches(ports: list | None, port: int, named: Mapping[str, int]) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        if "port" not in p:
            return True
        low = named.get(p["port"]) if isinstance(p["port"], str) else p["port"]
        if low is not None and low <= port <= p.get("endPort", low):
            return True
    return False


def admits(policies: list[dict], pod_namespace: str, pod_labels: Mapping[str, str], named_ports: Mapping[str, int],
           peer: Peer, port: int) -> bool:
    """Whether `peer` may open TCP `port` on the pod (its namespace, labels and named container ports)."""
    selecting = [p for p in policies
                 if p["metadata"].get("namespace", pod_namespace) == pod_namespace
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and selects(p["spec"].get("podSelector"), pod_labels)]
    if not selecting:
        return True
    return any(_port_matches(rule.get("ports"), port, named_ports)
               and (not rule.get("from") or any(_peer_matches(e, peer, pod_namespace) for e in rule["from"]))
               for p in selecting for rule in p["spec"].get("ingress") or [])

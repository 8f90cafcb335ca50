"""Node bootstrap: a node's topology -> the Ray node labels and custom resources it starts with.

`ray start --labels ... --resources ...` (and the Helm chart's worker groups) use these so that
placement groups can target an island:
- one custom resource per NVLink island, `nvlink_island:<node>-<k>`, whose quantity is the
  island's GPU count - a bundle asking for 1 of it lands on that node and draws from that island;
- `nvlink_domain:<domain>` with the node's GPU count, when the node is part of a multi-node
  NVLink domain;
- labels naming the node, its domain and rack, for `bundle_label_selector`.
Pure: the CLI gathers the topology (file or NVML) and prints `ray_start_args()`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from hbmserve.placement.topology import NodeTopology, local_island_id

NODE_LABEL = "hbmserve.io/node"
DOMAIN_LABEL = "hbmserve.io/nvlink-domain"
RACK_LABEL = "hbmserve.io/rack"
GPUS_LABEL = "hbmserve.io/gpus"
LARGEST_ISLAND_LABEL = "hbmserve.io/largest-nvlink-island"

_LABEL_VALUE_MAX = 63
_BAD_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^({_LABEL_NAME}(\.{_LABEL_NAME})*/)?{_LABEL_NAME}$")


def label_value(text: str) -> str:
    """A Kubernetes-syntax label value (Ray validates node labels the same way).

    Anything outside [A-Za-z0-9_.-] becomes '-', the ends must be alphanumeric, at most 63
    characters. Both the bootstrap and the placement-group selectors go through this function,
    so they always agree.
    """
    value = _BAD_LABEL_CHARS.sub("-", text)[:_LABEL_VALUE_MAX]
    value = value.strip("-_.")
    if not value:
        raise ValueError(f"cannot make a label value out of {text!r}")
    return value


def island_resource(node: str, k: int) -> str:
    return f"nvlink_island:{local_island_id(node, k)}"


def domain_resource(domain: str) -> str:
    return f"nvlink_domain:{domain}"


@dataclass(frozen=True)
class NodeBootstrap:
    node: str
    labels: Mapping[str, str]
    resources: Mapping[str, float]

    def ray_start_args(self) -> list[str]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return ["--labels", labels, "--resources", json.dumps(dict(sorted(self.resources.items())))]

    def shell(self) -> str:
        return shlex.join(self.ray_start_args())

    def to_json_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "labels": dict(self.labels),
            "resources": dict(self.resources),
            "ray_start_args": self.ray_start_args(),
        }


def bootstrap_node(node: NodeTopology) -> NodeBootstrap:
    """Labels: the node's own (from the cluster file) plus ours, which win on a clash."""
    islands = node.local_islands()
    labels: dict[str, str] = {}
    for key, value in node.labels.items():
        if key.startswith("ray.io/") or not _LABEL_KEY.match(key):
            raise ValueError(f"node {node.name}: label key {key!r} is not a valid Ray node label key")
        labels[key] = label_value(value)
    labels |= {
        NODE_LABEL: label_value(node.name),
        GPUS_LABEL: str(len(node.gpus)),
        LARGEST_ISLAND_LABEL: str(max((len(i) for i in islands), default=0)),
    }
    if node.nvlink_domain is not None:
        labels[DOMAIN_LABEL] = label_value(node.nvlink_domain)
    if node.rack is not None:
        labels[RACK_LABEL] = label_value(node.rack)
    resources: dict[str, float] = {island_resource(node.name, k): float(len(i)) for k, i in enumerate(islands)}
    if node.nvlink_domain is not None:
        resources[domain_resource(node.nvlink_domain)] = float(len(node.gpus))
    return NodeBootstrap(node.name, labels, resources)


def island_index_of(node: NodeTopology, gpu: int) -> int:
    """Which of the node's local islands (the k in `nvlink_island:<node>-k`) holds `gpu`."""
    for k, island in enumerate(node.local_islands()):
        if gpu in island:
            return k
    raise KeyError(f"node {node.name} has no GPU {gpu}")

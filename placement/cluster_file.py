"""Cluster topology files (YAML or JSON) and the edge validation for them.

Format: `{"nodes": [{"name": str, "labels": {str: str}, "nvlink_domain": str | null,
"nvidia_smi_topo": str}]}`, where `nvidia_smi_topo` is the verbatim output of
`nvidia-smi topo -m` on that node. Nodes that share an `nvlink_domain` form one multi-node
NVLink domain (GB200 NVL72 style). Extra keys accepted:
- per node, `rack`: the node's rack (else the `rack` label is used);
- top level, any key starting with `x-`: ignored, a place for YAML anchors so one topology
  text can serve many nodes.

A file that is not a mapping with `nodes` is read as the topology text of a single node.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hbmserve.placement.topo_text import TopoParseError, parse_topo_text
from hbmserve.placement.topology import ClusterTopology, NodeTopology

RACK_LABEL = "rack"


class TopologyFileError(ValueError):
    """A cluster file that cannot be used; the message names the file and the field."""


class NodeEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    nvlink_domain: str | None = None
    nvidia_smi_topo: str = Field(min_length=1)
    rack: str | None = None

    @field_validator("nvlink_domain", "rack")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value or None


class ClusterFile(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    nodes: list[NodeEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _only_extension_keys(self) -> ClusterFile:
        unknown = [k for k in (self.model_extra or {}) if not k.startswith("x-")]
        if unknown:
            raise ValueError(f"unknown top-level keys {unknown} (only 'nodes' and 'x-*' are read)")
        return self


def node_from_entry(entry: NodeEntry) -> NodeTopology:
    return parse_topo_text(
        entry.nvidia_smi_topo,
        name=entry.name,
        labels=entry.labels,
        nvlink_domain=entry.nvlink_domain,
        rack=entry.rack or entry.labels.get(RACK_LABEL),
    )


def cluster_from_data(data: Any, source: str = "<data>") -> ClusterTopology:
    """Validate already-loaded file content into a ClusterTopology."""
    try:
        spec = ClusterFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise TopologyFileError(f"{source}: field {where}: {first['msg']}") from None
    nodes = []
    for i, entry in enumerate(spec.nodes):
        try:
            nodes.append(node_from_entry(entry))
        except TopoParseError as err:
            raise TopologyFileError(f"{source}: nodes.{i}.nvidia_smi_topo ({entry.name}): {err}") from None
    try:
        return ClusterTopology(tuple(nodes))
    except ValueError as err:
        raise TopologyFileError(f"{source}: nodes: {err}") from None


def parse_cluster_text(text: str, source: str = "<text>", single_node_name: str = "node0") -> ClusterTopology:
    """Read a cluster file's text, or bare `nvidia-smi topo -m` text as a one-node cluster."""
    data: Any = None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TopologyFileError(f"{source}: invalid JSON: {err}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None  # raw topo text (tab-indented tables are not YAML)
    if isinstance(data, dict) and ("nodes" in data or not _looks_like_topo(text)):
        return cluster_from_data(data, source)
    try:
        node = parse_topo_text(text, name=single_node_name)
    except TopoParseError as err:
        raise TopologyFileError(f"{source}: neither a cluster file nor `nvidia-smi topo -m` output ({err})") from None
    return ClusterTopology((node,))


def _looks_like_topo(text: str) -> bool:
    return "GPU0" in text and "Legend" in text


def load_cluster_file(path: str | Path, single_node_name: str | None = None) -> ClusterTopology:
    """Load a cluster file from disk; bare topo text becomes one node named after the file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise TopologyFileError(f"{file}: cannot read: {err.strerror or err}") from None
    name = single_node_name or file.name.split(".")[0]
    return parse_cluster_text(text, source=str(file), single_node_name=name)

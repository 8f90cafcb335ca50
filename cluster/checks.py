"""The config as `hbmserve up` and `hbmserve deploy` accept it: the schema (hbmserve.core.config)
plus the checks that need a layer above it, done before anything starts so that a bad file is
one error naming its field, not a replica that fails a minute later."""

from __future__ import annotations

import os

from hbmserve.core.config import ClusterSpec, ConfigError, load_cluster_spec
from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file


def load_deployable(path: str | os.PathLike[str] | None = None) -> ClusterSpec:
    """`load_cluster_spec`, then the topology file's contents; raises ConfigError."""
    spec = load_cluster_spec(path)
    source = str(path) if path is not None else "(embedded default)"
    if spec.topology is not None:
        try:
            load_cluster_file(spec.topology)
        except TopologyFileError as err:
            raise ConfigError(f"invalid config {source}:\n  topology: {err}") from None
    return spec

"""A multi-node Ray cluster on this machine shaped like a topology (shared by the placement tests).

Each node of the topology becomes a worker raylet with fake `num_gpus` and the labels/resources
`bootstrap_node` derives for it, as `ray start` would get them on real hardware.
"""

from __future__ import annotations

from hbmserve.placement.bootstrap import bootstrap_node
from hbmserve.placement.topology import ClusterTopology


def start_placement_cluster(topology: ClusterTopology, timeout_s: float):
    """Head (no GPUs) plus one worker per topology node; the caller must `shutdown()` it."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    try:
        for node in topology.nodes:
            spec = bootstrap_node(node)
            cluster.add_node(num_cpus=1, num_gpus=len(node.gpus), resources=dict(spec.resources),
                             labels=dict(spec.labels))
        cluster.wait_for_nodes(timeout=timeout_s)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster

"""How the placement CLI shows topologies and plans: JSON documents and rich tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hbmserve.placement.placement_types import PlacementPlan
from hbmserve.placement.topology import ClusterTopology, NodeTopology


def _span(gpus: tuple[int, ...]) -> str:
    if len(gpus) > 2 and gpus == tuple(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def node_to_json(node: NodeTopology) -> dict[str, Any]:
    return {
        "name": node.name,
        "rack": node.rack,
        "nvlink_domain": node.nvlink_domain,
        "labels": dict(node.labels),
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_mib": g.memory_mib,
             "cpu_affinity": g.cpu_affinity, "numa_affinity": g.numa_affinity,
             "gpu_numa_id": g.gpu_numa_id, "fabric_cluster": g.fabric_cluster}
            for g in node.gpus
        ],
        "matrix": [[link.code for link in row] for row in node.links],
        "nics": [{"label": n.label, "device": n.device, "gpu_links": [link.code for link in n.gpu_links]}
                 for n in node.nics],
        "local_islands": [list(i) for i in node.local_islands()],
    }


def topology_to_json(topology: ClusterTopology) -> dict[str, Any]:
    return {
        "nodes": [node_to_json(n) for n in topology.nodes],
        "islands": [
            {"id": i.id, "size": i.size, "domain": i.domain, "members": [str(m) for m in i.members]}
            for i in topology.islands()
        ],
    }


def print_topology(console: Console, topology: ClusterTopology) -> None:
    islands = topology.islands()
    for node in topology.nodes:
        where = ", ".join(
            part for part in (
                f"rack {node.rack}" if node.rack else "",
                f"NVLink domain {node.nvlink_domain}" if node.nvlink_domain else "",
            ) if part
        )
        console.print(f"[bold]{node.name}[/]" + (f" ({where})" if where else ""), highlight=False)
        mine = [i for i in islands if node.name in i.nodes]
        for island in mine:
            local = tuple(m.gpu for m in island.members if m.node == node.name)
            extent = f" of {island.size} across {len(island.nodes)} nodes" if island.domain else ""
            console.print(f"  island {island.id}: GPUs {_span(local)} ({len(local)}{extent})", highlight=False)
        table = Table(show_edge=False, pad_edge=False, box=None)
        table.add_column("")
        for gpu in node.gpus:
            table.add_column(f"GPU{gpu.index}", justify="center")
        table.add_column("CPU affinity")
        table.add_column("NUMA")
        for gpu, row in zip(node.gpus, node.links):
            table.add_row(f"GPU{gpu.index}", *(link.code for link in row),
                          gpu.cpu_affinity or "-", gpu.numa_affinity or "-")
        console.print(table)
        console.print()


def print_plan(console: Console, plan: PlacementPlan) -> None:
    colour = "green" if plan.feasible else "red"
    console.print(f"[{colour}]{'feasible' if plan.feasible else 'infeasible'}:[/] {plan.reason}",
                  highlight=False)
    if plan.feasible:
        table = Table()
        for column in ("replica", "stage", "node", "GPUs", "island", "all-reduce us", "slowest link"):
            table.add_column(column)
        for replica in plan.replicas:
            for stage in replica.stages:
                gpus = " ".join(str(m) for m in stage.members) if len(stage.nodes) > 1 else _span(stage.gpus)
                table.add_row(str(replica.index), str(stage.stage), stage.node, gpus, stage.island,
                              f"{stage.allreduce_us:.1f}", stage.bottleneck or "-")
        console.print(table)
        console.print(f"predicted all-reduce (slowest group): {plan.predicted_allreduce_us:.1f} us per "
                      f"{plan.request.allreduce_bytes} bytes; stage hand-off per replica: "
                      f"{plan.predicted_handoff_us:.1f} us", highlight=False)
    for alt in plan.alternatives:
        console.print(f"  alternative ({alt.kind.value}): TP={alt.tp} PP={alt.pp} replicas={alt.replicas}"
                      f" - {alt.note}", highlight=False)

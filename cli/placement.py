"""Placement commands: `topology`, `placement plan`, `node-bootstrap`.

Registered by cli/main.py through `register(app)`. Heavy imports stay inside the commands so
`hbmserve --help` stays fast.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console

from hbmserve.cli.user_errors import EXIT_BAD_INPUT, fail

if TYPE_CHECKING:
    from hbmserve.placement.topology import ClusterTopology

EXIT_INFEASIBLE = 3
EXIT_NO_GPU = 1

out = Console()


def _load_file(path: Path, node: Optional[str] = None) -> ClusterTopology:
    from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file

    try:
        return load_cluster_file(path, single_node_name=node)
    except TopologyFileError as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None


def _discover_local(node: str, domain: Optional[str], rack: Optional[str]) -> ClusterTopology:
    from hbmserve.placement.io.nvml_discovery import discover_node, load_pynvml
    from hbmserve.placement.topology import ClusterTopology

    try:
        nvml = load_pynvml()
    except ImportError as e:
        raise fail(f"nvidia-ml-py is not installed ({e}); pass --file FILE", EXIT_NO_GPU) from None
    try:
        found = discover_node(node, nvlink_domain=domain, rack=rack, nvml=nvml)
    except nvml.NVMLError as e:
        raise fail(f"no GPU topology on this machine: NVML says {e!s}; pass --file FILE "
                    "(a cluster file or `nvidia-smi topo -m` output)", EXIT_NO_GPU) from None
    if not found.node.gpus:
        raise fail("NVML found no GPUs on this machine; pass --file FILE", EXIT_NO_GPU)
    return ClusterTopology((found.node,))


def topology(
    file: Optional[Path] = typer.Option(None, "--file", help="Cluster file (YAML/JSON) or `nvidia-smi topo -m` "
                                        "output; without it, NVML discovery on this machine."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Show the NVLink islands per node and the GPU x GPU link matrix."""
    from hbmserve.cli.placement_render import print_topology, topology_to_json

    topo = _load_file(file) if file is not None else _discover_local(socket.gethostname(), None, None)
    if as_json:
        out.print_json(json.dumps(topology_to_json(topo)))
    else:
        print_topology(out, topo)


def node_bootstrap(
    file: Optional[Path] = typer.Option(None, "--file", help="Cluster file or `nvidia-smi topo -m` output; "
                                        "without it, NVML discovery on this machine."),
    node: Optional[str] = typer.Option(None, "--node", help="Node name (required with a multi-node --file; "
                                       "default: this host's name)."),
    nvlink_domain: Optional[str] = typer.Option(None, "--nvlink-domain", help="Override the NVLink domain "
                                                "(NVML discovery only)."),
    rack: Optional[str] = typer.Option(None, "--rack", help="Rack label (NVML discovery only)."),
    as_json: bool = typer.Option(False, "--json", help="Print labels, resources and arguments as JSON."),
) -> None:
    """Print the `ray start --labels ... --resources ...` arguments for this node's topology."""
    from hbmserve.placement.bootstrap import bootstrap_node

    if file is not None:
        if nvlink_domain is not None or rack is not None:
            raise fail("--nvlink-domain and --rack apply to NVML discovery; put them in the file", EXIT_BAD_INPUT)
        topo = _load_file(file, node)
        if node is None and len(topo.nodes) > 1:
            names = ", ".join(n.name for n in topo.nodes)
            raise fail(f"--node is required: {file} describes {len(topo.nodes)} nodes ({names})", EXIT_BAD_INPUT)
        try:
            chosen = topo.node(node) if node is not None else topo.nodes[0]
        except KeyError:
            names = ", ".join(n.name for n in topo.nodes)
            raise fail(f"--node: no node {node!r} in {file} (nodes: {names})", EXIT_BAD_INPUT) from None
    else:
        chosen = _discover_local(node or socket.gethostname(), nvlink_domain, rack).nodes[0]
    try:
        spec = bootstrap_node(chosen)
    except ValueError as e:
        raise fail(str(e), EXIT_BAD_INPUT) from None
    if as_json:
        out.print_json(json.dumps(spec.to_json_dict()))
    else:
        typer.echo(spec.shell())


def plan_command(
    topology_file: Path = typer.Option(..., "--topology", help="Cluster file (YAML/JSON) or "
                                       "`nvidia-smi topo -m` output."),
    tp: int = typer.Option(..., "--tp", min=1, help="Tensor-parallel size."),
    pp: int = typer.Option(1, "--pp", min=1, help="Pipeline-parallel size."),
    replicas: int = typer.Option(1, "--replicas", min=1, help="Number of replicas."),
    gpus_per_rank: int = typer.Option(1, "--gpus-per-rank", min=1, help="GPUs per rank (vLLM: 1)."),
    distinct_nodes: bool = typer.Option(False, "--distinct-nodes", help="Put every PP stage of a replica "
                                        "on its own node."),
    allow_pcie_tp: bool = typer.Option(False, "--allow-pcie-tp", help="Let TP groups use PCIe inside a "
                                       "node when no NVLink island fits."),
    allreduce_mib: float = typer.Option(16.0, "--allreduce-mib", min=0.001, help="Message size of one "
                                        "all-reduce for the cost prediction, MiB."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Plan TP/PP/replica placement; exit 0 when it fits, 3 when it does not."""
    from hbmserve.cli.placement_render import print_plan
    from hbmserve.placement.placement_types import PlacementRequest
    from hbmserve.placement.placer import plan

    topo = _load_file(topology_file)
    request = PlacementRequest(
        tp=tp, pp=pp, replicas=replicas, gpus_per_rank=gpus_per_rank, pp_distinct_nodes=distinct_nodes,
        allow_pcie_tp=allow_pcie_tp, allreduce_bytes=max(1, int(allreduce_mib * 1024 * 1024)),
    )
    result = plan(request, topo)
    if as_json:
        typer.echo(json.dumps(result.to_json_dict(), indent=2))
    else:
        print_plan(out, result)
    if not result.feasible:
        raise typer.Exit(EXIT_INFEASIBLE)


def register(app: typer.Typer) -> None:
    app.command("topology")(topology)
    app.command("node-bootstrap")(node_bootstrap)
    placement_app = typer.Typer(help="Place TP groups inside NVLink islands and PP stages across nodes.",
                                no_args_is_help=True)
    placement_app.command("plan")(plan_command)
    app.add_typer(placement_app, name="placement")

"""NVML topology discovery on a real GPU machine (run by hand on a lent GPU box; not CI).

    python tests/gpu/nvml_topology.py            # prints the topology, exit 0 on success
    OUT=/some/dir python tests/gpu/nvml_topology.py   # also writes $OUT/nvml_topology.json

Needs only nvidia-ml-py (pynvml); uses torch when present to cross-check P2P access and the
device count. No Ray, and no installed hbmserve: the repository root is loaded as the
`hbmserve` package straight from this checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load_hbmserve_from_checkout() -> None:
    if "hbmserve" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location("hbmserve", REPO / "__init__.py",
                                                  submodule_search_locations=[str(REPO)])
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the hbmserve package from {REPO}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hbmserve"] = module
    spec.loader.exec_module(module)


def _torch_view(count: int) -> dict[str, object]:
    try:
        import torch
    except ImportError:
        return {"torch": None}
    if not torch.cuda.is_available():
        return {"torch": torch.__version__, "cuda_available": False}
    peers = {f"{i}->{j}": bool(torch.cuda.can_device_access_peer(i, j))
             for i in range(count) for j in range(count) if i != j}
    return {"torch": torch.__version__, "cuda_available": True,
            "device_count": torch.cuda.device_count(), "peer_access": peers}


def main() -> int:
    _load_hbmserve_from_checkout()
    import pynvml

    from hbmserve.placement.bootstrap import bootstrap_node
    from hbmserve.placement.io.nvml_discovery import discover_node
    from hbmserve.placement.placement_types import PlacementRequest
    from hbmserve.placement.placer import plan
    from hbmserve.placement.topology import ClusterTopology

    name = socket.gethostname()
    started = time.perf_counter()
    try:
        found = discover_node(name)  # affinity masks sized for up to 1024 CPUs
    except pynvml.NVMLError as err:
        print(f"NVML unavailable: {err}", file=sys.stderr)
        return 2
    elapsed_ms = (time.perf_counter() - started) * 1000
    node = found.node

    print(f"node {node.name}: {len(node.gpus)} GPU(s), NVLink domain {node.nvlink_domain or '-'}, "
          f"discovery {elapsed_ms:.0f} ms")
    for gpu in node.gpus:
        print(f"  GPU{gpu.index} {gpu.name} {gpu.memory_mib} MiB {gpu.uuid} cpus={gpu.cpu_affinity} "
              f"numa={gpu.numa_affinity} gpu_numa={gpu.gpu_numa_id} fabric={gpu.fabric_cluster}")
    print("  matrix:")
    for gpu, row in zip(node.gpus, node.links):
        print(f"    GPU{gpu.index} " + " ".join(f"{link.code:>5}" for link in row))
    print(f"  islands: {node.local_islands()}  inactive links per GPU: {found.inactive_nvlinks}  "
          f"dropped (no P2P): {found.dropped_links}")
    cluster = ClusterTopology((node,))
    plans = {}
    tp = 1
    while tp <= len(node.gpus):
        result = plan(PlacementRequest(tp=tp), cluster)
        plans[tp] = result.to_json_dict()
        print(f"  plan TP={tp}: {'ok' if result.feasible else 'refused'} - {result.reason}")
        tp *= 2
    boot = bootstrap_node(node)
    print(f"  ray start {boot.shell()}")
    torch_view = _torch_view(len(node.gpus))
    print(f"  torch: {torch_view}")

    document = {
        "node": node.name,
        "discovery_ms": round(elapsed_ms, 1),
        "gpus": [vars(g) for g in node.gpus],
        "matrix": [[link.code for link in row] for row in node.links],
        "islands": [list(i) for i in node.local_islands()],
        "nvlink_domain": node.nvlink_domain,
        "pci_bus_ids": list(found.pci_bus_ids),
        "nvlink_p2p_ok": [list(r) for r in found.nvlink_p2p_ok],
        "inactive_nvlinks": list(found.inactive_nvlinks),
        "dropped_links": [list(p) for p in found.dropped_links],
        "plans": plans,
        "bootstrap": boot.to_json_dict(),
        "torch": torch_view,
    }
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / "nvml_topology.json"
        path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {path}")
    if len(node.gpus) == 0:
        print("NVML reported no GPUs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

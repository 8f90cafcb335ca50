"""What serving LoRA adapters costs an engine, for the simulator and the planner (issue 25).

Three costs, each from the deployment and the adapters' rank:
* A load. An adapter not in the engine's host cache is read from local storage, then copied
  over the host link into a GPU slot; one in the host cache only copied. The step that first
  uses it waits for both (vLLM loads adapters synchronously while it prepares the step).
* Slots. A step may use at most `max_loras` distinct adapters; a request for another waits
  until one of them has no running request, as vLLM's scheduler skips it.
* Per step. With LoRA enabled every step runs the LoRA kernels beside the base model's
  (vLLM wraps each target layer), whether or not the batch uses an adapter.

Which adapters a replica keeps is one pure function, `place_adapter`: bring one in, evicting the
least recently used idle one when the slots are full. The live replica calls it for the adapters
registered in its vLLM engine (deployments/replica/replica_middleware.py AdapterRegistry, through vLLM's
/v1/load_lora_adapter and /v1/unload_lora_adapter), the simulated engine for its host and GPU
slots (`AdapterTiers`). An adapter in use is never evicted: its requests would fail (live) or lose
their slot mid-batch. With every resident adapter busy the caller decides: the live registry
over-commits (vLLM's own LRU bounds its memory, and nothing accepted is dropped); the GPU slots
make the request wait for the next step, as vLLM's scheduler does.

Assumed, not measured here (no GPU LoRA kernel runs on this machine): local storage reads at
2 GB/s, a load has a fixed 20 ms cost (opening the safetensors, vLLM's checks), and LoRA makes a
step 10% slower. Each is a field of `LoraCost`, so a measured figure replaces it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hbmserve.capacity.perf.model_shape import ModelShape
from hbmserve.capacity.perf.perf_model import Deployment

STORAGE_BW_BYTES_S = 2e9
LOAD_FIXED_S = 0.02
STEP_FACTOR = 1.10


@dataclass(frozen=True)
class LoraCost:
    max_loras: int  # GPU slots: distinct adapters one step may use
    max_cpu_loras: int  # adapters the host cache holds (the live replica's registry)
    storage_load_s: float  # local storage -> host memory, one adapter
    host_load_s: float  # host memory -> a GPU slot, one adapter
    step_factor: float = STEP_FACTOR  # a step's time with LoRA enabled over its time without


def adapter_bytes(shape: ModelShape, rank: int) -> int:
    """A rank-`rank` adapter on the four attention projections of every layer (A and B of each:
    rank x (in + out) weights), in the model's dtype."""
    q_out = shape.num_heads * shape.head_dim
    kv_out = shape.num_kv_heads * shape.head_dim
    per_layer = rank * ((shape.hidden + q_out) * 2 + (shape.hidden + kv_out) * 2)
    return int(per_layer * shape.num_layers * shape.dtype_bytes)


def lora_cost(dep: Deployment, max_loras: int, max_cpu_loras: int | None, rank: int) -> LoraCost:
    """The costs of `rank` adapters on one replica of `dep` (each TP rank loads its shard at once)."""
    size = adapter_bytes(dep.model, rank) / dep.tp
    link = dep.gpu.host_link
    return LoraCost(max_loras, max_cpu_loras or max_loras, storage_load_s=LOAD_FIXED_S + size / STORAGE_BW_BYTES_S,
                    host_load_s=link.latency_s + size / link.bw_bytes_s)


@dataclass(frozen=True)
class AdapterPlan:
    resident: bool  # the adapter is there already: nothing to load
    fits: bool  # it may be used now (False: every slot is busy and the caller may not over-commit)
    evict: tuple[str, ...]  # adapters to drop first, least recently used first
    reason: str


def place_adapter(name: str, resident: Sequence[str], busy: Mapping[str, int], capacity: int,
                  overcommit: bool = False) -> AdapterPlan:
    """`resident`: the adapters held now, least recently used first; `busy`: requests using each
    (absent or 0: idle); `capacity`: slots. `overcommit`: load beyond the slots when all are busy."""
    if name in resident:
        return AdapterPlan(True, True, (), f"{name} is loaded")
    if len(resident) < capacity:
        return AdapterPlan(False, True, (), f"load {name}: {len(resident)}/{capacity} slots used")
    excess = len(resident) - capacity + 1  # an over-committed set shrinks back as adapters go idle
    idle = [a for a in resident if not busy.get(a)][:excess]
    if idle:
        return AdapterPlan(False, True, tuple(idle), f"load {name}, evicting least recently used {', '.join(idle)}")
    if overcommit:
        return AdapterPlan(False, True, (), f"load {name} over the {capacity} slots: all {len(resident)} are in use")
    return AdapterPlan(False, False, (), f"{name} waits: all {capacity} slots are in use")


class AdapterTiers:
    """One simulated engine's adapters: which are in its host cache and GPU slots, least recently
    used first, and how many running requests use each. Placement is `place_adapter`, as live."""

    def __init__(self, cost: LoraCost) -> None:
        self.cost = cost
        self.host: OrderedDict[str, None] = OrderedDict()
        self.gpu: OrderedDict[str, None] = OrderedDict()
        self.running: dict[str, int] = {}
        self.loads = 0  # from storage into the host cache
        self.evictions = 0  # out of the host cache
        self.loads_by: Counter[str] = Counter()  # `loads`, per adapter
        self.load_s_by: Counter[str] = Counter()  # seconds its loads and GPU-slot copies took, per adapter

    def can_run(self, name: str) -> bool:
        return place_adapter(name, tuple(self.gpu), self.running, self.cost.max_loras).fits

    def acquire(self, name: str) -> float:
        """A request using `name` starts running; returns the seconds its loads take."""
        seconds = 0.0
        host = place_adapter(name, tuple(self.host), self.running, self.cost.max_cpu_loras, overcommit=True)
        for a in host.evict:
            del self.host[a]
            self.gpu.pop(a, None)
            self.evictions += 1
        if not host.resident:
            self.host[name] = None
            self.loads += 1
            self.loads_by[name] += 1
            seconds += self.cost.storage_load_s
        self.host.move_to_end(name)
        gpu = place_adapter(name, tuple(self.gpu), self.running, self.cost.max_loras, overcommit=True)
        for a in gpu.evict:
            del self.gpu[a]
        if not gpu.resident:
            self.gpu[name] = None
            seconds += self.cost.host_load_s
        self.gpu.move_to_end(name)
        self.running[name] = self.running.get(name, 0) + 1
        if seconds:
            self.load_s_by[name] += seconds
        return seconds

    def release(self, name: str) -> None:
        left = self.running.get(name, 0) - 1
        if left > 0:
            self.running[name] = left
        else:
            self.running.pop(name, None)

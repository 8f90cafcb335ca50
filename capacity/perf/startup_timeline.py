"""How long a replica takes to start from each tier, phase by phase, from bytes and bandwidths.

    timeline(kind, inputs) -> Timeline      the phases of one start
    startup_s(inputs, sleeping) -> {Tier: s} the policy's start-up per tier ("scale up" to serving)

A start walks these phases; each tier skips the ones it has already done:

    node ready      provision a node and join it to the cluster (cold only)
    weights local   bytes from the source into the node's cache (cold only; warm hits the cache)
    engine loaded   read the weights from local disk into the engine, plus the engine's fixed
                    start (process, memory profile, KV allocation, graphs); a sleeping standby
                    instead copies its weights back from host memory and re-allocates its KV
    promoted        a standby taken into rotation: the front door routes to it (standbys only;
                    a new engine is routed to as soon as it is loaded)
    first token     an idle engine answers a short prompt

Cold: all but promotion. Warm: node up, weights on NVMe, so load and first token. Hot (loaded standby):
promotion and first token. Sleeping (vLLM sleep mode, level 1: weights offloaded to host
memory, KV freed): the wake, then promotion and first token.

Bytes over bandwidth is the part that grows with the model; everything else is a fixed cost of
the engine and the cluster. The inputs say where each figure comes from: measured here
(capacity/perf/data/startup_measured.json, written by ops/bench/cold_start.py and weight_load.py)
or assumed (a datasheet or a round figure, labelled as such in `StartupInputs.sources`).
Pure: no I/O here; capacity/perf/startup_measured.py reads the file and builds the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hbmserve.core.scaling import Tier

GB = 1e9


class Phase(str, Enum):
    NODE_READY = "node_ready"
    WEIGHTS_LOCAL = "weights_local"
    ENGINE_LOADED = "engine_loaded"
    PROMOTED = "promoted"  # a standby taken into rotation (hot and sleeping only)
    FIRST_TOKEN = "first_token"


class StartKind(str, Enum):
    """Where a start begins: the three policy tiers, with the hot one split by sleep mode."""

    COLD = "cold"
    WARM = "warm"
    SLEEPING = "sleeping"
    HOT = "hot"


@dataclass(frozen=True)
class StartupInputs:
    """Everything a start-up takes, in seconds, bytes and GB/s (1e9 bytes per second)."""

    weights_bytes: float
    source_gbps: float  # from the model's source (object store, hub) into the node's cache
    disk_gbps: float  # sequential read of the node's local disk (NVMe)
    # The engine's weight loader as a share of the disk's bandwidth (ops/bench/weight_load.py).
    load_efficiency: float
    node_ready_s: float  # provision and join a node (cold only)
    engine_init_s: float  # the engine's start besides reading weights
    promote_s: float  # a loaded standby taken into rotation (decision to routed)
    first_token_s: float  # an idle, loaded engine's first token for a short prompt
    # Sleeping standby: host memory to accelerator, per device (each device wakes its own shard).
    wake_gbps: float | None = None
    devices: int = 1  # tp x pp: the weights are split between them for the wake
    wake_fixed_s: float = 0.0  # the wake besides the copy: KV re-allocation, caches reset
    # Where each figure comes from ("measured ..." or "assumed ..."), for the report.
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        problems = [f"{k} must be > 0" for k in ("source_gbps", "disk_gbps", "load_efficiency")
                    if not getattr(self, k) > 0]
        problems += [f"{k} must be >= 0" for k in ("weights_bytes", "node_ready_s", "engine_init_s",
                                                   "promote_s", "first_token_s", "wake_fixed_s")
                     if getattr(self, k) < 0]
        if self.wake_gbps is not None and not self.wake_gbps > 0:
            problems.append("wake_gbps must be > 0 or None (no sleep mode)")
        if self.devices < 1:
            problems.append("devices must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def has_sleep_mode(self) -> bool:
        return self.wake_gbps is not None

    def fetch_s(self) -> float:
        return self.weights_bytes / (self.source_gbps * GB)

    def load_s(self) -> float:
        return self.weights_bytes / (self.disk_gbps * self.load_efficiency * GB) + self.engine_init_s

    def wake_s(self) -> float:
        if self.wake_gbps is None:
            raise ValueError("this engine has no sleep mode: a sleeping standby cannot wake")
        return self.weights_bytes / self.devices / (self.wake_gbps * GB) + self.wake_fixed_s


@dataclass(frozen=True)
class Timeline:
    kind: StartKind
    phases: tuple[tuple[Phase, float], ...]  # in order; skipped phases are absent

    @property
    def first_token_s(self) -> float:
        return sum(s for _, s in self.phases)

    @property
    def serving_s(self) -> float:
        """Seconds to a replica that serves: what the policy's `startup_s` means."""
        return sum(s for p, s in self.phases if p is not Phase.FIRST_TOKEN)

    def seconds(self, phase: Phase) -> float:
        return sum(s for p, s in self.phases if p is phase)


def timeline(kind: StartKind, inputs: StartupInputs) -> Timeline:
    i = inputs
    first = ((Phase.FIRST_TOKEN, i.first_token_s),)
    serve = ((Phase.PROMOTED, i.promote_s), *first)
    if kind is StartKind.HOT:
        return Timeline(kind, serve)
    if kind is StartKind.SLEEPING:
        return Timeline(kind, ((Phase.ENGINE_LOADED, i.wake_s()), *serve))
    load = ((Phase.ENGINE_LOADED, i.load_s()),)
    if kind is StartKind.WARM:
        return Timeline(kind, (*load, *first))
    return Timeline(kind, ((Phase.NODE_READY, i.node_ready_s), (Phase.WEIGHTS_LOCAL, i.fetch_s()),
                           *load, *first))


def startup_s(inputs: StartupInputs, sleeping: bool = False) -> dict[Tier, float]:
    """The policy's start-up per tier; the HOT tier is a sleeping standby's wake when `sleeping`."""
    hot = StartKind.SLEEPING if sleeping else StartKind.HOT
    warm = timeline(StartKind.WARM, inputs).serving_s
    # A standby slower to wake than a fresh load from disk would not be kept asleep; the policy
    # needs hot <= warm <= cold, and a cold start always includes a warm one.
    return {Tier.HOT: min(timeline(hot, inputs).serving_s, warm), Tier.WARM: warm,
            Tier.COLD: timeline(StartKind.COLD, inputs).serving_s}


@dataclass(frozen=True)
class TierRatios:
    """First token from each faster tier over a cold start's, against the issue's targets."""

    warm: float
    hot: float
    sleeping: float | None
    warm_target: float = 0.5
    hot_target: float = 0.15

    @property
    def warm_met(self) -> bool:
        return self.warm <= self.warm_target

    @property
    def hot_met(self) -> bool:
        return self.hot <= self.hot_target

    @property
    def sleeping_met(self) -> bool | None:
        return None if self.sleeping is None else self.sleeping <= self.hot_target


def ratios(inputs: StartupInputs) -> TierRatios:
    cold = timeline(StartKind.COLD, inputs).first_token_s
    if cold <= 0:
        raise ValueError("a cold start of 0 s leaves nothing to compare against")
    sleeping = timeline(StartKind.SLEEPING, inputs).first_token_s / cold if inputs.has_sleep_mode else None
    return TierRatios(warm=timeline(StartKind.WARM, inputs).first_token_s / cold,
                      hot=timeline(StartKind.HOT, inputs).first_token_s / cold, sleeping=sleeping)

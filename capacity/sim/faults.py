"""Replicas lost in a simulated run: a process killed, a node gone, at given times.

What the live front door does with a lost replica's streams (deployments/ingress/migration.py)
the simulator does with its requests: every request the lost engine held goes on from another
replica, where its prompt and the tokens it had already streamed are prefilled again (what a
continuation costs: the lost KV is recomputed) and its remaining tokens are decoded. Its first
token, if it had one, stands; its TPOT carries the break. A fixed fleet gets a new replica after
`restart_s` (Serve restarts a dead replica); with a scaling policy the policy decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.capacity.perf.engine_core import EngineCore
from hbmserve.capacity.perf.engine_types import SimRequest


@dataclass(frozen=True)
class ReplicaFaults:
    at_s: tuple[float, ...]  # when a replica is lost: the busiest active one, the worst case
    restart_s: float = 60.0  # a fixed fleet's replacement starts serving this long after

    def __post_init__(self) -> None:
        if any(t < 0 for t in self.at_s) or self.restart_s < 0:
            raise ValueError("fault times and restart_s must be >= 0")


def orphans(engine: EngineCore) -> list[SimRequest]:
    """Every request `engine` held, taken out of it and reset to start over elsewhere from its
    prompt and the tokens it had streamed (recomputed, as after a preemption by recompute)."""
    held = [*engine.waiting, *engine.prefilling, *engine.decode.values()]
    for r in held:
        engine.abort(r.rid)  # sets `generated` of a decoding request
        r.hashes, r.hashed_tokens, r.own_blocks, r.swapped_tokens = (), 0, 0, 0
        r.computed, r.target = 0, r.prompt + r.generated
    return held

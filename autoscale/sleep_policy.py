"""Whether a replica's engine should sleep or wake now, from its role. Pure.

    sleep_step(role, *, sleep_enabled, sleeping, in_flight) -> SleepStep(action, reason)

A model with `autoscaling.hot_standby.sleep` keeps its hot standbys in the engine's sleep mode
(vLLM level 1: weights offloaded to host memory, KV freed), so a standby holds no HBM idle. The
replica learns its role from the policy's decision (deployments/apps/model_app.py `_role`) and asks
this function what to do; deployments/replica/standby_sleep.py does it.

The rules, and why:
* Active -> awake. A promoted replica wakes before it serves: requests that reach it meanwhile
  are held at its door until the wake is done (deployments/replica/standby_sleep.py `AwakeGate`).
* Standby with nothing in flight -> asleep. Never with requests in flight: vLLM's sleep aborts
  what is running, so a demoted replica first finishes its requests (the front door routes no
  new ones to a standby). There is no separate drain timer: the replica asks again every tick,
  so a request that never finishes keeps the standby loaded (as without sleep mode), and a
  promotion during the drain simply ends it.
* Asleep with requests in flight -> awake, whatever the role. A front door whose view of the
  decision lags may still send a request to a demoted replica; it is answered after a wake
  rather than dropped, and the replica sleeps again once it is idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hbmserve.core.scaling import ReplicaState


class SleepAction(str, Enum):
    STAY = "stay"  # keep the engine as it is
    SLEEP = "sleep"
    WAKE = "wake"


@dataclass(frozen=True)
class SleepStep:
    action: SleepAction
    reason: str


def sleep_step(role: ReplicaState, *, sleep_enabled: bool, sleeping: bool, in_flight: int) -> SleepStep:
    """What the engine of a replica in `role` does now. `in_flight`: requests the replica admitted
    and has not finished, those held while it sleeps included."""
    if sleeping:
        if role is ReplicaState.ACTIVE:
            return SleepStep(SleepAction.WAKE, "promoted: wake before serving")
        if in_flight > 0:
            return SleepStep(SleepAction.WAKE, f"{in_flight} request(s) arrived while asleep: wake to answer them")
        if not sleep_enabled:
            return SleepStep(SleepAction.WAKE, "sleep mode is off")
        return SleepStep(SleepAction.STAY, "standby, asleep")
    if role is ReplicaState.ACTIVE or not sleep_enabled:
        return SleepStep(SleepAction.STAY, "awake")
    if in_flight > 0:
        return SleepStep(SleepAction.STAY, f"standby, draining {in_flight} request(s) before sleeping")
    return SleepStep(SleepAction.SLEEP, "standby and idle: sleep")

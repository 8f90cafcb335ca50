"""One rollout step: how many replicas the old and the new version of a model should have now.

A model whose config changed is rolled replica by replica (cluster/rolling_deploy.py runs the steps):
the new version runs as a second Serve application beside the old one, and the front doors
route to both, since they route by model. The rule that keeps the GPUs inside the fleet: the
replicas of both versions, stopping ones included (a stopping replica still holds its GPUs),
never exceed the old fleet plus the surge the config allows (`serve.rollout.max_surge`, 0 by
default). So each step either fills a free place with a new replica or frees one by retiring an
old replica: a standby first (it serves nothing), else an active one, which drains (its front
doors stop sending to it and its streams finish, or move on through migration).

A new version that fails (its application fails to deploy or turns unhealthy, or a replica is
not ready within `ready_timeout_s`) rolls back: the new version goes, the old fleet comes back
whole. Pure: a snapshot in, a decision with its reason out; the time is passed in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hbmserve.core.config import ClusterSpec


class RolloutPhase(str, enum.Enum):
    ROLLING = "rolling"
    DONE = "done"  # every replica runs the new version; the old application can go
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"  # the old fleet is whole again, the new version gone


@dataclass(frozen=True)
class RolloutSnapshot:
    target: int  # replicas the model runs when done: the old fleet's size
    max_surge: int  # replicas allowed beyond target while rolling
    ready_timeout_s: float
    old_running: int  # old-version replicas up (active or standby)
    old_standby: int  # of those, standbys: retired without a drain
    old_stopping: int  # old replicas draining or stopping: they still hold their GPUs
    new_ready: int  # new-version replicas serving
    new_starting: int  # new-version replicas asked for and not serving yet
    new_failure: str | None  # why the new version failed (Serve's message), None while it has not
    waiting_since: float  # when the oldest new replica still starting was asked for (monotonic)
    new_stopping: int = 0  # new-version replicas stopping (a rollback): they still hold their GPUs
    rolling_back: bool = False  # a rollback was decided earlier: carry it through


@dataclass(frozen=True)
class RolloutDecision:
    old_replicas: int  # the old version's replica count to ask of Serve
    new_replicas: int
    phase: RolloutPhase
    reason: str


def decide(s: RolloutSnapshot, now: float) -> RolloutDecision:
    """The next step of one model's rollout."""
    if s.rolling_back or s.new_failure is not None or (
            s.new_starting and now - s.waiting_since > s.ready_timeout_s):
        return _roll_back(s, now)
    old, new = s.old_running + s.old_stopping, s.new_ready + s.new_starting
    if s.new_ready >= s.target:
        if old == 0:
            return RolloutDecision(0, s.target, RolloutPhase.DONE,
                                   f"all {s.target} replicas run the new version")
        return RolloutDecision(0, s.target, RolloutPhase.ROLLING,
                               f"{s.new_ready}/{s.target} new replicas serve: retiring the last "
                               f"{old} old one(s)")
    if s.new_starting:
        return RolloutDecision(s.old_running, new, RolloutPhase.ROLLING,
                               f"waiting for {s.new_starting} new replica(s) to serve "
                               f"({now - s.waiting_since:.0f} s of {s.ready_timeout_s:.0f} s)")
    room = s.target + s.max_surge - old - new
    if room > 0:
        start = min(room, s.target - new)
        return RolloutDecision(s.old_running, new + start, RolloutPhase.ROLLING,
                               f"starting {start} new replica(s) in free places "
                               f"({old + new} of {s.target + s.max_surge} in use)")
    if s.old_stopping:
        return RolloutDecision(s.old_running, new, RolloutPhase.ROLLING,
                               f"waiting for {s.old_stopping} old replica(s) to drain and free their GPUs")
    if s.old_standby:
        return RolloutDecision(s.old_running - 1, new, RolloutPhase.ROLLING,
                               "retiring an old standby (it serves nothing) to make room for a new replica")
    serving = s.old_running + s.new_ready
    gap = " and the model has no serving replica until the new one is up (a surge avoids it)" \
        if serving <= 1 else ""
    return RolloutDecision(s.old_running - 1, new, RolloutPhase.ROLLING,
                           f"draining an old replica to free its GPUs for a new one{gap}")


def _roll_back(s: RolloutSnapshot, now: float) -> RolloutDecision:
    why = s.new_failure or (f"a new replica was not serving {now - s.waiting_since:.0f} s after it was asked "
                            f"for (ready_timeout_s {s.ready_timeout_s:.0f})" if not s.rolling_back else "")
    new_gone = s.new_ready + s.new_starting + s.new_stopping == 0
    if s.old_running >= s.target and new_gone:
        return RolloutDecision(s.target, 0, RolloutPhase.ROLLED_BACK,
                               f"the old version serves on {s.target} replica(s) again")
    # The new version goes first: its GPUs are the ones the old replicas come back to.
    old = s.target if new_gone else s.old_running
    return RolloutDecision(old, 0, RolloutPhase.ROLLING_BACK,
                           f"rolling back{': ' + why if why else ''}; restoring {s.target} old replica(s)")


@dataclass(frozen=True)
class InPlaceSnapshot:
    """An autoscaled model that Serve updates in place (its policy and standbys stay with its one
    application): how far Serve has got."""

    # Serve's application status (DEPLOYING, RUNNING, DEPLOY_FAILED, UNHEALTHY), read after the hand-over
    # returned: Serve's controller sets the new target, DEPLOYING, before the deploy call returns.
    app_state: str
    failure: str | None  # Serve's message when the app failed
    since: float  # when the new version was handed to Serve (monotonic)
    ready_timeout_s: float
    rolling_back: bool = False  # the old version was handed back: waiting for it to run


def decide_in_place(s: InPlaceSnapshot, now: float) -> RolloutDecision:
    """The next step of an in-place update. Serve replaces the replicas itself (no surge GPU:
    an old replica stops, draining, before its replacement starts), and on a version whose
    replicas keep failing it stops the update with the old replicas still running; handing the
    old version back to Serve then restores the fleet. Counts are not asked here (-1)."""
    waited = now - s.since
    if s.rolling_back:
        if s.app_state == "RUNNING":
            return RolloutDecision(-1, -1, RolloutPhase.ROLLED_BACK, "the old version runs on every replica again")
        return RolloutDecision(-1, -1, RolloutPhase.ROLLING_BACK, "waiting for Serve to restore the old version")
    if s.app_state in ("DEPLOY_FAILED", "UNHEALTHY"):
        return RolloutDecision(-1, -1, RolloutPhase.ROLLING_BACK, f"rolling back: {s.failure or s.app_state}")
    if waited > s.ready_timeout_s:
        return RolloutDecision(-1, -1, RolloutPhase.ROLLING_BACK,
                               f"rolling back: Serve had not finished the update {waited:.0f} s after it began "
                               f"(ready_timeout_s {s.ready_timeout_s:.0f})")
    if s.app_state == "RUNNING":
        return RolloutDecision(-1, -1, RolloutPhase.DONE, "every replica runs the new version (updated in place by Serve)")
    return RolloutDecision(-1, -1, RolloutPhase.ROLLING,
                           f"Serve is replacing the replicas one by one (ready_timeout_s {s.ready_timeout_s:.0f})")


@dataclass(frozen=True)
class DeployChanges:
    """What a deploy onto a running cluster changes, and so how it is carried out."""

    full_reason: str | None  # why everything redeploys (the front doors restart); None: only models changed
    roll: tuple[str, ...] = ()  # models rolled replica by replica
    in_place: tuple[str, ...] = ()  # changed autoscaled or disaggregated models: Serve updates them in place
    unchanged: tuple[str, ...] = ()


def deploy_changes(old: ClusterSpec, new: ClusterSpec) -> DeployChanges:
    """Compare the deployed spec with the one being deployed. Only model sections roll: a change
    anywhere else (serve, cache, topology), or a model added or removed, redeploys everything."""
    def rest(spec: ClusterSpec) -> dict:
        return spec.model_dump(exclude={"models": True, "serve": {"rollout"}})

    old_names, new_names = [m.name for m in old.models], [m.name for m in new.models]
    if old_names != new_names:
        return DeployChanges(f"the models changed ({', '.join(old_names)} -> {', '.join(new_names)})")
    if rest(old) != rest(new):
        changed = sorted(k for k, v in rest(new).items() if rest(old).get(k) != v)
        return DeployChanges(f"the {', '.join(changed)} section(s) changed")
    roll, in_place, unchanged = [], [], []
    for o, n in zip(old.models, new.models):
        if o == n:
            unchanged.append(n.name)
        elif old.plans_placement(o) or new.plans_placement(n):
            return DeployChanges(f"model {n.name} is placed by the planner, whose plan covers every model")
        elif all(m.autoscaling is None and m.disaggregation is None for m in (o, n)):
            roll.append(n.name)
        else:  # the policy's replicas, or a disaggregated model's two pools: Serve updates them
            in_place.append(n.name)
    return DeployChanges(None, tuple(roll), tuple(in_place), tuple(unchanged))

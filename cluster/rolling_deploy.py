"""`hbmserve deploy` onto a running cluster: roll what changed, keep the rest running.

The deployed spec, each model's Serve application and the shared token are kept in Ray's KV
(core/rollout_records.py). A deploy whose only changes are in model sections leaves the front
doors and every unchanged model alone (autoscale/rollout.py `deploy_changes`):

* a changed model with a fixed replica count is rolled replica by replica: its new version runs
  as a second Serve application (`<model>@<generation>`) beside the old one; the front doors
  route to both, since they route by model. Each step's counts come from
  autoscale/rollout.py `decide`, which keeps both versions within the old fleet plus
  `serve.rollout.max_surge`, and rolls back a new version that fails. Serve's own in-place
  rolling update stops at a broken version but does not roll back: the old replicas it
  stopped stay gone until the next deploy.
* a changed autoscaled model is updated in place by Serve, so that its policy and standbys stay
  with the one application it has (`update_in_place`); if the new version fails, the old one is
  handed back to Serve, which restores the replicas it replaced.

Anything else redeploys everything, as the first deploy does (ray_cluster.deploy).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable

from hbmserve.autoscale.rollout import RolloutDecision, RolloutPhase, RolloutSnapshot, decide
from hbmserve.core.config import ClusterSpec, ModelSpec
from hbmserve.core.rollout_records import DeployedRecord, RolloutRecord, RolloutStep
from hbmserve.deployments.wire.names import engine_deployment_name

log = logging.getLogger("hbmserve.rollout")

POLL_S = 0.5
LIVE = ("STARTING", "UPDATING", "RECOVERING", "RUNNING", "PENDING_MIGRATION")  # replicas that hold or await GPUs


def next_app(model: str, current: str) -> str:
    """The application a model's next version runs as: `<model>@2`, `<model>@3`, ..."""
    generation = int(current.rpartition("@")[2]) if current.startswith(f"{model}@") else 1
    return f"{model}@{generation + 1}"


@dataclass
class _Version:
    """One version of the model being rolled: its application and the replicas asked of it."""

    app: str
    spec: ClusterSpec
    model: ModelSpec
    asked: int


def _counts(app: str, model: ModelSpec) -> tuple[dict[str, int], str | None]:
    """Replica states of the model's engine deployment in `app`, and a failure message if the
    application failed (None while it is deploying or running)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return {}, None
    dep = status.deployments.get(engine_deployment_name(model))
    states = {str(getattr(s, "value", s)): n for s, n in (dep.replica_states.items() if dep else ())}
    app_state = str(getattr(status.status, "value", status.status))
    failed = app_state in ("DEPLOY_FAILED", "UNHEALTHY")
    # The deployment's message has the replicas' error (a constructor's traceback); the app's only names it.
    return states, _summary((dep.message if dep else "") or status.message or app_state) if failed else None


def _summary(message: str) -> str:
    """Serve's failure message in one line: its first sentence and the exception its traceback
    ends with."""
    head, _, trace = message.partition("Error:\n")
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    first = " ".join(head.split()).split(". ")[0]
    return f"{first}: {lines[-1]}"[:400] if lines else first[:400]


def _actors(app: str, model: ModelSpec) -> int:
    """Live replica actors of the model in `app`. Serve drops a deleted application's replicas
    from its status while they still drain and hold their GPUs; Ray still lists their actors
    (named `SERVE_REPLICA::<app>#<deployment>#<id>`)."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#{engine_deployment_name(model)}#"
    return sum(1 for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


def _serving(app: str) -> int:
    """Replicas of `app` announcing an endpoint the front doors route to."""
    from hbmserve.deployments.wire.records_store import live_endpoints

    return sum(1 for ep in live_endpoints() if ep.app == app and not ep.draining)


def _ask(v: _Version, token: str, replicas: int) -> None:
    """Ask Serve for `replicas` of this version; 0 deletes its application (Serve refuses a fixed
    count of 0), whose replicas then drain like any others."""
    from ray import serve

    from hbmserve.deployments.apps.model_app import build_model_app

    if replicas == 0:
        if serve.status().applications.get(v.app) is not None:
            serve.delete(v.app, _blocking=False)
    else:
        serve_run(build_model_app(v.spec, v.model, token, replicas=replicas), v.app)
    v.asked = replicas


def _snapshot(old: _Version, new: _Version, spec: ClusterSpec, waiting_since: float,
              rolling_back: bool) -> tuple[RolloutSnapshot, int]:
    """The rollout as Serve, Ray's actors and the replicas' announcements show it, with the asks
    not yet visible counted as what was asked: a replica asked to stop holds its GPUs until its
    actor is gone. Also returns the replicas of both versions held now, stopping ones included."""
    old_states, _ = _counts(old.app, old.model)
    new_states, failure = _counts(new.app, new.model)
    old_live, new_live = (sum(s.get(k, 0) for k in LIVE) for s in (old_states, new_states))
    ready = min(new_states.get("RUNNING", 0), _serving(new.app), new.asked)
    old_running = min(old_live, old.asked)
    snap = RolloutSnapshot(
        target=old.model.replicas, max_surge=spec.serve.rollout.max_surge,
        ready_timeout_s=spec.serve.rollout.ready_timeout_s,
        old_running=old_running, old_standby=0,
        old_stopping=max(old_states.get("STOPPING", 0) + max(0, old_live - old.asked),
                         _actors(old.app, old.model) - old_running),
        new_ready=ready, new_starting=max(0, new.asked - ready), new_failure=failure,
        waiting_since=waiting_since,
        new_stopping=max(new_states.get("STOPPING", 0) + max(0, new_live - new.asked),
                         _actors(new.app, new.model) - new.asked),
        rolling_back=rolling_back)
    held = snap.old_running + snap.old_stopping + snap.new_ready + snap.new_starting + snap.new_stopping
    return snap, held


def roll_model(deployed: DeployedRecord, new_spec: ClusterSpec, name: str,
               on_step: Callable[[RolloutRecord], None]) -> RolloutRecord:
    """Roll model `name` to its section in `new_spec`; returns the ended record (phase done or
    rolled_back). `on_step` gets the record after every step that changed an ask."""
    from ray import serve

    old_spec = ClusterSpec.model_validate_json(deployed.spec_json)
    token = deployed.internal_token
    old_app = deployed.apps.get(name, name)
    old = _Version(old_app, old_spec, old_spec.model(name), old_spec.model(name).replicas)
    new = _Version(next_app(name, old_app), new_spec, new_spec.model(name), 0)
    if serve.status().applications.get(new.app) is not None:  # left by an interrupted rollout
        serve.delete(new.app)
    started, wall = time.monotonic(), time.time()
    record = RolloutRecord(model=name, from_app=old.app, to_app=new.app, phase=RolloutPhase.ROLLING.value,
                           started_at=wall, at=wall, target=old.model.replicas, max_in_use=old.model.replicas,
                           reason="rolling out")
    on_step(record)
    waiting_since, rolling_back = started, False
    while True:
        snap, in_use = _snapshot(old, new, new_spec, waiting_since, rolling_back)
        d: RolloutDecision = decide(snap, time.monotonic())
        rolling_back = d.phase in (RolloutPhase.ROLLING_BACK, RolloutPhase.ROLLED_BACK)
        record = replace(record, phase=d.phase.value, at=time.time(), reason=d.reason,
                         max_in_use=max(record.max_in_use, in_use))
        ended = d.phase in (RolloutPhase.DONE, RolloutPhase.ROLLED_BACK)
        if ended or (d.old_replicas, d.new_replicas) != (old.asked, new.asked):
            step = RolloutStep(at=record.at, old_replicas=d.old_replicas, new_replicas=d.new_replicas,
                               old_running=snap.old_running, new_ready=snap.new_ready, reason=d.reason)
            record = replace(record, steps=(*record.steps, step))
            log.info("rollout of %s: %s", name, d.reason)
            if ended:  # the version that lost goes
                _ask(old if d.phase is RolloutPhase.DONE else new, token, 0)
            on_step(record)
        if ended:
            return record
        if d.new_replicas > new.asked:
            waiting_since = time.monotonic()
        if d.new_replicas != new.asked:
            _ask(new, token, d.new_replicas)
        if d.old_replicas != old.asked:
            _ask(old, token, d.old_replicas)
        time.sleep(POLL_S)


def _app_state(app: str) -> tuple[str, str | None]:
    """The application's status and failure message (None unless it failed)."""
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return "NOT_STARTED", None
    state = str(getattr(status.status, "value", status.status))
    messages = [d.message for d in status.deployments.values() if d.message] + [status.message or state]
    return state, _summary(messages[0]) if state in ("DEPLOY_FAILED", "UNHEALTHY") else None


def update_in_place(deployed: DeployedRecord, new_spec: ClusterSpec, name: str,
                    on_step: Callable[[RolloutRecord], None]) -> RolloutRecord:
    """Hand an autoscaled model's new version to Serve, which replaces its replicas in its one
    application; hand the old version back if the new one fails (autoscale/rollout.py
    `decide_in_place`). Returns the ended record."""
    from hbmserve.autoscale.rollout import InPlaceSnapshot, decide_in_place
    from hbmserve.deployments.apps.model_app import build_model_app

    old_spec = ClusterSpec.model_validate_json(deployed.spec_json)
    app = deployed.apps.get(name, name)
    model = new_spec.model(name)
    wall = time.time()
    record = RolloutRecord(model=name, from_app=app, to_app=app, phase=RolloutPhase.ROLLING.value, started_at=wall,
                           at=wall, target=_actors(app, model), max_in_use=_actors(app, model),
                           reason="updating in place")

    def hand_over(spec: ClusterSpec) -> None:
        serve_run(build_model_app(spec, spec.model(name), deployed.internal_token), app)

    hand_over(new_spec)
    since, rolling_back, reason = time.monotonic(), False, None
    while True:
        state, failure = _app_state(app)
        d = decide_in_place(InPlaceSnapshot(app_state=state, failure=failure, since=since,
                                            ready_timeout_s=new_spec.serve.rollout.ready_timeout_s,
                                            rolling_back=rolling_back), time.monotonic())
        record = replace(record, phase=d.phase.value, at=time.time(), reason=d.reason,
                         max_in_use=max(record.max_in_use, _actors(app, model)))
        if d.reason != reason:
            reason = d.reason
            record = replace(record, steps=(*record.steps, RolloutStep(
                at=record.at, old_replicas=-1, new_replicas=-1, old_running=-1, new_ready=-1, reason=d.reason)))
            log.info("in-place update of %s: %s", name, d.reason)
            on_step(record)
        if d.phase in (RolloutPhase.DONE, RolloutPhase.ROLLED_BACK):
            return record
        if d.phase is RolloutPhase.ROLLING_BACK and not rolling_back:
            hand_over(old_spec)
            since, rolling_back = time.monotonic(), True
        time.sleep(POLL_S)


def serve_run(application, app: str) -> None:
    """Deploy without waiting for it to run: the rollout watches it itself."""
    from ray import serve

    serve._run(application, name=app, route_prefix=None, _blocking=False)  # noqa: SLF001 - the public run waits


@dataclass(frozen=True)
class UpdateResult:
    """What a deploy onto a running cluster did."""

    url: str  # the front doors', unchanged
    rollouts: tuple[RolloutRecord, ...]
    in_place: tuple[str, ...]
    unchanged: tuple[str, ...]

    @property
    def rolled_back(self) -> tuple[RolloutRecord, ...]:
        return tuple(r for r in self.rollouts if r.phase == RolloutPhase.ROLLED_BACK.value)


def update(spec: ClusterSpec, on_step: Callable[[RolloutRecord], None]) -> UpdateResult | str:
    """Deploy `spec` onto the running deployment by changing only what changed; or, when that is
    not possible, say why (the caller then redeploys everything)."""
    from ray import serve

    from hbmserve.autoscale.rollout import deploy_changes
    from hbmserve.cluster.ray_cluster import _deploy_warm_tier, front_doors
    from hbmserve.deployments.wire.names import FRONT_DOOR_APP
    from hbmserve.deployments.wire.records_store import latest_deployed, publish_deployed, publish_rollout

    deployed = latest_deployed()
    if deployed is None:
        return "nothing is deployed yet"
    door = serve.status().applications.get(FRONT_DOOR_APP)
    if door is None or str(getattr(door.status, "value", door.status)) != "RUNNING":
        return "the front doors are not running"
    old = ClusterSpec.model_validate_json(deployed.spec_json)
    changes = deploy_changes(old, spec)
    if changes.full_reason:
        return changes.full_reason
    sections = {m.name: m for m in spec.models if m.name in changes.unchanged}

    def publish(apps: dict[str, str]) -> DeployedRecord:
        """What is deployed now: the new sections of the models done, the old of the others."""
        models = [sections.get(m.name, m) for m in old.models]
        record = DeployedRecord(spec_json=spec.model_copy(update={"models": models}).model_dump_json(),
                                internal_token=deployed.internal_token, apps=apps, at=time.time())
        publish_deployed(record)
        return record

    def step(record: RolloutRecord) -> None:
        publish_rollout(record)
        on_step(record)

    done = []
    for name in changes.in_place + changes.roll:
        record = (update_in_place if name in changes.in_place else roll_model)(deployed, spec, name, step)
        done.append(record)
        if record.phase == RolloutPhase.DONE.value:
            sections[name] = spec.model(name)
            deployed = publish({**deployed.apps, name: record.to_app})
    if changes.in_place:  # the warm tier plans from the autoscaled models' sections
        _deploy_warm_tier(ClusterSpec.model_validate_json(deployed.spec_json))
    doors = front_doors()
    return UpdateResult(doors[0].url if doors else "", tuple(done), changes.in_place, changes.unchanged)

"""What a deploy leaves behind for the next one, and what a rollout tells status and the dashboard.

* `DeployedRecord`: the cluster spec now deployed, the Serve application that serves each model
  and the token the front doors and replicas share. Written by `hbmserve deploy`
  (cluster/ray_cluster.py); the next deploy reads it to roll only the models that changed,
  without restarting the front doors. It holds a secret, so it lives in Ray's internal KV only,
  which Ray's token authentication guards (the replicas' constructor arguments hold the same).
* `RolloutRecord`: one model's rollout, every step with its reason (cluster/rolling_deploy.py writes it,
  autoscale/rollout.py decides the steps). Read by `hbmserve status` and the ops dashboard; the
  last one per model stays after it ends, so an operator sees how the last rollout went.

Same rules as core/records.py: frozen, one JSON form, version-tolerant readers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hbmserve.core.records import Record


@dataclass(frozen=True, kw_only=True)
class DeployedRecord(Record):
    spec_json: str  # ClusterSpec.model_dump_json() of what is deployed
    internal_token: str
    apps: dict[str, str]  # model name -> the Serve application serving it
    at: float  # wall clock of the deploy or rollout that wrote it


@dataclass(frozen=True, kw_only=True)
class RolloutStep(Record):
    at: float  # wall clock
    old_replicas: int  # what was asked of Serve
    new_replicas: int
    old_running: int  # what ran when it was decided
    new_ready: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class RolloutRecord(Record):
    model: str
    from_app: str
    to_app: str
    phase: str  # autoscale/rollout.py RolloutPhase value
    started_at: float  # wall clock
    at: float  # wall clock of the last step
    target: int  # the fleet's replicas
    max_in_use: int  # most replicas of both versions held at once, stopping ones included
    reason: str  # the last step's
    steps: tuple[RolloutStep, ...] = field(default=())  # the steps that changed an ask, oldest first

    @property
    def ended(self) -> bool:
        return self.phase in ("done", "rolled_back")

"""The rollout step (autoscale/rollout.py): played against a small model of Serve in which a replica
asked for serves some ticks later and a retired one holds its GPUs until its drain ends."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hbmserve.autoscale.rollout import DeployChanges, RolloutPhase, RolloutSnapshot, decide


@dataclass
class Fleet:
    """Replica counts per version, with start and drain delays in ticks, as Serve carries out the asks."""

    start_ticks: int
    drain_ticks: int
    old: list[str] = field(default_factory=list)  # "active" | "standby"
    new_ready: int = 0
    starting: list[int] = field(default_factory=list)  # ticks left per new replica starting
    stopping: list[int] = field(default_factory=list)  # ticks left per old replica draining
    new_stopping: list[int] = field(default_factory=list)
    asked_at: float = 0.0

    def in_use(self) -> int:
        return len(self.old) + len(self.stopping) + self.new_ready + len(self.starting) + len(self.new_stopping)

    def apply(self, old: int, new: int, now: float, broken: bool) -> None:
        while len(self.old) > old:  # Serve retires a standby first here, as the policy asks
            self.old.remove("standby" if "standby" in self.old else "active")
            self.stopping.append(self.drain_ticks)
        while len(self.old) < old:
            self.old.append("active")
        have = self.new_ready + len(self.starting)
        if new > have:
            self.starting += [self.start_ticks] * (new - have)
            self.asked_at = now
        while self.new_ready + len(self.starting) > new:
            if self.starting:
                self.starting.pop()
            else:
                self.new_ready -= 1
            self.new_stopping.append(self.drain_ticks)
        self.starting = [t - 1 for t in self.starting]
        if not broken:
            self.new_ready += sum(1 for t in self.starting if t <= 0)
            self.starting = [t for t in self.starting if t > 0]
        self.stopping = [t - 1 for t in self.stopping if t > 1]
        self.new_stopping = [t - 1 for t in self.new_stopping if t > 1]

    def snapshot(self, target: int, surge: int, failure: str | None, rolling_back: bool) -> RolloutSnapshot:
        return RolloutSnapshot(target=target, max_surge=surge, ready_timeout_s=30.0, old_running=len(self.old),
                               old_standby=self.old.count("standby"), old_stopping=len(self.stopping),
                               new_ready=self.new_ready, new_starting=len(self.starting), new_failure=failure,
                               waiting_since=self.asked_at, new_stopping=len(self.new_stopping),
                               rolling_back=rolling_back)


def play(target: int, surge: int = 0, standbys: int = 0, broken: bool = False, fail_at: float | None = None,
         ticks: int = 400) -> tuple[RolloutPhase, Fleet, list[str], int]:
    """One tick a second until the rollout ends; returns the end phase, the fleet, the reasons and
    the most replicas ever in use."""
    fleet = Fleet(start_ticks=5, drain_ticks=3, old=["active"] * (target - standbys) + ["standby"] * standbys)
    reasons, most, rolling_back = [], fleet.in_use(), False
    for now in range(ticks):
        failure = "replica crashed" if fail_at is not None and now >= fail_at and not rolling_back else None
        d = decide(fleet.snapshot(target, surge, failure, rolling_back), float(now))
        rolling_back = d.phase in (RolloutPhase.ROLLING_BACK, RolloutPhase.ROLLED_BACK)
        reasons.append(d.reason)
        if d.phase in (RolloutPhase.DONE, RolloutPhase.ROLLED_BACK):
            return d.phase, fleet, reasons, most
        fleet.apply(d.old_replicas, d.new_replicas, float(now), broken)
        most = max(most, fleet.in_use())
    raise AssertionError(f"no end in {ticks} ticks: {reasons[-3:]}")


@pytest.mark.parametrize("target,surge", [(1, 0), (2, 0), (4, 0), (3, 1), (4, 2)])
def test_rolls_every_replica_and_never_exceeds_the_fleet_plus_surge(target, surge):
    phase, fleet, reasons, most = play(target, surge)
    assert phase is RolloutPhase.DONE
    assert fleet.new_ready == target and not fleet.old and not fleet.stopping
    assert most <= target + surge
    if surge:  # the surge is used: a new replica starts before any old one drains
        assert reasons[0].startswith(f"starting {surge} new")


def test_without_surge_an_old_replica_drains_before_the_first_new_one_starts():
    _, _, reasons, _ = play(2)
    assert reasons[0].startswith("draining an old replica")
    assert "waiting for 1 old replica(s) to drain" in reasons[1]
    assert any(r.startswith("starting 1 new replica") for r in reasons)


def test_a_lone_replica_says_the_model_goes_dark_without_a_surge():
    _, _, reasons, _ = play(1)
    assert "no serving replica until the new one is up" in reasons[0]
    _, _, reasons, _ = play(1, surge=1)
    assert all("no serving replica" not in r for r in reasons)


def test_standbys_are_retired_before_any_active_replica():
    _, _, reasons, _ = play(3, standbys=1)
    assert reasons[0].startswith("retiring an old standby")


def test_a_new_version_that_never_serves_rolls_back_after_the_ready_timeout():
    phase, fleet, reasons, most = play(2, broken=True)
    assert phase is RolloutPhase.ROLLED_BACK
    assert fleet.old == ["active", "active"] and fleet.new_ready == 0 and not fleet.starting
    assert most <= 2
    assert any("not serving 31 s after it was asked for" in r for r in reasons)


def test_a_failed_new_version_rolls_back_at_once_and_keeps_the_gpus_inside_the_fleet():
    phase, fleet, reasons, most = play(3, fail_at=12)
    assert phase is RolloutPhase.ROLLED_BACK
    assert len(fleet.old) == 3 and fleet.new_ready == 0
    assert most <= 3
    back = [r for r in reasons if r.startswith("rolling back")]
    assert back[0] == "rolling back: replica crashed; restoring 3 old replica(s)"
    assert reasons[-1] == "the old version serves on 3 replica(s) again"


def test_the_decision_is_a_function_of_the_snapshot_and_now():
    s = RolloutSnapshot(target=2, max_surge=0, ready_timeout_s=60, old_running=1, old_standby=0, old_stopping=0,
                        new_ready=0, new_starting=1, new_failure=None, waiting_since=100.0)
    assert decide(s, 150.0) == decide(s, 150.0)
    assert decide(s, 150.0).phase is RolloutPhase.ROLLING
    assert decide(s, 161.0).phase is RolloutPhase.ROLLING_BACK


def _spec(**changes):
    from hbmserve.core.config import parse_cluster_spec

    model = {"name": "a", "source": "sim", "engine": "sim", "replicas": 2, "sim": {"speedup": 2.0}}
    scaled = {"name": "b", "source": "sim", "engine": "sim",
              "autoscaling": {"min_replicas": 1, "max_replicas": 3}}
    doc = {"serve": {"http": {"port": 18000}}, "models": [model, scaled]}
    for path, value in changes.items():
        *where, key = path.split(".")
        node = doc
        for part in where:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[key] = value
    return parse_cluster_spec(doc)


def test_only_changed_model_sections_roll_and_the_rest_stays():
    from hbmserve.autoscale.rollout import deploy_changes

    old = _spec()
    assert deploy_changes(old, _spec()) == DeployChanges(None, (), (), ("a", "b"))
    assert deploy_changes(old, _spec(**{"models.0.sim.speedup": 3.0})) == DeployChanges(None, ("a",), (), ("b",))
    both = deploy_changes(old, _spec(**{"models.0.replicas": 3, "models.1.autoscaling.max_replicas": 4}))
    assert both == DeployChanges(None, ("a",), ("b",), ())
    # The rollout's own knobs roll nothing and restart nothing.
    assert deploy_changes(old, _spec(**{"serve.rollout.max_surge": 1})).full_reason is None
    # A model made disaggregated (two pools, no one replica count to step): Serve updates it in place.
    split = _spec(**{"models.0.replicas": 1, "models.0.disaggregation": {"connector": "sim", "decode": {"replicas": 2}}})
    assert deploy_changes(old, split) == DeployChanges(None, (), ("a",), ("b",))


def test_a_change_outside_the_models_or_to_their_set_redeploys_everything_and_says_why():
    from hbmserve.autoscale.rollout import deploy_changes

    old = _spec()
    assert deploy_changes(old, _spec(**{"serve.http.port": 18001})).full_reason == "the serve section(s) changed"
    fewer = old.model_copy(update={"models": old.models[:1]})
    assert deploy_changes(old, fewer).full_reason == "the models changed (a, b -> a)"


def test_an_in_place_update_ends_when_serve_runs_the_new_version_and_rolls_back_when_it_fails():
    from hbmserve.autoscale.rollout import InPlaceSnapshot, decide_in_place

    def at(**kw) -> RolloutPhase:
        s = InPlaceSnapshot(**{"app_state": "DEPLOYING", "failure": None, "since": 0.0,
                               "ready_timeout_s": 60.0, **kw})
        return decide_in_place(s, 30.0)

    assert at().phase is RolloutPhase.ROLLING
    assert at(app_state="RUNNING").phase is RolloutPhase.DONE
    failed = at(app_state="DEPLOY_FAILED", failure="constructor raised")
    assert failed.phase is RolloutPhase.ROLLING_BACK and failed.reason == "rolling back: constructor raised"
    assert at(since=-31.0).phase is RolloutPhase.ROLLING_BACK  # 61 s: past ready_timeout_s
    assert at(rolling_back=True, app_state="DEPLOYING").phase is RolloutPhase.ROLLING_BACK
    assert at(rolling_back=True, app_state="RUNNING").phase is RolloutPhase.ROLLED_BACK

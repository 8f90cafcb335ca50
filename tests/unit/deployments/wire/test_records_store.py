"""deployments/wire/records_store.py, over an in-memory stand-in for Ray's internal KV (no cluster).

Also the producers and consumers around it: the policy publishes a DecisionRecord, replicas
read their role from it, renewed records (endpoints, held counts) stop counting once their
writer stops renewing them, a replica's `info()` is a valid ReplicaInfo. And a guard that no
other module reads these records by key.
"""

from __future__ import annotations

import ast
import json
import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from hbmserve.core.records import (DecisionRecord, LoadReport, ObservedRank, PlacementReport, RecordError,
                                   ReplicaEndpoint, ReplicaInfo, ReplicaRoles)
from hbmserve.core.door_records import IngressInfo
from hbmserve.core.scaling import ReplicaState, Tier
from hbmserve.deployments.wire import records_store as store
internal_kv = pytest.importorskip("ray.experimental.internal_kv", reason="ray not installed")
ray_metrics = pytest.importorskip("ray.util.metrics", reason="ray not installed")

ROOT = Path(__file__).resolve().parents[4]


class FakeGauge:
    values: dict[str, dict[tuple, float]] = {}

    def __init__(self, name, description="", tag_keys=()):
        self.name = name
        FakeGauge.values.setdefault(name, {})

    def set(self, value, tags=None):
        FakeGauge.values[self.name][tuple(sorted((tags or {}).items()))] = value


@pytest.fixture
def kv(monkeypatch):
    """Ray's internal KV as a dict: {(namespace, key): bytes}."""
    data: dict[tuple[str, str], bytes] = {}

    def name(key) -> str:  # Ray takes str or bytes keys and lists bytes
        return key.decode() if isinstance(key, bytes) else key

    def put(key, value, overwrite=True, namespace=None):
        data[(namespace, name(key))] = value.encode() if isinstance(value, str) else value

    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_put", put)
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key, namespace=None: data.get((namespace, name(key))))
    monkeypatch.setattr(internal_kv, "_internal_kv_del",
                        lambda key, namespace=None: data.pop((namespace, name(key)), None))
    monkeypatch.setattr(internal_kv, "_internal_kv_list", lambda prefix, namespace=None: [
        k.encode() for ns, k in data if ns == namespace and k.startswith(prefix)])
    monkeypatch.setattr(ray_metrics, "Gauge", FakeGauge)
    FakeGauge.values = {}
    return data


def record(**overrides) -> DecisionRecord:
    fields = dict(at=5.0, target_active=2, target_standby={Tier.HOT: 1}, active_replicas=("a", "b"),
                  standby_replicas=("c",), held_at_ingress=3, refused_rps_at_ingress=0.5, startup_s={Tier.WARM: 20.0},
                  burst_hold=2, not_in_time=1, prior_source="past.csv (40 buckets of 180 s)", prior_hold=2,
                  reason="scale up", serve_target=3)
    return DecisionRecord(**(fields | overrides))


def test_a_published_decision_reads_back_typed_and_sets_the_gauges(kv):
    assert store.latest_decision("app", "engine") is None  # the policy never ran
    store.DecisionLog().publish("app", "engine", record())
    assert store.latest_decision("app", "engine") == record()
    assert store.latest_decision("other", "engine") is None
    tags = (("application", "app"), ("deployment", "engine"))
    gauges = {name: series[tags] for name, series in FakeGauge.values.items() if tags in series}
    assert gauges == {"hbmserve_autoscale_target_replicas": 3, "hbmserve_autoscale_active_replicas": 2,
                      "hbmserve_autoscale_standby_replicas": 1, "hbmserve_autoscale_held_requests": 3,
                      "hbmserve_autoscale_refused_rps": 0.5, "hbmserve_autoscale_burst_hold_replicas": 2,
                      "hbmserve_autoscale_not_in_time_replicas": 1, "hbmserve_autoscale_prior_hold_replicas": 2}

    def by(name: str, key: str) -> dict[str, float]:
        return {dict(t)[key]: v for t, v in FakeGauge.values[name].items()}

    # Three running (a, b active; c standby) for a Serve target of 3: nobody starting or draining.
    assert by("hbmserve_replicas", "role") == {"starting": 0, "active": 2, "standby": 1, "draining": 0, "warm": 0}
    assert by("hbmserve_autoscale_last_action", "action") == {"up": 0, "down": 0, "hold": 0, "other": 1}
    store.DecisionLog().publish("app", "engine", record(reason="hold 2 (steady): ..."))
    assert by("hbmserve_autoscale_last_action", "action") == {"up": 0, "down": 0, "hold": 1, "other": 0}


@pytest.mark.parametrize("active, standby, target, warm, roles", [
    (("a",), (), 3, 0, ReplicaRoles(starting=2, active=1)),  # Serve brings two more up
    (("a",), ("b", "c"), 1, 0, ReplicaRoles(active=1, draining=2)),  # two surplus, out of rotation
    (("a",), ("b", "c"), 2, 4, ReplicaRoles(active=1, standby=1, draining=1, warm=4)),
])
def test_replicas_by_role_from_one_decision(active, standby, target, warm, roles):
    decision = record(active_replicas=active, standby_replicas=standby, serve_target=target,
                      target_standby={Tier.HOT: len(standby), Tier.WARM: warm})
    got = store.decision_roles(decision)
    assert got == roles
    # every running replica is in exactly one role
    assert got.active + got.standby + got.draining == len(active) + len(standby)


def test_a_malformed_stored_decision_is_an_error_naming_its_key(kv):
    kv[("hbmserve", "autoscale/app/engine")] = b'{"at": 1, "target_active": "two"}'
    with pytest.raises(RecordError, match="Ray KV hbmserve/autoscale/app/engine: .*'target_active'"):
        store.latest_decision("app", "engine")


def _demand(app: str = "app") -> tuple[int, float]:
    d = store.ingress_demand(app, "engine")
    return d.held, d.refused_rps


def test_ingress_demand_sums_over_front_doors_and_dies_with_its_writer(kv, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(store.time, "time", lambda: clock[0])
    assert _demand() == (0, 0.0)  # nobody holds or refuses anything
    store.publish_demand("app", "engine", "door-a", 7, 0.5)
    store.publish_demand("app", "engine", "door-b", 2, 0.25)
    store.publish_demand("other", "engine", "door-a", 5, 9.0)
    assert _demand() == (9, 0.75)
    clock[0] += store.TTL_S / 2
    store.publish_demand("app", "engine", "door-b", 3, 0.0)  # door-b renews; door-a died
    clock[0] += store.TTL_S / 2 + 0.1
    assert _demand() == (3, 0.0)
    assert ("hbmserve", "demand/app/engine/door-a") not in kv  # the dead writer's record is gone
    kv[("hbmserve", "demand/app/engine/door-c")] = b"lots"  # malformed: skipped, not counted
    assert _demand() == (3, 0.0)


def test_endpoints_are_listed_while_renewed_and_withdrawn_on_stop(kv, monkeypatch):
    clock = [50.0]
    monkeypatch.setattr(store.time, "time", lambda: clock[0])

    def ep(replica: str) -> ReplicaEndpoint:
        return ReplicaEndpoint(app="m", deployment="engine-m", replica=replica, model="m",
                               url=f"http://127.0.0.1:{4000 + len(replica)}", node_id="n", at=clock[0])

    store.publish_endpoint(ep("a"))
    store.publish_endpoint(ep("bb"))
    assert sorted(e.replica for e in store.live_endpoints()) == ["a", "bb"]
    store.remove_endpoint(ep("a"))  # a clean stop
    clock[0] += store.TTL_S + 1  # bb crashed: no renewal
    store.publish_endpoint(ep("ccc"))
    assert [e.replica for e in store.live_endpoints()] == ["ccc"]


def test_outside_a_cluster_nothing_is_held(monkeypatch):
    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: False)
    assert _demand() == (0, 0.0)


def test_the_policy_publishes_what_it_decided_and_replicas_read_their_role(kv):
    """Through the policy object Serve calls: the record kept in policy_state is the one in the
    KV, and a replica listed there reads itself active."""
    from hbmserve.deployments.control import autoscaling as sa
    from hbmserve.deployments.replica.engine_replica import EngineReplica

    ctx = SimpleNamespace(app_name="app", deployment_name="engine", current_time=100.0,
                          running_replicas=["r1", "r2"], raw_metrics={}, aggregated_metrics={},
                          current_num_replicas=2, target_num_replicas=2, policy_state={})
    target, state = sa.HbmServeAutoscalingPolicy(min_replicas=1, hot_standby_min=0, hot_standby_max=0)(ctx)
    published = store.latest_decision("app", "engine")
    assert published == sa.decision_in(state) and published.serve_target == target
    assert published.active_replicas and set(published.active_replicas) <= {"r1", "r2"}

    def role(app: str, replica: str) -> ReplicaState:
        me = SimpleNamespace(model=SimpleNamespace(autoscaling=object()),
                             endpoint=SimpleNamespace(app=app, deployment="engine", replica=replica))
        me._decision_deployment = lambda: EngineReplica._decision_deployment(me)
        return EngineReplica._role(me)

    assert role("app", published.active_replicas[0]) is ReplicaState.ACTIVE
    assert role("app", "not-listed") is ReplicaState.STANDBY
    assert role("never-decided", "r1") is ReplicaState.ACTIVE  # before the policy's first decision
    # A planned replica is one slot deployment of several; its model's one decision names it.
    from hbmserve.deployments.replica.placed_replica import PlacedEngineReplica

    slot = SimpleNamespace(model=SimpleNamespace(name="org/m"), endpoint=SimpleNamespace(deployment="engine-org-m-r1"))
    assert PlacedEngineReplica._decision_deployment(slot) == "engine-org-m"


def test_a_new_controller_goes_on_from_the_envelope_the_last_one_saved(kv):
    """Serve keeps policy_state in the controller's memory: a restarted controller hands the
    policy an empty one. The envelope comes back from the KV store, not from zero (issue 38)."""
    from hbmserve.deployments.control import autoscaling as sa

    def ctx(now: float, policy_state: dict):
        return SimpleNamespace(app_name="app", deployment_name="engine", current_time=now, running_replicas=["r1"],
                               raw_metrics={}, aggregated_metrics={}, current_num_replicas=1, target_num_replicas=1,
                               policy_state=policy_state)

    fields = dict(min_replicas=1, max_replicas=8, hot_standby_min=0, hot_standby_max=0, replica_capacity_rps=2.0)
    learnt = sa.HbmServeAutoscalingPolicy(**fields, prior_rises_rps=[1.0, 9.0])  # as JSON hands a prior over
    _, state = learnt(ctx(100.0, {}))
    assert store.saved_envelope("app", "engine")["rises_rps"] == [1.0, 9.0]
    held = sa.decision_in(state).burst_hold
    assert held >= 3
    # A new controller, configured without the prior: its first decision holds the same replicas.
    _, fresh = sa.HbmServeAutoscalingPolicy(**fields)(ctx(105.0, {}))
    assert sa.decision_in(fresh).burst_hold == held
    assert list(fresh[sa.POLICY_STATE_KEY]["envelope"]["rises_rps"]) == [1.0, 9.0]
    # Back a day later (a redeploy): the rises stay, the bucket clock starts again.
    _, later = sa.HbmServeAutoscalingPolicy(**fields)(ctx(100.0 + 86_400, {}))
    assert list(later[sa.POLICY_STATE_KEY]["envelope"]["rises_rps"]) == [1.0, 9.0]
    assert later[sa.POLICY_STATE_KEY]["envelope"]["bucket_started_at"] > 86_400
    # Without a save or a prior, a controller starts with no memory.
    _, none = sa.HbmServeAutoscalingPolicy(**fields)(SimpleNamespace(**{**vars(ctx(100.0, {})), "app_name": "other"}))
    assert sa.decision_in(none).burst_hold == 0


def test_a_replica_info_reply_is_a_valid_replica_info(monkeypatch):
    import ray
    from ray import serve

    from hbmserve.core.config import ModelSpec
    from hbmserve.deployments.replica.placed_replica import PlacedEngineReplica
    from hbmserve.deployments.replica.engine_replica import ENGINE_SERVERS, EngineReplica
    from hbmserve.deployments.replica.standby_sleep import StandbySleep

    monkeypatch.setattr(serve, "get_replica_context",
                        lambda: SimpleNamespace(replica_id=SimpleNamespace(unique_id="abc")))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "n" * 56))
    model = ModelSpec.model_validate({"name": "m", "source": "sim", "engine": "sim",
                                      "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b"}})

    def built(cls, **attrs):
        """An instance without its constructor (which would start an engine), nor its async
        __del__ (which would stop one)."""
        quiet = type(cls.__name__, (cls,), {"__del__": lambda self: None})
        replica = object.__new__(quiet)
        vars(replica).update(attrs)
        return replica

    server = ENGINE_SERVERS[model.engine](model, "127.0.0.1", "token")  # not started
    endpoint = ReplicaEndpoint(app="m", deployment="engine-m", replica="abc", model="m",
                               url="http://127.0.0.1:40001", node_id="n" * 56, at=0.0)
    attrs = dict(model=model, load_s=2.5, server=server, url=endpoint.url, endpoint=endpoint, weights=None,
                 usd_per_hour=4.0, standby_sleep=StandbySleep(server, server.awake, lambda: 0, enabled=False))
    info = store.read_replica_info(asyncio.run(built(EngineReplica, **attrs).info()))
    assert (info.replica, info.role, info.load_s, info.placement) == ("abc", ReplicaState.ACTIVE, 2.5, None)
    assert info.node_id == "n" * 56 and info.url == endpoint.url and info.healthy is False
    assert (info.weights_s, info.weights_cached) == (None, None)  # the simulated engine has no weights
    assert (info.slo_ttft_p95_s, info.slo_tpot_p95_s, info.usd_per_hour) == (2.0, 0.1, 4.0)
    assert info.ttft_histogram is not None and info.ttft_histogram.count == 0  # no request yet
    assert (info.sleeping, info.wake_s) == (False, None)  # never asleep, never woken

    # A planned replica reports the same record plus its placement check.
    report = PlacementReport(replica=0, placement_verified=True, reason="as planned", crossed=(),
                             expected_extra_allreduce_us=0.0,
                             observed=(ObservedRank(rank=0, node="pairs-a", gpu=0),))
    planned = built(PlacedEngineReplica, **attrs, placement=report)
    assert store.read_replica_info(asyncio.run(planned.info())) == dataclasses.replace(info, placement=report)


def test_a_planned_replica_reports_its_verification_typed():
    from hbmserve.deployments.replica.placed_replica import placement_report
    from hbmserve.placement.cluster_file import load_cluster_file
    from hbmserve.placement.placement_types import PlacementRequest
    from hbmserve.placement.placer import plan
    from hbmserve.placement.verification import RankReport, verify_replica

    import hbmserve.placement as placement_pkg

    pairs = load_cluster_file(Path(placement_pkg.__file__).parent / "data" / "cluster_nvlink_pairs_x2.yaml")
    reports = [RankReport(0, "pairs-a", gpu_index=1), RankReport(1, "pairs-a", gpu_uuid="GPU-2")]
    check = verify_replica(plan(PlacementRequest(tp=2), pairs), 0, reports, pairs)
    report = placement_report(check, reports)
    assert report.placement_verified is check.placement_verified and report.reason == check.reason
    assert [(o.rank, o.node, o.gpu) for o in report.observed] == [(0, "pairs-a", 1), (1, "pairs-a", "GPU-2")]
    assert len(report.crossed) == sum(1 for g in check.groups if g.crossing.value != "none")
    # Its JSON form is the verification's status form plus what was observed (status --json prints it).
    assert report.to_dict() == check.to_status_dict() | {"observed": [o.to_dict() for o in report.observed]}


def test_a_malformed_reply_is_named():
    with pytest.raises(RecordError, match="malformed ReplicaInfo from a replica's info\\(\\) reply"):
        store.read_replica_info({"url": "http://x"})
    with pytest.raises(RecordError, match="malformed IngressInfo"):
        store.read_ingress_info({"url": "http://x"})
    with pytest.raises(RecordError, match="malformed LoadReport"):
        LoadReport.from_json(b'{"waiting": "many"}')


# ---- guard: nobody else reads these records by key ----

RECORD_KEYS = {f.name for cls in (DecisionRecord, ReplicaInfo, IngressInfo, LoadReport, PlacementReport) for f in dataclasses.fields(cls)} - {
    # Too generic to tell a record read from any other dict: each is checked by its neighbours.
    # "role" is also every OpenAI chat message's field (routing/prefix.py renders messages).
    "model", "url", "engine", "reason", "at", "replica", "pid", "healthy", "waiting", "running", "role",
    "prompt_tokens"}  # also every OpenAI usage block's field
ALLOWED = {Path("core/records.py"), Path("deployments/wire/records_store.py")}


def keyed_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of each `x["key"]` or `x.get("key")` with a record field's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        else:
            continue
        if key in RECORD_KEYS:
            found.append((node.lineno, key))
    return found


def test_no_module_reads_a_record_by_key():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", ".venv") or rel in ALLOWED:
            continue
        offenders += [f"{rel}:{line} [{key!r}]" for line, key in keyed_reads(path.read_text())]
    assert offenders == []


@pytest.mark.parametrize("snippet", ['d["active_replicas"]', 'info.get("own_url")', 'report["kv_usage"]'])
def test_the_guard_sees_a_keyed_read(snippet):
    assert keyed_reads(snippet)


def test_the_decision_log_keeps_only_plan_changes_newest_last_and_bounded(kv):
    log = store.DecisionLog()
    assert store.recent_decisions("app", "engine") == ()
    log.publish("app", "engine", record(at=1.0, reason="first"))  # changed defaults to True
    log.publish("app", "engine", record(at=2.0, reason="hold"), changed=False)  # a tick that changed nothing
    log.publish("app", "engine", record(at=3.0, target_active=3, reason="up"), changed=True)
    assert [(d.at, d.reason) for d in store.recent_decisions("app", "engine")] == [(1.0, "first"), (3.0, "up")]
    log.publish("app", "engine", record(at=4.0, target_active=3, reason="hold at 3"), changed=False)
    assert store.latest_decision("app", "engine").reason == "hold at 3"  # every tick is still the latest
    assert len(store.recent_decisions("app", "engine")) == 2
    for i in range(store.DECISION_HISTORY + 5):
        log.publish("app", "engine", record(at=10.0 + i, reason=f"step {i}"))
    kept = store.recent_decisions("app", "engine")
    # The bound holds and the oldest go first: 2 + 55 published, the last 50 kept.
    assert len(kept) == store.DECISION_HISTORY
    assert kept[0].reason == "step 5" and kept[-1].reason == f"step {store.DECISION_HISTORY + 4}"
    assert store.recent_decisions("other", "engine") == ()


def test_an_unreadable_decision_log_entry_is_skipped_not_fatal(kv):
    kv[("hbmserve", "autoscale-log/app/engine")] = json.dumps(
        [{"at": "soon"}, record(at=4.0).to_dict()]).encode()
    assert [d.at for d in store.recent_decisions("app", "engine")] == [4.0]
    kv[("hbmserve", "autoscale-log/app/engine")] = b"not json"
    assert store.recent_decisions("app", "engine") == ()

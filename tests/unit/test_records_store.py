"""deployments/records_store.py, over an in-memory stand-in for Ray's internal KV (no cluster).

Also the producers and consumers around it: the policy publishes a DecisionRecord, replicas
and the gate read typed fields, the gate reports its count under its own name, a replica's
`info()` is a valid ReplicaInfo. And a guard that no other module reads these records by key.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from hbmserve.core.records import DecisionRecord, GateInfo, ObservedRank, PlacementReport, RecordError, ReplicaInfo
from hbmserve.core.scaling import ReplicaState, Tier
from hbmserve.deployments import records_store as store

internal_kv = pytest.importorskip("ray.experimental.internal_kv", reason="ray not installed")
ray_metrics = pytest.importorskip("ray.util.metrics", reason="ray not installed")

ROOT = Path(__file__).resolve().parents[2]


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

    def put(key, value, overwrite=True, namespace=None):
        data[(namespace, key)] = value.encode() if isinstance(value, str) else value

    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_put", put)
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key, namespace=None: data.get((namespace, key)))
    monkeypatch.setattr(ray_metrics, "Gauge", FakeGauge)
    FakeGauge.values = {}
    return data


def record(**overrides) -> DecisionRecord:
    fields = dict(at=5.0, target_active=2, target_standby={Tier.HOT: 1}, active_replicas=("a", "b"),
                  standby_replicas=("c",), held_at_ingress=3, startup_s={Tier.WARM: 20.0},
                  reason="scale up", serve_target=3)
    return DecisionRecord(**(fields | overrides))


def test_a_published_decision_reads_back_typed_and_sets_the_gauges(kv):
    assert store.latest_decision("app", "engine") is None  # the policy never ran
    store.DecisionLog().publish("app", "engine", record())
    assert store.latest_decision("app", "engine") == record()
    assert store.latest_decision("other", "engine") is None
    tags = (("application", "app"), ("deployment", "engine"))
    gauges = {name: series[tags] for name, series in FakeGauge.values.items()}
    assert gauges == {"hbmserve_autoscale_target_replicas": 3, "hbmserve_autoscale_active_replicas": 2,
                      "hbmserve_autoscale_standby_replicas": 1, "hbmserve_autoscale_held_requests": 3}


def test_a_malformed_stored_decision_is_an_error_naming_its_key(kv):
    kv[("hbmserve", "autoscale/app/engine")] = b'{"at": 1, "target_active": "two"}'
    with pytest.raises(RecordError, match="Ray KV hbmserve/autoscale/app/engine: .*'target_active'"):
        store.latest_decision("app", "engine")


def test_the_held_count_round_trips_and_a_bad_one_is_named(kv):
    assert store.held_at_ingress("app", "engine") == 0  # no gate
    store.publish_held("app", "engine", 7)
    assert store.held_at_ingress("app", "engine") == 7
    kv[("hbmserve", "held/app/engine")] = b"lots"
    with pytest.raises(RecordError, match="held/app/engine: 'lots'"):
        store.held_at_ingress("app", "engine")


def test_outside_a_cluster_nothing_is_held(monkeypatch):
    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: False)
    assert store.held_at_ingress("app", "engine") == 0


def test_the_policy_publishes_what_it_decided_and_replicas_read_their_role(kv):
    """Through the policy object Serve calls: the record kept in policy_state is the one in the
    KV, and a replica listed there reads itself active."""
    from hbmserve.deployments import autoscaling as sa
    from hbmserve.deployments.serve_app import EngineReplica

    ctx = SimpleNamespace(app_name="app", deployment_name="engine", current_time=100.0,
                          running_replicas=["r1", "r2"], raw_metrics={}, aggregated_metrics={},
                          current_num_replicas=2, target_num_replicas=2, policy_state={})
    target, state = sa.HbmServeAutoscalingPolicy(min_replicas=1, hot_standby_min=0, hot_standby_max=0)(ctx)
    published = store.latest_decision("app", "engine")
    assert published == sa.decision_in(state) and published.serve_target == target
    assert published.active_replicas and set(published.active_replicas) <= {"r1", "r2"}
    replica = SimpleNamespace(_me=("app", "engine", published.active_replicas[0]))
    assert EngineReplica._assigned_active(replica) is True
    replica._me = ("app", "engine", "not-listed")
    assert EngineReplica._assigned_active(replica) is False
    replica._me = ("app", "never-decided", "r1")
    assert EngineReplica._assigned_active(replica) is True  # before the policy's first decision every replica serves


def test_the_gate_follows_the_ids_and_reports_a_count(kv):
    from hbmserve.deployments.gate import ModelGate

    store.DecisionLog().publish("app", "engine", record(active_replicas=("a", "b")))
    gate = SimpleNamespace(app_name="app", engine_deployment="engine", model=SimpleNamespace(name="m"),
                           url="http://127.0.0.1:1", listener=SimpleNamespace(serving=False), held=1,
                           counters=SimpleNamespace(accepted=4, rejected=0))
    gate._active = ModelGate._read_active(gate)
    assert gate._active == ["a", "b"]
    reply = asyncio.run(ModelGate.info(gate))
    assert "active_replicas" not in reply
    info = store.read_ingress_info(reply)
    assert isinstance(info, GateInfo) and info.active_replica_count == 2 and info.held == 1


def test_a_replica_info_reply_is_a_valid_replica_info(monkeypatch):
    import ray
    from ray import serve

    from hbmserve.core.config import ModelSpec
    from hbmserve.deployments.placed_app import PlacedEngineReplica
    from hbmserve.deployments.serve_app import ENGINE_SERVERS, EngineReplica

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

    server = ENGINE_SERVERS[model.engine](model, "127.0.0.1", 18000, frozenset())  # not started
    attrs = dict(model=model, host="127.0.0.1", load_s=2.5, server=server, url="http://127.0.0.1:18000")
    info = store.read_ingress_info(asyncio.run(built(EngineReplica, **attrs).info()))
    assert isinstance(info, ReplicaInfo)
    assert (info.replica, info.role, info.load_s, info.placement) == ("abc", ReplicaState.STANDBY, 2.5, None)
    assert info.node_id == "n" * 56 and info.private_url is None and info.healthy is False

    # A planned replica reports the same record plus its placement check.
    report = PlacementReport(replica=0, placement_verified=True, reason="as planned", crossed=(),
                             expected_extra_allreduce_us=0.0,
                             observed=(ObservedRank(rank=0, node="pairs-a", gpu=0),))
    planned = built(PlacedEngineReplica, **attrs, placement=report)
    assert store.read_replica_info(asyncio.run(planned.info())) == dataclasses.replace(info, placement=report)


def test_a_planned_replica_reports_its_verification_typed():
    from hbmserve.deployments.placed_app import placement_report
    from hbmserve.placement.cluster_file import load_cluster_file
    from hbmserve.placement.plan_types import PlacementRequest
    from hbmserve.placement.planner import plan
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
    with pytest.raises(RecordError, match="malformed GateInfo"):
        store.read_ingress_info({"gate": True, "url": "http://x"})


# ---- guard: nobody else reads these records by key ----

RECORD_KEYS = {f.name for cls in (DecisionRecord, ReplicaInfo, GateInfo, PlacementReport) for f in dataclasses.fields(cls)} - {
    # Too generic to tell a record read from any other dict: each is checked by its neighbours.
    # "role" is also every OpenAI chat message's field (routing/prefix.py renders messages).
    "model", "url", "engine", "reason", "at", "replica", "pid", "healthy", "role"}
ALLOWED = {Path("core/records.py"), Path("deployments/records_store.py")}


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


@pytest.mark.parametrize("snippet", ['d["active_replicas"]', 'info.get("private_url")', 'gate["held"]'])
def test_the_guard_sees_a_keyed_read(snippet):
    assert keyed_reads(snippet)

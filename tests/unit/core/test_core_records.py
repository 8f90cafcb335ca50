"""The hand-off records (core/records.py): round trips, version tolerance, clear errors."""

from __future__ import annotations

import json

import pytest

from hbmserve.core.records import (CrossedGroup, DecisionRecord, IngressDemand, ObservedRank, PlacementReport,
                                   RecordError, ReplicaEndpoint, ReplicaInfo)
from hbmserve.core.door_records import IngressInfo, ModelTraffic
from hbmserve.core.scaling import ReplicaState, Tier


def decision(**overrides) -> DecisionRecord:
    fields = dict(at=1000.5, target_active=2, target_standby={Tier.HOT: 1, Tier.WARM: 0},
                  active_replicas=("r1", "r2"), standby_replicas=("r3",), held_at_ingress=4,
                  startup_s={Tier.HOT: 1.0, Tier.WARM: 20.0, Tier.COLD: 60.0},
                  reason="queue 9 > 2 x 2 active; promote 1 standby", serve_target=3)
    return DecisionRecord(**(fields | overrides))


def placement() -> PlacementReport:
    return PlacementReport(
        replica=1, placement_verified=False, reason="stage 0 TP group crossed an island",
        crossed=(CrossedGroup(stage=0, crossing="island", planned_island="pairs-a/0",
                              observed=("pairs-a:0", None), extra_allreduce_us=12.5),),
        expected_extra_allreduce_us=12.5,
        observed=(ObservedRank(rank=0, node="pairs-a", gpu=0), ObservedRank(rank=1, node="pairs-b", gpu="GPU-9f")))


def replica(**overrides) -> ReplicaInfo:
    fields = dict(model="m", engine="sim", url="http://127.0.0.1:40001",
                  role=ReplicaState.STANDBY, replica="abc123", node_id="f" * 56, pid=4242, in_flight=1,
                  engine_waiting=2, engine_running=3, kv_usage=0.25, accepted=10, rejected=1, healthy=True,
                  load_s=20.4, placement=placement())
    return ReplicaInfo(**(fields | overrides))


def ingress() -> IngressInfo:
    return IngressInfo(node_id="f" * 56, url="http://127.0.0.1:8000", own_url="http://127.0.0.1:40100", auth=True,
                       connections=3, rss_mib=80.5, models=(ModelTraffic(model="m", accepted=5, rejected=1, in_flight=2, queued=1,
                                                           routable=2),))


def endpoint() -> ReplicaEndpoint:
    return ReplicaEndpoint(app="m", deployment="engine-m", replica="abc123", model="m",
                           url="http://127.0.0.1:40001", node_id="f" * 56, at=1000.0)


@pytest.mark.parametrize("record", [decision(), replica(), replica(placement=None), ingress(), endpoint(),
                                    IngressDemand(held=3, refused_rps=0.5, at=5.0),
                                    placement()], ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_json_and_plain_data(record):
    assert type(record).from_json(record.to_json()) == record
    assert type(record).from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_decision_json_form_is_the_one_hbmserve_status_has_always_printed():
    """`hbmserve status --json` prints this under `autoscale`; tests/integration read these keys."""
    assert decision().to_dict() == {
        "at": 1000.5, "target_active": 2, "target_standby": {"hot": 1, "warm": 0},
        "active_replicas": ["r1", "r2"], "standby_replicas": ["r3"], "held_at_ingress": 4,
        "refused_rps_at_ingress": 0.0, "startup_s": {"hot": 1.0, "warm": 20.0, "cold": 60.0},
        "burst_hold": 0, "not_in_time": 0, "prior_source": "", "prior_hold": 0,
        "reason": "queue 9 > 2 x 2 active; promote 1 standby", "serve_target": 3}


def test_readers_are_typed():
    d = DecisionRecord.from_json(decision().to_json())
    assert d.target_standby[Tier.HOT] == 1 and d.active_replicas == ("r1", "r2")
    r = ReplicaInfo.from_dict(replica().to_dict())
    assert r.role is ReplicaState.STANDBY and r.placement_verified is False
    assert r.placement.observed[1].gpu == "GPU-9f" and r.placement.observed[0].gpu == 0  # index stays an int
    assert replica(placement=None).placement_verified is None


def test_fields_a_newer_writer_added_are_ignored():
    data = decision().to_dict() | {"confidence": 0.9}
    assert DecisionRecord.from_dict(data) == decision()
    assert ReplicaInfo.from_dict(replica().to_dict() | {"gpu_memory_gib": 80}) == replica()


def test_fields_an_older_writer_lacked_take_their_defaults():
    # Before scale to zero and measured start-up, the record had neither field.
    old = {k: v for k, v in decision().to_dict().items() if k not in ("held_at_ingress", "refused_rps_at_ingress", "startup_s")}
    d = DecisionRecord.from_dict(old)
    assert d.held_at_ingress == 0 and d.refused_rps_at_ingress == 0.0 and d.startup_s == {}
    # A replica from before load times were reported.
    r = ReplicaInfo.from_dict({k: v for k, v in replica().to_dict().items() if k not in ("load_s", "placement")})
    assert r.load_s is None and r.placement is None


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("active_replicas"), "field 'active_replicas' is missing"),
    (lambda d: d.update(target_active="2"), "field 'target_active'"),  # strict: a string is no number
    (lambda d: d.update(target_active=True), "field 'target_active'"),  # nor is a bool
    (lambda d: d.update(target_active=2.5), "field 'target_active'"),
    (lambda d: d.update(active_replicas="r1"), "field 'active_replicas'"),
    (lambda d: d.update(target_standby={"lukewarm": 1}), "field 'target_standby.lukewarm.[key]'"),
])
def test_malformed_decisions_raise_a_record_error_naming_source_and_field(mutate, needle):
    data = decision().to_dict()
    mutate(data)
    with pytest.raises(RecordError) as err:
        DecisionRecord.from_dict(data, source="Ray KV hbmserve/autoscale/app/engine")
    message = str(err.value)
    assert message.startswith("malformed DecisionRecord from Ray KV hbmserve/autoscale/app/engine: ")
    assert needle in message, message
    assert isinstance(err.value, ValueError) and not isinstance(err.value, KeyError)


@pytest.mark.parametrize("raw, needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "got list"),
    ("null", "got NoneType"),
])
def test_what_is_not_a_record_at_all_is_a_record_error(raw, needle):
    with pytest.raises(RecordError, match="malformed DecisionRecord") as err:
        DecisionRecord.from_json(raw)
    assert needle in str(err.value)
    with pytest.raises(RecordError, match="not JSON data"):
        DecisionRecord.from_dict({"at": object()})


def test_malformed_replica_info_names_the_nested_field():
    data = replica().to_dict()
    data["role"] = "leader"
    data["placement"]["observed"][0]["rank"] = "zero"
    with pytest.raises(RecordError) as err:
        ReplicaInfo.from_dict(data, source="a replica's info() reply")
    message = str(err.value)
    assert "field 'role'" in message and "field 'placement.observed.0.rank'" in message


def test_records_are_frozen():
    with pytest.raises(AttributeError):
        decision().target_active = 5  # type: ignore[misc]


def test_a_renewed_record_is_fresh_only_within_its_time_to_live():
    ep = endpoint()  # renewed at t=1000
    assert ep.fresh(now=1005.0, ttl_s=6.0) and not ep.fresh(now=1006.5, ttl_s=6.0)

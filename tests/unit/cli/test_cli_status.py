"""`hbmserve status` printed from typed records (no cluster: cluster.ray_cluster's readers are stubbed).

The JSON form is a contract: tests/integration (conftest.model_status and the autoscale, sim
and placement tests) read its keys, so the whole shape is pinned here.
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from hbmserve.cli.serve import register
from hbmserve.cluster import ray_cluster as rc
from hbmserve.cluster.status_figures import LatencyVsSlo
from hbmserve.core.records import CrossedGroup, DecisionRecord, ObservedRank, PlacementReport, RecordError, ReplicaRoles
from hbmserve.core.door_records import AdapterTraffic, KvRouting, ModelTraffic
from hbmserve.core.scaling import ReplicaState, Tier

URL = "http://127.0.0.1:18000"
KV = KvRouting(streams=2, hbm_blocks=900, host_blocks=4000, untrusted=1, max_lag_s=0.05, batches=300, lost=2,
               hashed=40, hash_ms=0.35)


def adapters(door: int) -> tuple[AdapterTraffic, ...]:
    """Seven adapters at each of two doors: sql busiest, a-0..a-5 in the tail."""
    sql = AdapterTraffic(model="sleepy", adapter="sql", requests=10, failed=door, prompt_tokens=300,
                         completion_tokens=100, ttft_p95_s=0.1 * (door + 1), loads=1, unloads=0, resident=1)
    tail = tuple(AdapterTraffic(model="sleepy", adapter=f"a-{i}", requests=i, failed=0, prompt_tokens=0,
                                completion_tokens=0, ttft_p95_s=None, loads=1, unloads=1, resident=0)
                 for i in range(6))
    return (sql, *tail)


def models() -> list[rc.ModelStatus]:
    decision = DecisionRecord(at=12.5, target_active=1, target_standby={Tier.HOT: 1}, active_replicas=("r-a",),
                              standby_replicas=("r-b",), held_at_ingress=0,
                              startup_s={Tier.HOT: 1.0, Tier.WARM: 3.2, Tier.COLD: 9.0},
                              reason="steady; 1 hot standby", serve_target=2)
    crossed = PlacementReport(replica=1, placement_verified=False, reason="stage 0 TP group crossed an island",
                              crossed=(CrossedGroup(stage=0, crossing="island", planned_island="pairs-a/0",
                                                    observed=("pairs-a:0", "pairs-a:2"), extra_allreduce_us=7.5),),
                              expected_extra_allreduce_us=7.5,
                              observed=(ObservedRank(rank=0, node="pairs-a", gpu=0),
                                        ObservedRank(rank=1, node="pairs-a", gpu=2)))
    return [rc.ModelStatus(
        name="sleepy", app_status="RUNNING", replicas={"RUNNING": 2}, endpoints=(URL,), message="",
        replica_stats=(rc.ReplicaStats("aaaaaaaa:11", URL, 7, 0, 1, ReplicaState.ACTIVE, crossed, prompt_tokens=1000,
                                       prefix_hit_tokens=600),
                       rc.ReplicaStats("bbbbbbbb:12", URL, 0, 0, 0, ReplicaState.STANDBY, sleeping=True,
                                       wake_s=1.75)),
        autoscale=decision,
        traffic=(ModelTraffic(model="sleepy", accepted=3, rejected=1, in_flight=2, queued=1, routable=1, kv=KV,
                              adapters=adapters(0)),
                 ModelTraffic(model="sleepy", accepted=4, rejected=0, in_flight=0, queued=0, routable=1,
                              adapters=adapters(1))),
        latency=LatencyVsSlo(ttft_p95_s=0.25, tpot_p95_s=0.15, slo_ttft_p95_s=2.0, slo_tpot_p95_s=0.1, requests=40),
        roles=ReplicaRoles(starting=1, active=1, standby=1, draining=0, warm=2), usd_per_hour=6.0)]


@pytest.fixture
def cli(monkeypatch):
    monkeypatch.setattr(rc, "connect", lambda address: "127.0.0.1:6379")
    monkeypatch.setattr(rc, "status", models)
    monkeypatch.setattr(rc, "metrics_targets", lambda: ["127.0.0.1:8080"])
    monkeypatch.setattr(rc, "door_metrics_targets", lambda: ["127.0.0.1:41234"])
    monkeypatch.setattr(rc, "rollouts", lambda: [])
    app = typer.Typer()
    register(app)

    def run(*args: str):
        result = CliRunner().invoke(app, ["status", *args])
        assert result.exit_code == 0, result.output
        return result.stdout

    return run


def test_status_json_keeps_its_shape(cli):
    printed = json.loads(cli("--json"))
    assert printed == {"cluster": "127.0.0.1:6379", "metrics_targets": ["127.0.0.1:8080"],
                       "door_metrics_targets": ["127.0.0.1:41234"], "models": [{
        "name": "sleepy", "app_status": "RUNNING", "replicas": {"RUNNING": 2}, "endpoints": [URL], "message": "",
        "replica_stats": [
            {"replica": "aaaaaaaa:11", "url": URL, "accepted": 7, "rejected": 0, "in_flight": 1, "role": "active",
             "placement": {"replica": 1, "placement_verified": False, "reason": "stage 0 TP group crossed an island",
                           "crossed": [{"stage": 0, "crossing": "island", "planned_island": "pairs-a/0",
                                        "observed": ["pairs-a:0", "pairs-a:2"], "extra_allreduce_us": 7.5}],
                           "expected_extra_allreduce_us": 7.5,
                           "observed": [{"rank": 0, "node": "pairs-a", "gpu": 0},
                                        {"rank": 1, "node": "pairs-a", "gpu": 2}]},
             "prompt_tokens": 1000, "prefix_hit_tokens": 600, "weights_cached": None, "weights_s": None,
             "load_s": None, "sleeping": False, "wake_s": None},
            {"replica": "bbbbbbbb:12", "url": URL, "accepted": 0, "rejected": 0, "in_flight": 0, "role": "standby",
             "placement": None, "prompt_tokens": 0, "prefix_hit_tokens": 0, "weights_cached": None,
             "weights_s": None, "load_s": None, "sleeping": True, "wake_s": 1.75}],
        "autoscale": {"at": 12.5, "target_active": 1, "target_standby": {"hot": 1}, "active_replicas": ["r-a"],
                      "standby_replicas": ["r-b"], "held_at_ingress": 0, "refused_rps_at_ingress": 0.0,
                      "startup_s": {"hot": 1.0, "warm": 3.2, "cold": 9.0}, "burst_hold": 0, "not_in_time": 0, "prior_source": "", "prior_hold": 0,
                      "reason": "steady; 1 hot standby",
                      "serve_target": 2},
        "traffic": [{"model": "sleepy", "accepted": 3, "rejected": 1, "in_flight": 2, "queued": 1, "routable": 1,
                     "retried": 0, "migrated": 0, "migration_failed": 0,
                     "kv": {"streams": 2, "hbm_blocks": 900, "host_blocks": 4000, "untrusted": 1, "max_lag_s": 0.05,
                            "batches": 300, "lost": 2, "hashed": 40, "hash_ms": 0.35},
                     "adapters": [a.to_dict() for a in adapters(0)], "prefill_routable": None, "two_phase": []},
                    {"model": "sleepy", "accepted": 4, "rejected": 0, "in_flight": 0, "queued": 0, "routable": 1,
                     "retried": 0, "migrated": 0, "migration_failed": 0, "kv": None,
                     "adapters": [a.to_dict() for a in adapters(1)], "prefill_routable": None, "two_phase": []}],
        "latency": {"ttft_p95_s": 0.25, "tpot_p95_s": 0.15, "slo_ttft_p95_s": 2.0, "slo_tpot_p95_s": 0.1,
                    "requests": 40},
        "roles": {"starting": 1, "active": 1, "standby": 1, "draining": 0, "warm": 2},
        "usd_per_hour": 6.0}], "rollouts": []}


def test_status_json_reads_back_into_the_same_records(cli):
    (entry,) = json.loads(cli("--json"))["models"]
    assert rc.ModelStatus.from_dict(entry) == models()[0]


def test_status_text_is_printed_from_typed_fields(cli):
    text = cli()
    assert "sleepy autoscale -> 2 replicas: steady; 1 hot standby" in text
    assert "sleepy front doors: 7 accepted, 1 refused, 1 queued now; replicas reached: 1 / 1" in text
    assert "placement verified on 0/1 replicas" in text
    assert "stage 0 TP group crossed an island (expected extra all-reduce 7.5 us)" in text
    assert "7 / 0 (asleep)" in text
    assert "sleepy sleep mode: 1 standby asleep; last wake 1.75 s (median of 1 replica)" in text
    assert ("sleepy p95 TTFT 250ms / SLO 2.00s ok, TPOT 150ms / SLO 100ms over (40 requests since the replicas "
            "started); replicas 1 active, 1 standby, 1 starting, 0 draining, 2 warm; $6.00/hour") in text
    assert "front doors (/metrics, admin token): 127.0.0.1:41234" in text
    # Summed over the two doors, busiest first; TTFT p95 the worse door's; the tail summed.
    assert ("sleepy adapters: sql 20 req (1 failed), 800 tok, TTFT p95 200ms, loads 2/unloads 0, on 2 replica(s); "
            "a-5 10 req (0 failed), 0 tok, TTFT p95 -, loads 2/unloads 2, on 0 replica(s)") in " ".join(text.split())
    assert "2 more: 2 req, loads 4" in text
    assert ("sleepy prefix cache hit 60.0% (60% by replica); KV index at 1 door(s): 900 HBM + 4000 host blocks, "
            "streams 2, untrusted 1, lag 0.05 s, batches lost 2 of 300, hashing 0.35 ms a request") in text


def test_a_malformed_record_is_a_cluster_error_the_cli_prints(monkeypatch):
    def broken():
        raise RecordError("malformed DecisionRecord from Ray KV hbmserve/autoscale/a/e: field 'reason' is missing")

    monkeypatch.setattr(rc, "_status", broken)
    with pytest.raises(rc.ClusterError, match="field 'reason' is missing"):
        rc.status()


def test_a_rollout_shows_in_status_with_its_last_step(cli, monkeypatch):
    from hbmserve.core.rollout_records import RolloutRecord, RolloutStep

    step = RolloutStep(at=1010.0, old_replicas=1, new_replicas=1, old_running=1, new_ready=0,
                       reason="waiting for 1 new replica(s) to serve (4 s of 900 s)")
    record = RolloutRecord(model="sleepy", from_app="sleepy", to_app="sleepy@2", phase="rolling", started_at=1000.0,
                           at=1012.0, target=2, max_in_use=2, reason=step.reason, steps=(step,))
    monkeypatch.setattr(rc, "rollouts", lambda: [record])
    assert ("sleepy rollout sleepy -> sleepy@2: rolling (12 s so far); at most 2 replicas held (fleet 2); 1 steps; "
            "last: waiting for 1 new replica(s) to serve (4 s of 900 s)") in cli()
    (printed,) = json.loads(cli("--json"))["rollouts"]
    assert RolloutRecord.from_dict(printed) == record


def test_a_disaggregated_models_pools_and_how_its_requests_ran_sum_over_the_doors():
    from hbmserve.cli.status_view import _pools_line

    doors = (ModelTraffic(model="split", accepted=9, rejected=0, in_flight=0, queued=0, routable=4,
                          prefill_routable=2, two_phase=(("aggregated_no_decode", 1), ("prefill_failed", 2),
                                                         ("two_phase", 5))),
             ModelTraffic(model="split", accepted=3, rejected=0, in_flight=0, queued=0, routable=3,
                          prefill_routable=1, two_phase=(("aggregated_decode_failed", 1), ("two_phase", 2))))
    assert _pools_line(doors) == ("pools: prefill 2 / 1, decode 4 / 3 replicas reached; requests: 7 in two phases, "
                                  "2 aggregated (decode failed: 1, no decode: 1), 2 prefills tried again")
    assert _pools_line(doors[:0]) is None and _pools_line((models()[0].traffic[0],)) is None

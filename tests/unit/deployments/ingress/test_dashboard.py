"""The ops dashboard's pure builders (deployments/ingress/dashboard.py) and the front door's measuring
parts (deployments/ingress/dashboard_feed.py: reply timing, windows, the sample ring), on hand-worked
numbers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import hbmserve.placement as placement_pkg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.core.records import CrossedGroup, DecisionRecord, ObservedRank, PlacementReport, ReplicaRoles
from hbmserve.core.door_records import KvRouting
from hbmserve.core.scaling import Tier
from hbmserve.deployments.ingress.dashboard import (DECISIONS_SHOWN, ClientLatency, DashboardSample, DashboardSnapshot,
                                            ModelInputs, ModelKvIndex, ReplicaView,
                                            build_sample, build_snapshot, model_sample, placement_map,
                                            role_counts)
from hbmserve.deployments.ingress.dashboard_feed import (LATENCY_WINDOW_S, RATE_WINDOW_S, ReplyWatch, ReplyWindow,
                                                 SampleRing)
from hbmserve.capacity.perf.scenario import replica_usd_per_hour
from hbmserve.placement.cluster_file import load_cluster_file

PAIRS = Path(placement_pkg.__file__).parent / "data" / "cluster_nvlink_pairs_x2.yaml"


def decision(at: float = 1.0, active=("a", "b"), standby=("c",), serve_target: int = 4, reason: str = "why",
             target_active: int = 3) -> DecisionRecord:
    return DecisionRecord(at=at, target_active=target_active, target_standby={Tier.HOT: 1}, active_replicas=active,
                          standby_replicas=standby, reason=reason, serve_target=serve_target)


def view(replica: str, waiting: int = 0, placement: PlacementReport | None = None, prompt: int = 0,
         hits: int = 0) -> ReplicaView:
    return ReplicaView(replica=replica, node_id=f"node-of-{replica}", reachable=True, waiting=waiting, running=1,
                       kv_usage=0.1, placement=placement, prompt_tokens=prompt, prefix_hit_tokens=hits)


def inputs(model: str = "m", replicas=(), decision_=None, fixed: int | None = None, held: int = 0,
           price: float | None = 8.0, latency: ClientLatency = ClientLatency()) -> ModelInputs:
    return ModelInputs(model=model, ttft_slo_s=1.0, tpot_slo_s=0.05, usd_per_replica_hour=price,
                       fixed_replicas=fixed, decision=decision_, replicas=tuple(replicas), held=held, latency=latency)


# -- roles, samples -------------------------------------------------------------------------

def test_roles_follow_the_decision_and_count_what_serve_has_not_announced_yet():
    # a, b active; c standby; d in neither list (being removed); Serve asked for 4 -> one loading.
    m = inputs(replicas=[view("a"), view("b"), view("c"), view("d")], decision_=decision(serve_target=4))
    assert role_counts(m) == ReplicaRoles(starting=1, active=2, standby=1, draining=1)
    # A fixed count of 3 with two announced: both active, one starting; no decision, no draining.
    assert role_counts(inputs(replicas=[view("a"), view("b")], fixed=3)) == ReplicaRoles(starting=1, active=2)


@given(known=st.sets(st.sampled_from("abcdefgh")), active=st.sets(st.sampled_from("abcdefgh")),
       standby=st.sets(st.sampled_from("abcdefgh")), target=st.integers(0, 10))
def test_every_known_replica_has_exactly_one_role_and_serve_s_target_is_covered(known, active, standby, target):
    standby -= active  # the policy never lists a replica twice
    m = inputs(replicas=[view(r) for r in sorted(known)],
               decision_=decision(active=tuple(sorted(active)), standby=tuple(sorted(standby)), serve_target=target))
    roles = role_counts(m)
    assert roles.active + roles.standby + roles.draining == len(known)
    assert roles.starting + roles.active + roles.standby >= target
    assert roles.starting == max(0, target - len(known & active) - len(known & standby))


def test_a_sample_sums_the_queues_and_prices_every_replica_that_holds_gpus():
    latency = ClientLatency(ttft_p95_s=0.4, tpot_p95_s=0.02, tokens_per_s=120.0)
    m = inputs(replicas=[view("a", waiting=3, prompt=1000, hits=250), view("b", waiting=1, prompt=500, hits=500),
                         view("c")], decision_=decision(serve_target=4), held=2, latency=latency)
    s = model_sample(m)
    assert (s.prompt_tokens, s.prefix_hit_tokens) == (1500, 750)  # the page draws the rate from their differences
    assert s.queue_depth == 2 + 3 + 1
    assert (s.roles.starting + s.roles.active + s.roles.standby + s.roles.draining) == 4 and s.usd_per_hour == 4 * 8.0  # starting replicas hold GPUs too
    assert (s.ttft_p95_s, s.tpot_p95_s, s.tokens_per_s) == (0.4, 0.02, 120.0)
    assert model_sample(inputs(price=None)).usd_per_hour is None  # unknown GPU: no figure, not $0


def test_the_price_is_gpus_per_replica_times_the_catalog_or_configured_price():
    from hbmserve.capacity.perf.hardware import get_gpu
    from hbmserve.core.config import parse_cluster_spec

    spec = parse_cluster_spec({"models": [
        {"name": "a", "source": "sim", "engine": "sim", "parallelism": {"tp": 4},
         "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-70b"}},
        {"name": "b", "source": "sim", "engine": "sim", "parallelism": {"tp": 2, "pp": 2},
         "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-70b"}, "hardware": {"usd_per_gpu_hour": 2.5}}]})
    assert replica_usd_per_hour(spec.models[0]) == pytest.approx(4 * get_gpu("h100-sxm").usd_per_gpu_hour)
    assert replica_usd_per_hour(spec.models[1]) == pytest.approx(4 * 2.5)


# -- placement map ----------------------------------------------------------------------------

def _report(index: int, ranks: list[tuple[str, int]], verified: bool) -> PlacementReport:
    crossed = () if verified else (CrossedGroup(stage=0, crossing="node", planned_island="pairs-a-1",
                                                observed=tuple(f"{n}:{g}" for n, g in ranks), extra_allreduce_us=40.0),)
    return PlacementReport(replica=index, placement_verified=verified, reason="ok" if verified else "crossed",
                           crossed=crossed, expected_extra_allreduce_us=0.0 if verified else 40.0,
                           observed=tuple(ObservedRank(rank=i, node=n, gpu=g) for i, (n, g) in enumerate(ranks)))


def test_the_placement_map_puts_each_rank_on_its_gpu_with_its_island_and_verdict():
    topology = load_cluster_file(PAIRS)  # two nodes, NV4 pairs GPU0-1 and GPU2-3 on each
    r0 = view("r0", placement=_report(0, [("pairs-a", 0), ("pairs-a", 1)], verified=True))
    r1 = view("r1", placement=_report(1, [("pairs-a", 2), ("pairs-b", 3)], verified=False))
    unplanned = view("u")
    pm = placement_map((inputs("placed", [r0, r1], fixed=2), inputs("cpu", [unplanned], fixed=1)), topology)
    cells = {(n.node, c.gpu): c for n in pm.nodes for c in n.gpus}
    assert [n.node for n in pm.nodes] == ["pairs-a", "pairs-b"] and len(cells) == 8
    # Islands by hand: node-local NVLink components, numbered by lowest GPU.
    assert {k: c.island for k, c in cells.items()} == {
        (n, g): f"{n}-{0 if g < 2 else 1}" for n in ("pairs-a", "pairs-b") for g in range(4)}
    occupied = {k: (c.replica, c.plan_index, c.rank, c.verified) for k, c in cells.items() if c.replica}
    assert occupied == {("pairs-a", 0): ("r0", 0, 0, True), ("pairs-a", 1): ("r0", 0, 1, True),
                        ("pairs-a", 2): ("r1", 1, 0, False), ("pairs-b", 3): ("r1", 1, 1, False)}
    rows = {r.replica: r for r in pm.replicas}
    assert rows["r0"].ranks == ("pairs-a:0", "pairs-a:1") and rows["r0"].verified is True
    assert rows["r1"].verified is False and rows["r1"].crossed_groups == 1
    assert rows["u"].verified is None and rows["u"].ranks == () and rows["u"].model == "cpu"
    # Without a topology file the replicas are still listed, the grid is not.
    assert placement_map((inputs("placed", [r0]),), None).nodes == ()


# -- the snapshot -----------------------------------------------------------------------------

def test_the_snapshot_merges_the_decision_logs_newest_first_and_round_trips_as_json():
    logs = {"m": tuple(decision(at=float(t), reason=f"m{t}") for t in range(0, 60, 2)),
            "n": tuple(decision(at=float(t), reason=f"n{t}") for t in range(1, 60, 2))}
    latest = decision(at=99.0, reason="hold")
    models = (inputs("m", [view("a")], decision_=latest), inputs("n", [view("x")], fixed=1))
    history = (build_sample(10.0, models), build_sample(12.0, models))
    kv = (ModelKvIndex(model="m", index=KvRouting(streams=1, hbm_blocks=40, host_blocks=0, untrusted=0,
                                                  max_lag_s=0.01, batches=12, lost=0, hashed=3, hash_ms=0.2)),)
    snap = build_snapshot(100.0, "door-node", 2, True, history, models, logs, None, kv=kv)
    ats = [e.decision.at for e in snap.decisions]
    assert len(ats) == DECISIONS_SHOWN and ats == sorted(ats, reverse=True) and ats[0] == 59.0
    assert {e.model for e in snap.decisions} == {"m", "n"}
    assert [(c.model, c.decision.reason) for c in snap.current] == [("m", "hold")]  # n is not autoscaled
    data = json.loads(snap.to_json())
    assert [s["at"] for s in data["history"]] == [10.0, 12.0]
    assert data["history"][0]["models"][0]["roles"] == {"starting": 3, "active": 1, "standby": 0, "draining": 0, "warm": 0}
    assert data["slo"][0] == {"model": "m", "ttft_p95_s": 1.0, "tpot_p95_s": 0.05}
    assert data["decisions"][0]["decision"]["target_standby"] == {"hot": 1}
    assert data["kv"] == [{"model": "m", "index": {"streams": 1, "hbm_blocks": 40, "host_blocks": 0, "untrusted": 0,
                                                   "max_lag_s": 0.01, "batches": 12, "lost": 0, "hashed": 3,
                                                   "hash_ms": 0.2}}]
    assert DashboardSnapshot.from_json(snap.to_json()) == snap


def test_the_ring_keeps_the_last_samples_oldest_first():
    ring = SampleRing(capacity=3)
    for t in range(5):
        ring.push(DashboardSample(at=float(t), models=()))
    assert [s.at for s in ring.samples()] == [2.0, 3.0, 4.0]


# -- measuring at the door --------------------------------------------------------------------

def test_the_window_gives_p95_over_its_span_and_tokens_per_second_over_the_shorter_one():
    w = ReplyWindow()
    for i in range(20):  # TTFT 0.1 .. 2.0 s, one reply per second, 10 tokens each
        w.record(float(i), ttft_s=0.1 * (i + 1), tpot_s=0.01, output_tokens=10)
    f = w.figures(19.0)
    assert f.ttft_p95_s == pytest.approx(1.9)  # nearest rank: ceil(0.95 * 20) = 19th of 20
    assert f.tokens_per_s == pytest.approx(11 * 10 / RATE_WINDOW_S)  # t = 9..19 are within 10 s
    later = w.figures(19.0 + LATENCY_WINDOW_S + 1)
    assert later == ClientLatency(ttft_p95_s=None, tpot_p95_s=None, tokens_per_s=0.0)


class _Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _play(messages: list[tuple[float, dict]], arrived_at: float = 0.5) -> ReplyWindow:
    window, clock, sent = ReplyWindow(), _Clock(0.0), []

    async def send(message):
        sent.append(message)

    watch = ReplyWatch(send, window, arrived_at, request_bytes=400, clock=clock)

    async def go():
        for at, message in messages:
            clock.t = at
            await watch(message)

    asyncio.run(go())
    assert [m for _, m in messages] == sent  # the client gets every message unchanged
    return window


def _start(kind: bytes, status: int = 200) -> dict:
    return {"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]}


def _body(data: bytes, more: bool = True) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": more}


def test_a_streamed_reply_gives_ttft_from_arrival_and_tpot_over_the_events_after_the_first_chunk():
    ev = b'data: {"choices": [{"text": "x"}]}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 4}}\n\n'
    w = _play([(0.9, _start(b"text/event-stream")), (1.0, _body(ev)), (1.1, _body(ev + ev)),
               (1.2, _body(ev)), (1.3, _body(usage + b"data: [DONE]\n\n")), (1.3, _body(b"", more=False))])
    # TTFT: first chunk at 1.0, arrived 0.5. After the first chunk: 2 + 1 + 1 (usage) events over 0.3 s.
    assert list(w.ttft_s) == [(1.3, pytest.approx(0.5))]
    assert list(w.tpot_s) == [(1.3, pytest.approx(0.3 / 4))]
    assert list(w.tokens) == [(1.3, 4)]  # the usage report, not the event count


def test_a_stream_whose_middle_is_pushed_past_send_is_timed_the_same():
    """The relay writes a stream's middle with the listener's push (wire/chunk_push.py), not
    `send`: the watch sees those pieces too, and passes each on to the push unchanged."""
    from hbmserve.deployments.wire.chunk_push import PushingSend

    class Push:
        usable, written = True, []

        def write(self, body: bytes) -> bool:
            self.written.append(body)
            return True

    ev = b'data: {"choices": [{"text": "x"}]}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 4}}\n\n'
    window, clock, sent, push = ReplyWindow(), _Clock(0.9), [], Push()

    async def send(message):
        sent.append(message)

    watch = ReplyWatch(PushingSend(send, push), window, 0.5, request_bytes=400, clock=clock)

    async def go():
        await watch(_start(b"text/event-stream"))
        clock.t = 1.0
        await watch(_body(ev))
        for at, piece in ((1.1, ev + ev), (1.2, ev), (1.3, usage + b"data: [DONE]\n\n")):
            clock.t = at
            assert watch.push.write(piece) is True
        await watch(_body(b"", more=False))

    asyncio.run(go())
    assert push.written == [ev + ev, ev, usage + b"data: [DONE]\n\n"] and len(sent) == 3
    assert list(window.ttft_s) == [(1.3, pytest.approx(0.5))]  # as the same reply sent whole through `send`
    assert list(window.tpot_s) == [(1.3, pytest.approx(0.3 / 4))]
    assert list(window.tokens) == [(1.3, 4)]


def test_a_whole_json_reply_counts_tokens_but_no_latency_and_errors_count_nothing():
    body = json.dumps({"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}).encode()
    w = _play([(0.7, _start(b"application/json")), (0.8, _body(body, more=False))])
    assert list(w.ttft_s) == [] and list(w.tpot_s) == [] and list(w.tokens) == [(0.8, 7)]
    refused = _play([(0.6, _start(b"application/json", 429)), (0.6, _body(b'{"error": {}}', more=False))])
    assert list(refused.tokens) == []

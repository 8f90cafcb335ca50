"""Replica capacity from observed request lengths (capacity/perf/length_capacity.py), and its live
wiring: replicas record the lengths they serve (replica_middleware), report them in their
autoscaling stats, and the Serve adapter re-estimates `replica_capacity_rps` from them."""

from __future__ import annotations

import asyncio
import json
import random
import time
from types import SimpleNamespace

import pytest

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.length_capacity import CapacityTable, LengthStats, capacity_table, replica_capacity_rps
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.perf.plan_analytic import EngineKnobs, Workload, capacity_rps
from hbmserve.deployments.control import autoscaling as sa
from hbmserve.deployments.replica.replica_http import EngineLoad
from hbmserve.deployments.replica.replica_middleware import LoadCounters, ReplicaMiddleware
from hbmserve.deployments.wire.http import request_lengths
from hbmserve.routing.replica_cap import AdmissionBudget
from hbmserve.deployments.apps.autoscaling_options import serve_autoscaling_config
from hbmserve.deployments.wire.autoscaling_stats import autoscaling_stats

DEP = Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4)
COST = cost_model(DEP)
KNOBS = EngineKnobs(128, 1344, True, memory_fit(DEP).kv_tokens)
SMALL_GRID = (tuple(64.0 * 2 ** (i / 2) for i in range(11)), (8.0, 32.0, 128.0, 512.0))


@pytest.fixture(scope="module")
def table() -> CapacityTable:
    return capacity_table(COST, KNOBS, 2.0, 0.1, *SMALL_GRID)


def test_capacity_is_the_analytic_model_at_the_slo_for_these_lengths():
    got = replica_capacity_rps(COST, KNOBS, LengthStats(2000, 40, prompt_p95=3500), 2.0, 0.1)
    w = Workload(1.0, 1.0, 2000, 40, 3500, 3540)
    assert got == capacity_rps(COST, KNOBS, w, 2.0, 0.1, utilisation_cap=1.0)[0] > 0
    # Longer prompts or outputs cost more replica time per request: fewer requests/s.
    assert replica_capacity_rps(COST, KNOBS, LengthStats(4000, 40), 2.0, 0.1) < got
    assert replica_capacity_rps(COST, KNOBS, LengthStats(2000, 400), 2.0, 0.1) < got
    assert replica_capacity_rps(COST, KNOBS, LengthStats(2000, 40), 2.0, 0.001) == 0.0


def test_the_table_is_exact_on_its_grid_and_close_between(table):
    prompts, outputs = SMALL_GRID
    for p in prompts[::3]:
        for o in outputs:
            assert table.rps_at(p, o) == pytest.approx(replica_capacity_rps(COST, KNOBS, LengthStats(p, o), 2.0, 0.1))
    rng = random.Random(0)
    for _ in range(15):
        p, o = rng.uniform(prompts[0], prompts[-1]), rng.uniform(outputs[0], outputs[-1])
        exact = replica_capacity_rps(COST, KNOBS, LengthStats(p, o), 2.0, 0.1)
        assert table.rps_at(p, o) == pytest.approx(exact, rel=0.12)
    # Outside the grid it holds the edge value rather than extrapolating.
    assert table.rps_at(1.0, 1.0) == table.rps_at(prompts[0], outputs[0])


def test_the_table_travels_as_plain_json(table):
    assert CapacityTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table


def _ctx(lengths: dict[str, tuple[float, float, float]]):
    """A duck-typed Serve AutoscalingContext: replica -> (prompt mean, output mean, requests)."""
    point = lambda v: [SimpleNamespace(timestamp=99.0, value=v)]  # noqa: E731
    raw = {sa.STAT_PROMPT_TOKENS: {r: point(p) for r, (p, _, _) in lengths.items()},
           sa.STAT_OUTPUT_TOKENS: {r: point(o) for r, (_, o, _) in lengths.items()},
           sa.STAT_LENGTH_SAMPLES: {r: point(n) for r, (_, _, n) in lengths.items()}}
    return SimpleNamespace(app_name=None, deployment_name="engine-m", raw_metrics=raw, aggregated_metrics={}, running_replicas=list(lengths),
                           current_time=100.0, policy_state={}, target_num_replicas=len(lengths),
                           current_num_replicas=len(lengths))


def test_the_adapter_re_estimates_capacity_for_the_lengths_replicas_report(table):
    config = AutoscaleConfig(replica_capacity_rps=1.0)
    ctx = _ctx({"a": (1000.0, 20.0, 30.0), "b": (4000.0, 100.0, 10.0)})
    # Weighted by requests: (30 x 1000 + 10 x 4000) / 40 = 1750 prompt, (600 + 1000) / 40 = 40 output.
    assert sa.observed_lengths(ctx) == LengthStats(1750.0, 40.0)
    got = sa.with_observed_capacity(config, ctx, table)
    assert got.replica_capacity_rps == pytest.approx(table.rps_at(1750.0, 40.0)) and got.replica_capacity_rps > 1
    assert sa.with_observed_capacity(config, ctx, None) is config  # no table: the configured figure
    few = _ctx({"a": (1000.0, 20.0, sa.MIN_LENGTH_SAMPLES - 1)})
    assert sa.with_observed_capacity(config, few, table) is config
    # The policy is told the new figure: its reason quotes the rate per replica it scaled with.
    _, state = sa.decide_from_context(ctx, config, capacity=table)
    reason = state[sa.DECISION_KEY]["reason"]
    assert f"at {got.replica_capacity_rps * config.target_utilization:.2f} rps/replica" in reason


def test_the_table_reaches_the_policy_through_serves_kwargs(table):
    config = AutoscaleConfig()
    kwargs = serve_autoscaling_config(config, table)["policy"]["policy_kwargs"]
    policy = sa.HbmServeAutoscalingPolicy(**json.loads(json.dumps(kwargs)))
    assert policy.capacity == table and policy.config == config
    assert "capacity_by_length" not in serve_autoscaling_config(config)["policy"]["policy_kwargs"]


def test_stats_carry_the_length_means_only_when_requests_finished():
    base = dict(waiting=0, running=0, kv_usage=0.0, ttft_samples_s=(), tpot_samples_s=(), arrival_rps=0.0,
                load_s=1.0)
    assert sa.STAT_PROMPT_TOKENS not in autoscaling_stats(**base)
    stats = autoscaling_stats(**base, lengths=(2000.0, 40.0, 7))
    assert (stats[sa.STAT_PROMPT_TOKENS], stats[sa.STAT_OUTPUT_TOKENS], stats[sa.STAT_LENGTH_SAMPLES]) == (2000, 40, 7)


def test_request_lengths_read_usage_or_estimate():
    usage = {"usage": {"prompt_tokens": 1500, "completion_tokens": 33, "total_tokens": 1533}}
    assert request_lengths(json.dumps(usage).encode(), 10, 1) == (1500, 33)  # a whole JSON reply
    sse = b"data: " + json.dumps({"choices": [], **usage}).encode() + b"\n\n"
    assert request_lengths(sse, 10, 35) == (1500, 33)  # the include_usage chunk of a stream
    assert request_lengths(b'data: {"choices": [{"delta": {}}]}\n\n', 8000, 35) == (2000, 35)  # estimated
    assert request_lengths(b'data: {"usage": null}\n\n', 400, 3) == (100, 3)


def test_the_middleware_records_each_finished_requests_lengths():
    class Streamer:
        async def __call__(self, scope, receive, send):
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(5):
                await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def run(counters):
        mw = ReplicaMiddleware(Streamer(), AdmissionBudget(8), "t", counters, lambda: EngineLoad(0, 0, 0.0))
        scope = {"type": "http", "method": "POST", "path": "/v1/completions",
                 "headers": [(b"x-hbmserve-internal", b"t")]}

        async def receive():
            return {"type": "http.request", "body": b"x" * 4000, "more_body": False}

        async def send(message):
            pass

        await mw(scope, receive, send)
        await mw(scope, receive, send)

    counters = LoadCounters()
    asyncio.run(run(counters))
    assert counters.length_means(time.monotonic()) == (1000.0, 5.0, 2)

"""Engine metrics under vLLM's names (the sim's copies), their relabelling to hbmserve_*, and
quantiles read from histogram buckets as PromQL's histogram_quantile reads them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.core.histogram import from_buckets, merge, quantile
from hbmserve.core.records import Histogram
from hbmserve.deployments.ingress.door_metrics import merge_families
from hbmserve.deployments.wire.engine_metrics import (CONNECTOR_FAMILIES, ENGINE_FAMILIES, TPOT, TTFT, exposition, histogram_of,
                                                 parse_engine_text, relabel)
from hbmserve.deployments.replica.sim_metrics import TTFT_BUCKETS, GaugeStats, SimEngineMetrics


def sim_metrics(stats=GaugeStats(2, 1, 0.25, 3, 640, 512)) -> SimEngineMetrics:
    return SimEngineMetrics("llama", lambda: stats)


def test_the_sim_engine_exports_every_family_vllm_does_under_its_names():
    m = sim_metrics()
    timer = m.request(arrived=10.0, prompt_tokens=100)
    for at in (10.3, 10.35, 10.45, 10.5):  # first token after 0.3 s, then gaps of 50, 100, 50 ms
        timer.token(at)
    timer.finish()
    families = m.families()
    # The connector's families too: every simulated engine can take a prefill replica's KV.
    assert {f.name for f in families} == set(ENGINE_FAMILIES) | set(CONNECTOR_FAMILIES)
    ttft = histogram_of(families, TTFT)
    assert ttft.count == 1 and ttft.sum == pytest.approx(0.3)
    tpot = histogram_of(families, TPOT)
    assert tpot.count == 1 and tpot.sum == pytest.approx(0.2 / 3)
    values = {s.name: s.value for f in families for s in f.samples if not s.name.endswith("_bucket")}
    assert values["vllm:prompt_tokens_total"] == 100 and values["vllm:generation_tokens_total"] == 4
    assert values["vllm:e2e_request_latency_seconds_sum"] == pytest.approx(0.5)
    assert values["vllm:inter_token_latency_seconds_count"] == 3
    assert (values["vllm:num_requests_waiting"], values["vllm:num_requests_running"],
            values["vllm:kv_cache_usage_perc"], values["vllm:num_preemptions_total"]) == (2, 1, 0.25, 3)
    assert (values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]) == (640, 512)


def test_a_request_cut_short_counts_its_tokens_but_no_latency():
    m = sim_metrics()
    timer = m.request(arrived=0.0, prompt_tokens=7)
    timer.token(0.1)  # the client went away after one token: finish() never runs
    families = m.families()
    assert histogram_of(families, TTFT).count == 1
    assert histogram_of(families, "vllm:e2e_request_latency_seconds").count == 0


def test_relabel_renames_every_sample_and_swaps_model_name_for_model_and_replica():
    m = sim_metrics()
    t = m.request(0.0, 5)
    t.token(0.2)
    t.finish()
    text = exposition(m.families()).decode()
    assert "_created" in text  # prometheus_client's start times travel, and are dropped below
    parsed = parse_engine_text(text)
    out = relabel(parsed, "llama", "replica-1")
    assert {f.name for f in out} == set(ENGINE_FAMILIES.values()) | set(CONNECTOR_FAMILIES.values())
    for f in out:
        for s in f.samples:
            assert s.name.startswith(f.name) and not s.name.endswith("_created")
            assert s.labels["model"] == "llama" and s.labels["replica"] == "replica-1" and s.labels["engine"] == "0"
            assert "model_name" not in s.labels
    # The relabelled buckets are the same histogram.
    assert histogram_of(parsed, TTFT) == histogram_of(m.families(), TTFT)
    assert histogram_of(out, "hbmserve_time_to_first_token_seconds") == histogram_of(m.families(), TTFT)


def test_two_replicas_make_one_family_each_with_both_replicas_samples():
    a, b = sim_metrics(), sim_metrics()
    families = relabel(a.families(), "llama", "a") + relabel(b.families(), "llama", "b")
    merged = merge_families(families)
    assert len(merged) == len(ENGINE_FAMILIES) + len(CONNECTOR_FAMILIES)
    text = exposition(merged).decode()
    assert text.count("# TYPE hbmserve_time_to_first_token_seconds histogram") == 1
    assert 'replica="a"' in text and 'replica="b"' in text


# ---- quantiles from buckets ----

def test_quantile_hand_worked():
    # 10 observations: 2 <= 0.1, 6 more <= 0.5, 2 more <= 1.0, none above.
    h = Histogram(bounds=(0.1, 0.5, 1.0), cumulative=(2, 8, 10), count=10)
    # rank 9.5 of 10 falls in (0.5, 1.0], which holds ranks 8..10: 0.5 + 0.5 * (9.5 - 8) / 2
    assert quantile(h, 0.95) == pytest.approx(0.875)
    # rank 5: in (0.1, 0.5] holding ranks 2..8: 0.1 + 0.4 * 3 / 6
    assert quantile(h, 0.5) == pytest.approx(0.3)
    # rank 1 in the first bucket, which starts at 0
    assert quantile(h, 0.1) == pytest.approx(0.05)
    above = Histogram(bounds=(0.1, 0.5, 1.0), cumulative=(2, 8, 10), count=20)
    assert quantile(above, 0.95) == 1.0  # in the +Inf bucket: the highest finite bound, as PromQL
    assert quantile(Histogram(bounds=(1.0,), cumulative=(0,), count=0), 0.95) is None


def _observe(values: list[float], bounds: tuple[float, ...]) -> Histogram:
    pairs = [(b, sum(1 for v in values if v <= b)) for b in bounds] + [(math.inf, len(values))]
    return from_buckets(pairs, sum(values))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=3000.0), min_size=1, max_size=200),
       st.floats(min_value=0.01, max_value=0.99))
def test_the_quantile_lies_in_the_bucket_of_the_true_quantile(values, q):
    h = _observe(values, TTFT_BUCKETS)
    got = quantile(h, q)
    # The true q-quantile (the ceil(q n)-th smallest observation) and the bucket it falls in.
    true = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
    upper = next((b for b in TTFT_BUCKETS if true <= b), None)
    lower = max((b for b in TTFT_BUCKETS if b < true), default=0.0)
    if upper is None:  # above every finite bound: PromQL answers the highest one
        assert got == TTFT_BUCKETS[-1]
    else:
        assert lower - 1e-9 <= got <= upper + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=50),
       st.lists(st.floats(min_value=0.0, max_value=100.0), max_size=50))
def test_merging_replicas_is_observing_all_their_requests_in_one(a, b):
    merged = merge([_observe(a, TTFT_BUCKETS), _observe(b, TTFT_BUCKETS)])
    together = _observe(a + b, TTFT_BUCKETS)
    assert merged.cumulative == together.cumulative and merged.count == together.count
    assert quantile(merged, 0.95) == quantile(together, 0.95)


def test_histograms_with_different_buckets_do_not_merge():
    with pytest.raises(ValueError, match="bounds differ"):
        merge([Histogram(bounds=(1.0,), cumulative=(1,), count=1), Histogram(bounds=(2.0,), cumulative=(1,), count=1)])
    assert merge([]) is None


def test_a_streamed_reply_records_its_time_per_output_token_as_a_whole_one_does():
    """The stream once stopped reading at its last token, so the request never finished in the
    metrics: streamed replies had TTFT but no TPOT or e2e (found by the pools' Grafana panel)."""
    import asyncio

    import httpx

    from hbmserve.core.config import parse_cluster_spec
    from hbmserve.deployments.replica.engine_replica import replica_budget
    from hbmserve.deployments.replica.sim_server import SimHttpServer

    model = parse_cluster_spec({"models": [{"name": "m", "source": "sim", "engine": "sim",
                                             "sim": {"speedup": 100.0}}]}).models[0]

    async def go():
        server = SimHttpServer(model, "127.0.0.1", replica_budget(model), "t")
        url = await server.start()
        async with httpx.AsyncClient(base_url=url, headers={"x-hbmserve-internal": "t"}) as client:
            for stream in (True, False):
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 5,
                                                               "stream": stream})
                assert r.status_code == 200
        families = server.metrics.families()
        await server.stop()
        return families

    families = asyncio.run(go())
    assert histogram_of(families, TPOT).count == 2
    assert histogram_of(families, "vllm:e2e_request_latency_seconds").count == 2

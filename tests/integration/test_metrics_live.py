"""Issue 12 requirements 1, 4 and 5 live: a real Prometheus scrapes a real Ray Serve cluster of
simulated engines (Ray's metrics ports, and each front door's /metrics with the admin token, the
targets `hbmserve status --json` lists); after a few requests the hbmserve_* series have data:
TTFT histograms labelled model and replica, refusals by reason and tenant, replicas by role,
$/hour, the prefix cache's counters and the doors' KV index (the simulated replicas publish KV
events with prefix caching on). `hbmserve status --json` carries p95 TTFT/TPOT against the SLO, roles and $/hour. Then
every query of the Grafana dashboard (ops/grafana/hbmserve.json), one test per panel target,
returns data from that Prometheus; the panels marked GPU-only or KV-events-only are skipped,
saying so, where the cluster has none of their series.

Owns the local head for the module (see test_sim_serving.py on ordering): `down` before and after.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from hbmserve.ops.grafana.queries import answer_problem, load, metric_families, panel_queries, variable_queries

pytestmark = pytest.mark.integration
MODEL = "llama-8b-metrics"
PORT = 18300
KEY = "metrics-tenant-key-0123456789"
UNLIMITED = "metrics-unlimited-key-0123456789"  # traffic for the dashboard's rates, after the refusals
ADMIN = "metrics-admin-token-0123456789"
PER_MINUTE = 4  # the tenant's request rate: the fifth and sixth requests are refused
BODY = {"model": MODEL, "prompt": "count my tokens", "max_tokens": 16}
ADAPTER = f"{MODEL}-lora"  # a LoRA adapter of the model: the adapter panels read its requests
SPLIT = "llama-8b-split"  # a disaggregated model (a prefill and a decode replica): the pools' panels
# The dashboard's queries as Grafana sends them with this cluster's model chosen; a rate window
# of a minute holds the requests the fixture sends once Prometheus scrapes (every second).
PANEL_QUERIES = panel_queries(load(), {"model": f"{MODEL}|{SPLIT}", "__rate_interval": "1m"}) + variable_queries(load())
DATA_WAIT_S = 20  # Ray's metrics agent exports gauges every few seconds


@pytest.fixture(scope="module")
def metered(head, tmp_path_factory):
    d = tmp_path_factory.mktemp("metrics-config")
    (d / "keys.yaml").write_text(f"tenants: [{{name: acme, keys: ['{KEY}'], requests_per_minute: {PER_MINUTE}}}, "
                                 f"{{name: bulk, keys: ['{UNLIMITED}']}}]\n")
    (d / "admin").write_text(ADMIN + "\n")
    cfg = d / "cluster.yaml"
    cfg.write_text(
        f"""name: hbmserve-metrics-test
serve:
  http: {{host: 127.0.0.1, port: {PORT}}}
  auth: {{keys_file: {d / 'keys.yaml'}, admin_token_file: {d / 'admin'}}}
models:
  - name: {MODEL}
    source: simulated
    engine: sim
    engine_settings: {{max_model_len: 2048, max_num_seqs: 4, enable_prefix_caching: true}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 10}}
    adapters: [{{name: {ADAPTER}, source: /unused}}]
    slo: {{ttft_p95_ms: 2000, tpot_p95_ms: 100}}
    autoscaling: {{min_replicas: 1, max_replicas: 2, hot_standby: {{min: 1, max: 1}}, upscale_delay_s: 1}}
  - name: {SPLIT}
    source: simulated
    engine: sim
    engine_settings: {{max_model_len: 2048, max_num_seqs: 4}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 10}}
    disaggregation: {{prefill: {{replicas: 1}}, decode: {{replicas: 1}}, connector: sim}}
"""
    )
    with head(cfg, PORT) as running:
        yield running["url"]


@pytest.fixture(scope="module")
def scraped(metered, cli, tmp_path_factory):
    """The acme tenant's requests (the last two refused), `hbmserve status --json`, and a
    Prometheus scraping the targets it lists: (codes, printed status, Prometheus)."""
    from tests.integration.prometheus_server import prometheus_server

    tenant = {"authorization": f"Bearer {KEY}"}
    codes = [httpx.post(f"{metered}/v1/completions", json=BODY, headers=tenant, timeout=60).status_code
             for _ in range(PER_MINUTE + 2)]
    r = cli("status", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout.strip().splitlines()[-1])
    rays = [f"127.0.0.1:{t.rsplit(':', 1)[1]}" for t in printed["metrics_targets"]]
    doors = printed["door_metrics_targets"]
    assert doors and rays
    with prometheus_server(rays, tmp_path_factory.mktemp("prometheus"), doors=doors, admin_token=ADMIN) as prom:
        yield codes, printed, prom


def test_hbmserve_series_reach_a_real_prometheus_and_status_reports_them(metered, scraped):
    codes, printed, prom = scraped
    assert codes == [200] * PER_MINUTE + [429, 429], codes
    assert httpx.get(f"{metered}/metrics", timeout=10).status_code == 401  # deny by default

    (model,) = [m for m in printed["models"] if m["name"] == MODEL]
    assert model["latency"]["requests"] == PER_MINUTE
    assert 0 < model["latency"]["ttft_p95_s"] and model["latency"]["slo_ttft_p95_s"] == 2.0
    assert model["latency"]["tpot_p95_s"] > 0 and model["latency"]["slo_tpot_p95_s"] == 0.1
    assert model["roles"]["active"] == 1
    assert model["usd_per_hour"] > 0

    m = f'model="{MODEL}"'
    ttft = prom.wait_for(f"sum(hbmserve_time_to_first_token_seconds_count{{{m}}})", lambda v: v == PER_MINUTE, 30)
    by_replica = prom.query(f'hbmserve_time_to_first_token_seconds_bucket{{{m}, le="+Inf"}}')
    refused = prom.wait_for(f'hbmserve_refusals_total{{{m}, reason="rate_limit_exceeded", tenant="acme"}}',
                            lambda v: v == 2, 10)
    cost = prom.wait_for(f"sum(hbmserve_cost_usd_per_hour{{{m}}})", lambda v: v > 0, 10)
    slo = prom.wait_for(f'max(hbmserve_slo_seconds{{{m}, kind="tpot"}})', lambda v: v == 0.1, 10)
    app = f'application="{MODEL}"'
    active = prom.wait_for(f'ray_hbmserve_replicas{{{app}, role="active"}}', lambda v: v == 1, 40)
    standby = prom.query(f'ray_hbmserve_replicas{{{app}, role="standby"}}')
    assert [v for _, v in ttft] == [PER_MINUTE], ttft
    assert by_replica and all(s["replica"] and s["engine"] == "0" for s, _ in by_replica), by_replica
    assert [v for _, v in refused] == [2.0], refused
    assert [v for _, v in cost] == [model["usd_per_hour"]], (cost, model["usd_per_hour"])
    assert [v for _, v in slo] == [0.1], slo
    assert [v for _, v in active] == [1.0], active
    assert [v for _, v in standby] == [1.0], standby


@pytest.fixture(scope="module")
def dashboard_data(metered, scraped):
    """Requests while Prometheus scrapes, so the dashboard's rate() and histogram_quantile() have
    an increase inside their window; returns once Prometheus has seen all of them."""
    _, _, prom = scraped
    m = f'model="{MODEL}"'
    before = prom.wait_for(f"sum(hbmserve_time_to_first_token_seconds_count{{{m}}})", lambda v: v >= PER_MINUTE, 30)
    bulk = {"authorization": f"Bearer {UNLIMITED}"}
    n = 4
    codes = [httpx.post(f"{metered}/v1/completions", json=BODY, headers=bulk, timeout=60).status_code for _ in range(n)]
    streamed = {**BODY, "model": ADAPTER, "stream": True}  # the adapter's TTFT is timed on streamed replies
    codes += [httpx.post(f"{metered}/v1/completions", json=streamed, headers=bulk, timeout=60).status_code
              for _ in range(2)]
    split = {**BODY, "model": SPLIT, "prompt": "count my tokens " * 40, "stream": True}
    codes += [httpx.post(f"{metered}/v1/completions", json=split, headers=bulk, timeout=60).status_code
              for _ in range(3)]
    assert codes == [200] * (n + 5), codes
    prom.wait_for(f'sum(hbmserve_disagg_requests_total{{model="{SPLIT}", outcome="two_phase"}})', lambda v: v == 3, 30)
    prom.wait_for(f'sum(hbmserve_adapter_requests_total{{{m}, adapter="{ADAPTER}", code="200"}})', lambda v: v == 2, 30)
    seen = (before[0][1] if before else 0) + n + 2  # the adapter's requests ran on the model's engines
    after = prom.wait_for(f"sum(hbmserve_time_to_first_token_seconds_count{{{m}}})", lambda v: v == seen, 30)
    assert [v for _, v in after] == [seen], after
    return prom


@pytest.mark.parametrize("query", PANEL_QUERIES, ids=[f"{q.panel} {q.ref_id}" for q in PANEL_QUERIES])
def test_every_grafana_panel_query_returns_data(dashboard_data, query):
    prom = dashboard_data
    if query.only is not None:
        # Marked (GPU nodes, KV events): a cluster without them has none of the series at all.
        # Present series are checked like any other panel's.
        families = sorted(metric_families(query.expr))
        names = "|".join(f"{f}(_bucket|_count|_sum)?" for f in families)  # a histogram's series
        if not prom.query(f'count({{__name__=~"{names}"}})'):
            pytest.skip(f"{query.only.rstrip(':')}: panel {query.panel!r} reads series this cluster has none of "
                        f"({', '.join(families)})")
    deadline = time.monotonic() + DATA_WAIT_S
    while (problem := answer_problem(prom.answer(query.expr))) is not None and time.monotonic() < deadline:
        time.sleep(1)
    assert problem is None, f"panel {query.panel!r} ({query.ref_id}): {problem}\n{query.expr}"

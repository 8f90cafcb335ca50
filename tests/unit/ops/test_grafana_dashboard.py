"""The Grafana dashboard (ops/grafana/hbmserve.json) without a Prometheus: its shape, every
panel's PromQL parsed by promtool, the metrics it reads listed in the README (at the endpoint
that serves them), the GPU-only marker on exactly the panels that read GPU-only series, and how
the live test judges an answer. The queries are run for data in test_metrics_live.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hbmserve.ops.grafana.queries import (ADAPTERS_ONLY, DISAGG_ONLY, GPU_ONLY, KV_EVENTS_ONLY, PanelQuery, UnknownVariable, answer_problem, load,
                                          metric_families, panel_queries, panels, substitute, variable_queries)

README = Path(__file__).resolve().parents[3] / "README.md"
VALUES = {"model": "llama-8b", "__rate_interval": "1m"}
# Series that exist only on GPU nodes: NVML's gauges, and the placement check of planned GPU replicas.
GPU_SERIES = ("hbmserve_gpu_", "ray_hbmserve_placement_")
# Series that exist only for models whose engines publish KV events: the doors' KV index.
KV_SERIES = ("hbmserve_kv_index_", "hbmserve_kv_event_")
ADAPTER_SERIES = ("hbmserve_adapter_",)


def readme_metrics() -> tuple[set[str], set[str]]:
    """(front door families, Ray families) named in the README's Metrics section. A row's
    shorthand (`_crossed_groups` after `hbmserve_placement_verified`) is the row's first name's
    first two words plus the shorthand."""
    section = README.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    door_part, ray_part = section.split("Through Ray's metrics port", 1)

    def names(text: str) -> set[str]:
        out = set()
        for line in text.splitlines():
            full = re.findall(r"`(hbmserve_\w+)`", line)
            out |= set(full)
            if full:
                stem = "_".join(full[0].split("_")[:2])
                out |= {stem + s for s in re.findall(r"`(_\w+)`", line)}
        return out

    return names(door_part), names(ray_part)


def test_every_panel_has_targets_on_the_datasource_variable():
    dashboard = load()
    assert dashboard["schemaVersion"] >= 39  # Grafana 11 or later
    found = list(panels(dashboard))
    assert len(found) >= 15
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert len({p["title"] for p in found}) == len(found)
    for p in found:
        assert p["targets"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == p["datasource"], (p["title"], t["refId"])
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]


def test_variables_are_a_prometheus_datasource_and_the_models_from_label_values():
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["datasource"]["uid"] == "${datasource}"
    assert variables["model"]["multi"] and variables["model"]["includeAll"]
    assert variable_queries(load()) == [PanelQuery("variable model", "-", "group by (model) (hbmserve_slo_seconds)",
                                                   None)]


def test_substitution_fills_every_variable_and_refuses_an_unknown_one():
    assert substitute('x{model=~"$model"}[${__rate_interval}] ${model:regex}', VALUES) == 'x{model=~"llama-8b"}[1m] llama-8b'
    with pytest.raises(UnknownVariable, match=r"\$tenant"):
        substitute('x{tenant="$tenant"}', VALUES)
    for q in panel_queries(load(), VALUES):
        assert "$" not in q.expr, q


def test_every_expression_parses(tmp_path):
    """promtool parses recording rules' expressions offline: one rule per panel target."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (`make test` installs Debian's prometheus package)")
    queries = panel_queries(load(), VALUES) + variable_queries(load())
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"panel:{i}", "expr": q.expr}
                                                        for i, q in enumerate(queries)]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    ok = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"SUCCESS: {len(queries)} rules found" in ok.stdout
    # And promtool does refuse a broken one, so the check above can fail.
    rules["groups"][0]["rules"] = [{"record": "panel:bad", "expr": "sum(rate(x[5m])"}]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    assert subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True).returncode


def test_every_metric_read_is_in_the_readme_at_the_endpoint_that_serves_it():
    door, ray = readme_metrics()
    assert "hbmserve_slo_seconds" in door and "hbmserve_placement_crossed_groups" in ray  # the parser works
    read = set().union(*(metric_families(q.expr) for q in panel_queries(load(), VALUES)))
    for name in read:
        if name.startswith("ray_"):
            assert name.removeprefix("ray_") in ray, f"{name}: not a Ray-port metric in the README"
        else:
            assert name in door, f"{name}: not a front-door metric in the README"
    # What issue 12 asks the dashboard to show, each read by some panel.
    wanted = {"hbmserve_time_to_first_token_seconds", "hbmserve_time_per_output_token_seconds", "hbmserve_slo_seconds",
              "hbmserve_requests_waiting", "hbmserve_door_queued_requests", "hbmserve_requests_running",
              "hbmserve_kv_cache_usage", "hbmserve_prompt_tokens_total", "hbmserve_generation_tokens_total",
              "hbmserve_refusals_total", "hbmserve_preemptions_total", "hbmserve_cost_usd_per_hour",
              "ray_hbmserve_replicas", "ray_hbmserve_autoscale_target_replicas", "ray_hbmserve_autoscale_last_action",
              "ray_hbmserve_placement_verified", "hbmserve_gpu_utilization", "hbmserve_gpu_memory_used_bytes",
              "hbmserve_gpu_nvlink_bytes_total", "hbmserve_prefix_cache_hits_total", "hbmserve_prefix_cache_queries_total",
              "hbmserve_kv_index_blocks", "hbmserve_kv_index_untrusted_replicas", "hbmserve_kv_index_lag_seconds",
              "hbmserve_kv_event_batches_total", "hbmserve_kv_index_gaps_total", "hbmserve_adapter_requests_total",
              "hbmserve_adapter_ttft_seconds", "hbmserve_adapter_loads_total", "hbmserve_adapter_unloads_total",
              "hbmserve_adapter_resident_replicas"}
    assert wanted <= read, wanted - read


def test_metric_families_drop_histogram_suffixes_and_keep_rays_prefix():
    expr = ('histogram_quantile(0.95, sum by (le) (rate(hbmserve_ttft_seconds_bucket[1m]))) / '
            'hbmserve_ttft_seconds_count + on() ray_hbmserve_replicas{role="active"}')
    assert metric_families(expr) == {"hbmserve_ttft_seconds", "ray_hbmserve_replicas"}


def test_marks_name_exactly_the_panels_whose_series_only_some_clusters_have():
    """The live test skips a marked panel where its series are absent: a mark on any other panel
    would hide it."""
    for p in panels(load()):
        read = set().union(*(metric_families(t["expr"]) for t in p["targets"]))
        for mark, series in ((GPU_ONLY, GPU_SERIES), (KV_EVENTS_ONLY, KV_SERIES), (ADAPTERS_ONLY, ADAPTER_SERIES)):
            assert p["description"].startswith(mark) == all(name.startswith(series) for name in read), p["title"]
        # A disaggregated model's panels read its pools' series (`pool` set) or its two-phase counts.
        pools = all("pool" in t["expr"] or "hbmserve_disagg_" in t["expr"] for t in p["targets"])
        assert p["description"].startswith(DISAGG_ONLY) == pools, p["title"]
    marked = {q.panel: q.only for q in panel_queries(load(), VALUES) if q.only}
    assert marked == {"Placement verified": GPU_ONLY, "GPU utilisation": GPU_ONLY, "GPU memory used": GPU_ONLY,
                      "NVLink throughput": GPU_ONLY, "KV index: blocks and trust": KV_EVENTS_ONLY,
                      "KV events: lag and losses": KV_EVENTS_ONLY, "Adapter requests/s": ADAPTERS_ONLY,
                      "Adapter p95 time to first token": ADAPTERS_ONLY, "Adapter loads and unloads/min": ADAPTERS_ONLY,
                      "Disaggregated requests/s by how they ran": DISAGG_ONLY,
                      "KV loaded from the prefill pool": DISAGG_ONLY, "p95 TTFT and TPOT by pool": DISAGG_ONLY}


def _vector(*values: str) -> dict:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": {"model": "m"}, "value": [1.0, v]} for v in values]}}


@pytest.mark.parametrize("answer, problem", [
    (_vector("0.25"), None),
    (_vector("0"), None),  # idle is data
    (_vector("NaN", "0.5"), None),  # one model without traffic beside one with
    (_vector("+Inf"), None),
    (_vector(), "empty result"),
    (_vector("NaN"), "only NaN in 1 series"),
    ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "error: bad_data: parse error"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "NaN"], [2, "3"]]}]}},
     None),
    ({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}, None),
])
def test_an_answer_is_judged_as_a_panel_would_draw_it(answer, problem):
    assert answer_problem(answer) == problem

"""One autoscaling config: every entry point hands `decide` the same AutoscaleConfig for a model.

The model below states every field a user can set, and its `autoscaling` section is the one
`hbmserve plan` emits for its top plan (as a user would paste it). The config `decide`
receives is captured at each entry point: the live Ray Serve policy (built from the kwargs the
deployment hands Serve), `hbmserve simulate --policy hbmserve` and `hbmserve autoscale
evaluate --policy hbmserve`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hbmserve.autoscale import registry
from hbmserve.autoscale.policy_config import autoscale_config_for
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.capacity.perf.hardware import load_catalog
from hbmserve.capacity.perf.scenario import scenario_for, tpot_floor_s
from hbmserve.cli.main import build_app
from hbmserve.core.config import parse_cluster_spec
from hbmserve.deployments.control.autoscaling import HbmServeAutoscalingPolicy
from hbmserve.deployments.apps.options import model_options

MODEL = {
    "name": "m70", "source": "meta-llama/Llama-3.1-70B-Instruct", "engine": "vllm-gpu",
    "engine_settings": {"max_model_len": 8192, "max_num_seqs": 64, "max_num_batched_tokens": 1024},
    "parallelism": {"tp": 4},
    "slo": {"ttft_p95_ms": 1500, "tpot_p95_ms": 80},
    "hardware": {"gpu": "h100-sxm"},
    "sim": {"model_config_name": "llama-3.1-70b"},
}
app = build_app()
TUNING = {"target_queue_per_replica": 3, "startup_s": {"hot": 2, "warm": 30, "cold": 200},
          "upscale_delay_s": 3, "downscale_delay_s": 40, "downscale_cooldown_s": 20,
          "hot_standby": {"min": 1, "max": 2}, "warm_pool": {"min": 0, "max": 3}}


@pytest.fixture(scope="module")
def planned_section(tmp_path_factory) -> dict:
    """The `autoscaling` section of `hbmserve plan --json`'s top plan for this model and SLO."""
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-70b", "--gpus", "h100",
                                 "--rate", "2", "--duration", "120", "--slo-ttft-p95", "1.5",
                                 "--slo-tpot-p95", "0.08", "--json", "--confirm-top", "1",
                                 "--top", "1"])
    assert r.exit_code in (0, 1), r.output
    (top,) = json.loads(r.stdout)
    section = top["autoscaling"]
    assert section["replica_capacity_rps"] == top["capacity_rps_per_replica"] > 0
    assert section["min_replicas"] == max(1, top["replicas"])
    return section


@pytest.fixture()
def files(tmp_path: Path, planned_section: dict) -> tuple[Path, Path]:
    cfg = tmp_path / "cluster.yaml"
    model = {**MODEL, "autoscaling": {**planned_section, **TUNING}}
    cfg.write_text(yaml.safe_dump({"models": [model]}))
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{i * 0.5},{500 + i},{50}\n" for i in range(60)))
    return cfg, trace


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[AutoscaleConfig]:
    """Swap the registry's hbmserve entry for one that records the config `decide` receives."""
    seen: list[AutoscaleConfig] = []
    entry = registry.POLICIES["hbmserve"]

    def decide(snapshot, config, state):
        seen.append(config)
        return entry.decide(snapshot, config, state)

    monkeypatch.setitem(registry.POLICIES, "hbmserve", dataclasses.replace(entry, decide=decide))
    return seen


def test_every_entry_point_hands_decide_the_same_config(files, monkeypatch):
    cfg, trace = files
    model = parse_cluster_spec(yaml.safe_load(cfg.read_text())).models[0]
    floor = tpot_floor_s(scenario_for(model, load_catalog()))
    expected = autoscale_config_for(model, tpot_floor_s=floor)
    assert expected is not None and 0 < expected.tpot_floor_s < expected.tpot_p95_target_s

    kwargs = model_options(model).autoscaling_config["policy"]["policy_kwargs"]
    live = HbmServeAutoscalingPolicy(**kwargs).config

    seen = _recording(monkeypatch)
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--json",
                                 "--policy", "hbmserve"])
    assert r.exit_code == 0, r.output
    simulated = set(seen)

    seen.clear()
    r = CliRunner().invoke(app, ["autoscale", "evaluate", "--config", str(cfg), "--trace",
                                 str(trace), "--policy", "hbmserve", "--json"])
    assert r.exit_code == 0, r.output
    evaluated = set(seen)

    assert live == expected
    assert kwargs["capacity_by_length"]  # the live adapter re-estimates capacity from lengths
    assert simulated == {expected}
    assert evaluated == {expected}
    # Every field the file sets arrived, the TPOT SLO included (simulate used to drop it).
    assert expected.tpot_p95_target_s == pytest.approx(0.08)
    assert (expected.startup_hot_s, expected.startup_warm_s, expected.startup_cold_s) == (2, 30, 200)
    assert (expected.warm_pool_max, expected.hot_standby_min) == (3, 1)


def test_start_up_overrides_on_the_command_line_reach_decide(files, monkeypatch):
    cfg, trace = files
    seen = _recording(monkeypatch)
    for argv in (["simulate", "--config", str(cfg), "--json"],
                 ["autoscale", "evaluate", "--config", str(cfg), "--json"]):
        seen.clear()
        r = CliRunner().invoke(app, [*argv, "--trace", str(trace), "--policy", "hbmserve",
                                     "--startup-cold", "300"])
        assert r.exit_code == 0, r.output
        assert {(c.startup_hot_s, c.startup_warm_s, c.startup_cold_s) for c in seen} == {(2, 30, 300)}


def test_an_unstated_capacity_is_estimated_from_the_trace_and_a_stated_one_wins():
    base = {**MODEL, "autoscaling": {"min_replicas": 1, "max_replicas": 4}}
    unstated = parse_cluster_spec({"models": [base]}).models[0]
    assert autoscale_config_for(unstated).replica_capacity_rps == 1.0  # the schema's default
    assert autoscale_config_for(unstated, 3.5).replica_capacity_rps == 3.5
    stated = parse_cluster_spec({"models": [{**base, "autoscaling": {
        **base["autoscaling"], "replica_capacity_rps": 1.0}}]}).models[0]
    assert autoscale_config_for(stated, 3.5).replica_capacity_rps == 1.0


def test_every_schema_default_is_the_policy_default():
    """One set of defaults: a bare `autoscaling: {}` gives the policy's own defaults for every
    field the schema exposes, except the bounds and pools the schema deliberately narrows."""
    model = parse_cluster_spec({"models": [{**MODEL, "autoscaling": {}}]}).models[0]
    built = autoscale_config_for(model)
    narrowed = {"min_replicas", "max_replicas", "ttft_p95_target_s", "tpot_p95_target_s",
                "hot_standby_max", "warm_pool_max"}
    default = AutoscaleConfig()
    differ = {f.name for f in dataclasses.fields(AutoscaleConfig)
              if getattr(built, f.name) != getattr(default, f.name)}
    assert differ <= narrowed, differ

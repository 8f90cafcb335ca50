"""A plan as a cluster config (capacity/planning/emit_config.py): the file loads with the config schema and
says what the plan says; the header is a comment that leaves the YAML as it was."""

from __future__ import annotations

from dataclasses import replace

import yaml

from hbmserve.core.config import SloSeconds, parse_cluster_spec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.capacity.planning.emit_config import COMMENT_WIDTH, EmitTarget, cluster_config, model_name, render
from hbmserve.capacity.planning.plan_types import PlanCandidate

PLAN = PlanCandidate(gpu="h100-sxm", tp=4, pp=1, replicas=2, warm_replicas=3, quantization="fp8", max_num_seqs=128,
                     max_num_batched_tokens=1344, chunked_prefill=True, ttft_p95_s=0.5, tpot_p95_s=0.06,
                     usd_per_hour=60.0, status="confirmed", reason="", capacity_rps_per_replica=2.34567,
                     max_model_len=8192)
TARGET = EmitTarget("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", SloSeconds(2.0, 0.1), 3.0)


def test_the_config_loads_and_holds_the_plan():
    m = parse_cluster_spec(cluster_config(PLAN, TARGET)).models[0]
    es, a = m.engine_settings, m.autoscaling
    assert (m.name, m.source, m.engine, m.sim.model_config_name) == \
        ("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", EngineKind.VLLM_GPU, "llama-3.1-70b")
    assert (es.max_num_seqs, es.max_num_batched_tokens, es.enable_chunked_prefill, es.max_model_len,
            es.quantization) == (128, 1344, True, 8192, "fp8")
    assert (m.parallelism.tp, m.parallelism.pp, m.hardware.gpu, m.hardware.usd_per_gpu_hour) == (4, 1, "h100-sxm", 3.0)
    assert (m.slo.ttft_p95_ms, m.slo.tpot_p95_ms) == (2000, 100)
    # The floor is the active fleet, the ceiling adds the warm replicas (PlanCandidate.autoscaling).
    assert (a.min_replicas, a.max_replicas, a.replica_capacity_rps) == (2, 5, 2.346)
    assert "startup_s" not in a.model_fields_set  # none given: the drivers estimate it


def test_a_lowered_budget_and_the_start_up_estimate_are_written_as_given():
    m = parse_cluster_spec(cluster_config(PLAN, TARGET, 1280, {"hot": 1.44, "warm": 33.33, "cold": 156.25})).models[0]
    assert m.engine_settings.max_num_batched_tokens == 1280
    assert m.autoscaling.startup_s.model_dump() == {"hot": 1.4, "warm": 33.3, "cold": 156.2}


def test_the_cpu_catalog_entry_is_served_by_vllm_cpu():
    cpu = replace(PLAN, gpu="cpu-local", tp=1, quantization="bf16")
    m = parse_cluster_spec(cluster_config(cpu, TARGET)).models[0]
    assert m.engine is EngineKind.VLLM_CPU and m.engine_settings.quantization is None


def test_the_header_is_a_comment_wrapped_at_spaces_only():
    config = cluster_config(PLAN, TARGET)
    path = "/tmp/pytest-of-someone/a-very-long-folder-name-with-hyphens/trace.csv"
    text = render(config, [f"Written by `hbmserve plan --trace {path}` " + "word " * 40, "Second paragraph."])
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert yaml.safe_load(text) == config
    assert all(len(line) <= COMMENT_WIDTH for line in header) and any(path in line for line in header)
    assert header[-1] == "# Second paragraph." and not text.splitlines()[len(header)].startswith("#")


def test_a_label_becomes_a_name_the_schema_allows():
    assert model_name("Llama 3.1 (70B)") == "Llama-3.1-70B"
    assert model_name("qwen2.5-32b") == "qwen2.5-32b"

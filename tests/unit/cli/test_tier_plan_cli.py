"""`hbmserve plan-host-tier` through typer's CliRunner, as the README tells a capacity planner to
run it: a config and a JSONL trace with hash_ids in, a table or JSON out, clear errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import typer
from typer.testing import CliRunner

from hbmserve.capacity.traces.prefix_trace import PrefixTraceSpec, prefix_arrivals
from hbmserve.cli.tier_plan import register

CLUSTER = """
models:
  - name: m8
    source: meta-llama/Llama-3.1-8B-Instruct
    engine: vllm-gpu
    engine_settings: {max_model_len: 8192, enable_prefix_caching: %s, gpu_memory_utilization: 0.3}
    replicas: 2
    hardware: {gpu: h100-sxm, usd_per_gpu_hour: 3.0}
    sim: {model_config_name: llama-3.1-8b}
    slo: {ttft_p95_ms: 2000, tpot_p95_ms: 100}
"""


@pytest.fixture
def files(tmp_path):
    arr = prefix_arrivals(PrefixTraceSpec(duration_s=60, session_rps=1.0, think_s=10, max_context_tokens=8192,
                                          block_tokens=512), seed=0)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrived_at": float(t), "input_length": int(p), "output_length": int(o),
                                         "hash_ids": list(h)}) + "\n"
                             for t, p, o, h in zip(arr.t, arr.prompt, arr.output, arr.hashes)))
    for on in ("true", "false"):
        (tmp_path / f"c-{on}.yaml").write_text(CLUSTER % on)
    return tmp_path


def invoke(*args: str, command: str = "plan-host-tier"):
    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, [command, *args])


def test_the_json_lists_every_size_and_the_pick(files):
    r = invoke("--config", str(files / "c-true.yaml"), "--trace", str(files / "t.jsonl"), "--sizes", "0,32",
               "--host-usd-per-gib-hour", "0.001", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [o["host_gib"] for o in out["options"]] == [0, 32] and out["usd_per_gib_hour"] == 0.001
    assert out["best_gib"] in (0, 32) and out["reason"]


def test_the_table_names_the_pick_and_says_the_price_is_a_placeholder(files):
    r = invoke("--config", str(files / "c-true.yaml"), "--trace", str(files / "t.jsonl"), "--sizes", "0,32")
    assert r.exit_code == 0, r.output
    assert "host KV tier sizes on the trace" in r.output and "placeholder" in r.output


@pytest.mark.parametrize("args, message", [
    (("--config", "c-false.yaml", "--trace", "t.jsonl"), "enable_prefix_caching"),
    (("--config", "c-true.yaml", "--trace", "t.jsonl", "--sizes", "0,lots"), "--sizes"),
    (("--config", "c-true.yaml", "--trace", "plain.csv"), "no hash_ids"),
])
def test_bad_input_is_one_clear_error_and_exit_2(files, args, message):
    (files / "plain.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,10\n1.0,120,10\n")
    r = invoke(*(str(files / a) if a.endswith((".yaml", ".jsonl", ".csv")) else a for a in args))
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_a_written_prefix_trace_reads_back_with_its_hashes_and_simulate_takes_it(tmp_path):
    from hbmserve.capacity.traces.arrivals import read_trace
    from hbmserve.capacity.traces.prefix_trace import PREFIX_SHAPES, prefix_arrivals
    from hbmserve.cli.tier_plan import register as register_kv

    app = typer.Typer()
    register_kv(app)
    out = tmp_path / "agent.jsonl"
    r = CliRunner().invoke(app, ["prefix-trace", "--shape", "agent-loops", "--out", str(out), "--seed", "4",
                                 "--duration", "60"])
    assert r.exit_code == 0, r.output
    back, want = read_trace(out), prefix_arrivals(dataclasses.replace(PREFIX_SHAPES["agent-loops"], duration_s=60), 4)
    assert back.hashes == want.hashes and back.prompt.tolist() == want.prompt.tolist()
    assert f"{len(want)} requests (agent-loops, seed 4) written to" in r.output
    bad = CliRunner().invoke(app, ["prefix-trace", "--shape", "chat", "--out", str(out)])
    assert bad.exit_code == 2 and "one of system-prompts, multi-turn, agent-loops" in bad.output

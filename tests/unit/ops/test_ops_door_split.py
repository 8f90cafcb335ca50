"""ops/bench/door_split.py: the three-part split of the door's CPU, and a run against a
simulated door (ops/sim_door in a subprocess; its process is not Ray's, so the door group reads
nothing, but the load, the counts and the report are the real ones)."""

from __future__ import annotations

import json

from hbmserve.ops.bench import door_split
from tests.unit.deployments.ingress.sim_door_process import free_port, sim_door


def test_the_split_takes_fixed_then_per_request_then_per_piece():
    out = {"idle_door_cores": 0.04, "runs": [
        {"tokens": 1, "requests_per_s": 100.0, "ms_per_request": {"door": 1.9}},
        {"tokens": 1, "requests_per_s": 100.0, "ms_per_request": {"door": 1.9}},
        {"tokens": 32, "requests_per_s": 40.0, "ms_per_request": {"door": 4.6}},
    ]}
    got = door_split.split(out)
    # fixed: 0.04 cores over 40 requests/s = 1 ms; a request: 1.9 - 0.4 = 1.5 ms; a piece: (4.6 - 1 - 1.5) / 31
    assert got == {"tokens": 32, "door_ms_per_request": 4.6, "fixed_ms": 1.0, "request_ms": 1.5, "piece_us": 67.7}
    assert door_split.split({"idle_door_cores": 0.0, "runs": out["runs"][2:]}) is None  # no 1-token run


def test_a_run_against_a_simulated_door_counts_its_streams(tmp_path):
    port = free_port()
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(f"""name: split
serve:
  http: {{host: 127.0.0.1, port: {port}}}
models:
  - {{name: sim, source: simulated, engine: sim, replicas: 1,
      sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 20}},
      engine_settings: {{max_model_len: 1024, max_num_seqs: 8}}}}
""")
    trace = tmp_path / "trace.csv"  # outputs of 3 and 50 tokens, the second capped at 5
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,3\n0.5,10,50\n")
    out = tmp_path / "split.json"
    with sim_door(cfg, port) as url:
        door_split.main(["--url", url, "--model", "sim", "--tokens", "1", "4", "--rounds", "1", "--seconds", "1",
                         "--idle", "0.2", "--concurrency", "2", "--trace", str(trace), "--cap", "5", "--out", str(out)])
    got = json.loads(out.read_text())
    assert [r["tokens"] for r in got["runs"]] == [1, 4]
    assert all(r["requests_per_s"] > 0 and r["ms_per_request"]["client"] > 0 for r in got["runs"])
    assert got["split"]["tokens"] == 4
    [shaped] = got["trace"]
    # The requests took the trace's lengths in turn (3, 5, 3, ...): as many of each, give or take one.
    assert shaped["requests"] > 0 and abs(shaped["tokens"] - 4 * shaped["requests"]) <= 1
    assert shaped["cpu_s_per_1k_tokens"]["client"] > 0


def test_a_trace_s_lengths_are_read_in_order_and_capped(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,300\n1.0,10,2\n2.0,10,1200\n")
    assert door_split.trace_lengths(trace, 800) == [300, 2, 800]
    assert door_split._share({"door": 0.05, "engine": 0.4}) == 0.125 and door_split._share({"door": 0.1}) is None

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
    out = tmp_path / "split.json"
    with sim_door(cfg, port) as url:
        door_split.main(["--url", url, "--model", "sim", "--tokens", "1", "4", "--rounds", "1", "--seconds", "1",
                         "--idle", "0.2", "--concurrency", "2", "--out", str(out)])
    got = json.loads(out.read_text())
    assert [r["tokens"] for r in got["runs"]] == [1, 4]
    assert all(r["requests_per_s"] > 0 and r["ms_per_request"]["client"] > 0 for r in got["runs"])
    assert got["split"]["tokens"] == 4

"""How fast the capacity simulator and planner run (issue 3's speed targets).

1. Simulate the whole Azure LLM conv trace (19,366 requests, 58 min) for fixed configurations:
   target <= 20 s wall each on the 2-core dev machine.
2. Plan search for Llama-3.1-70B on the same trace over every catalog GPU (>= 200
   configurations, analytic pruning plus simulated confirmation of the best): target <= 5 min.

Reports the median of --rounds runs and writes JSON.

    python -m hbmserve.ops.bench.sim_speed --rounds 5 --out out/sim_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from hbmserve.capacity.traces.arrivals import read_trace
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu, load_catalog
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, memory_fit
from hbmserve.capacity.planning.planner import SearchSpace, plan

DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"
# (label, model, gpu, tp, replicas)
SIM_CASES = (
    ("70B H100 TP4 x2", "llama-3.1-70b", "h100-sxm", 4, 2),
    ("70B H100 TP4 x1 (saturated)", "llama-3.1-70b", "h100-sxm", 4, 1),
    ("8B L40S TP1 x8", "llama-3.1-8b", "l40s", 1, 8),
)


def sim_case(arr, model: str, gpu: str, tp: int, replicas: int) -> tuple[float, dict]:
    dep = Deployment(load_model_shape(model), get_gpu(gpu), tp=tp)
    eng = EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, max_num_seqs=256, max_num_batched_tokens=8192,
                       max_model_len=16384)
    t0 = time.perf_counter()
    s = simulate(SimCluster(dep, eng, replicas, SloSeconds(2.0, 0.1)), arr).summary
    wall = time.perf_counter() - t0
    return wall, {"finished": s.finished, "ttft_p95_s": s.ttft.p95, "tpot_p95_s": s.tpot.p95,
                  "slo_attainment": s.slo_attainment, "usd_per_mtok": s.usd_per_mtok}


def plan_case(arr, confirm_top: int) -> tuple[float, dict]:
    gpus = [g for n, g in load_catalog().items() if n != "cpu-local"]
    t0 = time.perf_counter()
    res = plan(load_model_shape("llama-3.1-70b"), gpus, arr, SloSeconds(2.0, 0.1), SearchSpace(), confirm_top=confirm_top)
    wall = time.perf_counter() - t0
    top = res.plans[0]
    return wall, {"configs": res.configs_evaluated, "simulated": res.simulated,
                  "top": f"{top.gpu} TP{top.tp} PP{top.pp} {top.quantization} x{top.replicas}+{top.warm_replicas}",
                  "top_usd_per_mtok_blended": top.usd_per_mtok_blended, "feasible": res.feasible}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plan-rounds", type=int, default=3)
    ap.add_argument("--confirm-top", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    arr = read_trace(args.trace)
    rows = []
    for label, model, gpu, tp, reps in SIM_CASES:
        runs = [sim_case(arr, model, gpu, tp, reps) for _ in range(args.rounds)]
        walls = [w for w, _ in runs]
        rows.append({"case": f"simulate {label}", "requests": len(arr), "wall_s_median": statistics.median(walls),
                     "wall_s_runs": walls, "target_s": 20.0, **runs[0][1]})
    runs = [plan_case(arr, args.confirm_top) for _ in range(args.plan_rounds)]
    walls = [w for w, _ in runs]
    rows.append({"case": "plan llama-3.1-70b, all GPUs", "requests": len(arr),
                 "wall_s_median": statistics.median(walls), "wall_s_runs": walls, "target_s": 300.0, **runs[0][1]})
    print(f"{'case':45} {'median s':>9} {'target s':>9}  detail")
    for r in rows:
        detail = {k: v for k, v in r.items() if k not in ("case", "wall_s_median", "wall_s_runs", "target_s")}
        print(f"{r['case']:45} {r['wall_s_median']:9.2f} {r['target_s']:9.0f}  {detail}")
    out = {"machine": f"{platform.machine()} {platform.python_version()}", "trace": str(args.trace), "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

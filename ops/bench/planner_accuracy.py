"""Can a buyer trust `hbmserve plan`? The analytic model against the simulator, and the TPOT
batch cap on prompt-heavy traffic (issue 14, requirements 3 and 4).

1. For each trace: plan Llama-3.1-70B over every catalog GPU with the default search space
   (bf16 and fp8, SLO-derived engine knobs), confirm the best distinct layouts in the simulator,
   and report every confirmed plan: the analytic capacity per replica against the simulated
   one (the analytic model's error), the analytic price against the confirmed one, and the
   per-token costs.
2. `--chunk-sweep`: on the first trace, Llama-3.1-70B on H100 TP=4 bf16, max_num_seqs 128, one
   row per token budget (256 ... 8,192 and the TPOT cap): the time of a step carrying a full
   chunk, one replica's simulated capacity within the SLO, and a fixed fleet replaying the trace.

    python tests/unit/data/code_completion_trace.py --out out/code_completion.csv
    python -m hbmserve.ops.bench.planner_accuracy --trace out/code_completion.csv \\
        --trace ../shared/data/traces/azure_llm_2023_conv.csv --chunk-sweep --out out/planner_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from hbmserve.capacity.traces.arrivals import read_trace
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu, load_catalog
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.perf.slo_cap import budget_for, chunk_step_s
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.planning.confirm import simulated_capacity_rps
from hbmserve.capacity.planning.planner import SearchSpace, plan, workload_of

SLO = SloSeconds(2.0, 0.1)
MODEL = "llama-3.1-70b"


def plan_rows(trace: Path, confirm_top: int) -> dict:
    arr = read_trace(trace)
    gpus = [g for n, g in load_catalog().items() if n != "cpu-local"]
    t0 = time.perf_counter()
    res = plan(load_model_shape(MODEL), gpus, arr, SLO, SearchSpace(), confirm_top=confirm_top)
    wall = time.perf_counter() - t0
    rows = []
    for p in res.plans:
        if p.source != "simulated":
            continue
        d = p.to_json_dict()
        rows.append({k: d[k] for k in ("gpu", "tp", "pp", "quantization", "max_num_seqs", "max_num_batched_tokens",
                                       "replicas", "warm_replicas", "status", "ttft_p95_s", "tpot_p95_s",
                                       "analytic_capacity_rps", "simulated_capacity_rps", "analytic_error",
                                       "analytic_usd_per_hour", "usd_per_hour", "usd_per_mtok_input",
                                       "usd_per_mtok_output", "usd_per_mtok_blended", "usd_per_1k_requests")})
    errors = [abs(r["analytic_error"]) for r in rows if r["analytic_error"] is not None]
    return {"trace": str(trace), "requests": len(arr), "configs": res.configs_evaluated, "wall_s": wall,
            "max_abs_error": max(errors, default=None), "confirmed": rows, "why": res.why}


def chunk_sweep(trace: Path, replicas: int) -> list[dict]:
    arr = read_trace(trace)
    w = workload_of(arr)
    dep = Deployment(load_model_shape(MODEL), get_gpu("h100-sxm"), 4)
    fit, cost = memory_fit(dep), cost_model(dep)
    ctx = w.prompt_mean + w.output_mean / 2
    cap = budget_for(cost, SLO.tpot_s, 128, ctx, w.prompt_mean)
    rows = []
    for budget in sorted({256, 512, 1024, cap - cap % 64, 2048, 4096, 8192}):
        eng = EngineConfig(num_blocks=fit.kv_tokens // 16, max_num_seqs=128, max_num_batched_tokens=budget,
                           max_model_len=16384)
        one = simulated_capacity_rps(dep, eng, SLO, arr, 5.0)
        s = simulate(SimCluster(dep, eng, replicas, SLO), arr).summary
        rows.append({"max_num_batched_tokens": budget, "tpot_cap": budget == cap - cap % 64,
                     "full_step_s": chunk_step_s(cost, budget, 128, ctx, w.prompt_mean),
                     "replica_capacity_rps": one, "fleet_replicas": replicas, "ttft_p95_s": s.ttft.p95,
                     "tpot_p95_s": s.tpot.p95, "slo_attainment": s.slo_attainment})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, action="append", required=True)
    ap.add_argument("--confirm-top", type=int, default=5)
    ap.add_argument("--chunk-sweep", action="store_true")
    ap.add_argument("--sweep-replicas", type=int, default=2)
    ap.add_argument("--skip-plans", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out: dict = {"machine": f"{platform.machine()} {platform.python_version()}", "model": MODEL,
                 "slo": {"ttft_s": SLO.ttft_s, "tpot_s": SLO.tpot_s}}
    if args.chunk_sweep:
        out["chunk_sweep"] = {"trace": str(args.trace[0]), "rows": chunk_sweep(args.trace[0], args.sweep_replicas)}
    if not args.skip_plans:
        out["plans"] = []
        for trace in args.trace:
            out["plans"].append(plan_rows(trace, args.confirm_top))
            print(json.dumps(out["plans"][-1], indent=1), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

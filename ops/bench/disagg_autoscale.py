"""Two pools, one policy (issue 23 req 5), in the simulator: a disaggregated Llama-3.1-70B (prefill
and decode pools of H100 TP4 replicas, KV over InfiniBand, 45 s start-up) scaled by the one
policy, against the pools scaled apart, every fixed pool pair on the staircase, and the oracle
(capacity/sim/pools/pools_eval.py says how each is run).

Traces (each seed is its own round; every round is reported):
  long-bursts   4x steps of 6k-token prompts, 300-token outputs (TTFT 2 s, TPOT 30 ms)
  long-output   4x steps of 3k-token prompts, 1.5k-token outputs: the decode pool works (same SLO)
  azure-conv    the Azure LLM 2023 conversation trace (../shared/data) at 2x its rate, one of
                its three 580 s windows per seed (TTFT 1 s, TPOT 30 ms)

    python -m hbmserve.ops.bench.disagg_autoscale --seeds 1 2 3 --out out/disagg_autoscale.json \\
        --plot docs/disagg_autoscale.png

Everything here is a simulator prediction on the engine model, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from hbmserve.capacity.traces.arrivals import Arrivals, read_trace
from hbmserve.capacity.traces.burst_trace import BurstSpec, burst_arrivals
from hbmserve.core.config import SloSeconds

AZURE_CONV = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"
WINDOW_S = 580.0  # of the 2x azure trace (1,750 s), per seed: seeds 1-3 are its three windows


def trace(name: str, seed: int, duration_s: float) -> tuple[Arrivals, SloSeconds]:
    if name == "long-bursts":
        spec = BurstSpec(duration_s=duration_s, base_rps=1.0, burst_rps=4.0, bursts=2, burst_s=min(180.0, duration_s / 4),
                         prompt_tokens=6000, output_tokens=300)
        return burst_arrivals(spec, seed), SloSeconds(ttft_s=2.0, tpot_s=0.03)
    if name == "long-output":
        spec = BurstSpec(duration_s=duration_s, base_rps=0.5, burst_rps=2.0, bursts=2, burst_s=min(240.0, duration_s / 4),
                         prompt_tokens=3000, output_tokens=1500)
        return burst_arrivals(spec, seed), SloSeconds(ttft_s=2.0, tpot_s=0.03)
    if name == "azure-conv":
        if not AZURE_CONV.is_file():
            raise SystemExit(f"azure-conv: no trace at {AZURE_CONV}")
        fast = read_trace(AZURE_CONV).scaled(time_scale=0.5)
        start = (seed - 1) % int(fast.duration_s // WINDOW_S) * WINDOW_S
        return fast.window(start, start + WINDOW_S), SloSeconds(ttft_s=1.0, tpot_s=0.03)
    raise SystemExit(f"unknown trace {name!r}: long-bursts, long-output or azure-conv")


def one_round(name: str, seed: int, args) -> dict:
    from hbmserve.capacity.perf.hardware import get_gpu
    from hbmserve.capacity.perf.model_shape import load_model_shape
    from hbmserve.capacity.perf.perf_model import Deployment, cost_model, memory_fit
    from hbmserve.capacity.planning.disagg_plan import decode_seqs_cap
    from hbmserve.capacity.sim.pools.pools_eval import evaluate_pools, pools_case
    from hbmserve.capacity.sim.workload import workload_of

    arr, slo = trace(name, seed, args.duration_s)
    dep = Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4)
    seqs = decode_seqs_cap(cost_model(dep), slo.tpot_s, workload_of(arr), memory_fit(dep).kv_tokens)
    case = pools_case(dep, arr, slo, seqs, link="infiniband", startup_s=45.0, max_prefill=args.max_prefill,
                      max_decode=args.max_decode)
    t0 = time.time()
    ev = evaluate_pools(case, arr, progress=lambda m: print(f"  [{name} seed {seed}] {m}", file=sys.stderr, flush=True))
    runs = [{k: v for k, v in asdict(r).items() if k != "timeline"} for r in ev.runs]
    one = ev.runs[0]
    return {"trace": name, "seed": seed, "requests": len(arr), "aim": ev.aim, "runs": runs,
            "oracle": ev.oracle.name, "cheapest_static": ev.cheapest_static.name if ev.cheapest_static else None,
            "undercuts": ev.undercuts(), "seconds": round(time.time() - t0, 1),
            "one_policy_vs_oracle_gpu_h": one.gpu_hours / ev.oracle.gpu_hours,
            "timelines": {r.name: r.timeline for r in ev.runs[:3]}}


def table(rounds: list[dict]) -> str:
    lines = [f"{'trace':12s} {'seed':>4s} {'run':26s} {'attain':>7s} {'GPU-h':>6s} {'$':>7s} {'TTFT95':>7s} "
             f"{'TPOT95':>7s} {'acts':>4s}"]
    for rd in rounds:
        static = rd["cheapest_static"]
        for r in rd["runs"]:
            if r["name"].startswith("static") and r["name"] != static:
                continue
            lines.append(f"{rd['trace']:12s} {rd['seed']:4d} {r['name'][:26]:26s} {r['slo_attainment']:7.2%} "
                         f"{r['gpu_hours']:6.2f} {r['usd']:7.2f} {r['ttft_p95_s'] or 0:7.2f} "
                         f"{1000 * (r['tpot_p95_s'] or 0):6.1f}ms {r['scale_actions']:4d}")
    return "\n".join(lines)


def plot(rounds: list[dict], path: Path, duration_s: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(rounds), 1, figsize=(9, 2.6 * len(rounds)), squeeze=False)
    for ax, rd in zip(axes[:, 0], rounds):
        arr, _ = trace(rd["trace"], rd["seed"], duration_s)
        bins = np.arange(0.0, float(arr.t[-1]) + 30.0, 30.0)
        rate = ax.twinx()
        rate.stairs(np.histogram(arr.t, bins)[0] / 30.0, bins, color="0.8", fill=True, zorder=0)
        rate.set_ylabel("requests/s", color="0.5")
        ax.set_zorder(rate.get_zorder() + 1)
        ax.patch.set_visible(False)
        for name, style in zip(list(rd["timelines"])[:3:2], ("-", ":")):  # one policy, oracle
            tl = rd["timelines"][name]
            xs = [t for t, _, _ in tl]
            ax.step(xs, [p for _, p, _ in tl], style, where="post", color="tab:blue", label=f"{name[:20]}: prefill")
            ax.step(xs, [d for _, _, d in tl], style, where="post", color="tab:orange", label=f"{name[:20]}: decode")
        ax.set_title(f"{rd['trace']} (seed {rd['seed']})", fontsize=9)
        ax.set_ylabel("replicas")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", nargs="+", default=["long-bursts", "long-output", "azure-conv"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--duration-s", type=float, default=1200.0, help="of the synthetic traces")
    p.add_argument("--max-prefill", type=int, default=6)
    p.add_argument("--max-decode", type=int, default=4)
    p.add_argument("--out", type=Path, default=None, help="JSON of every round")
    p.add_argument("--plot", type=Path, default=None, help="pools over time, one policy against the oracle")
    args = p.parse_args(argv)
    rounds = [one_round(name, seed, args) for name in args.traces for seed in args.seeds]
    print(table(rounds))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rounds": rounds, "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    if args.plot:
        plot([rd for rd in rounds if rd["seed"] == args.seeds[0]], args.plot, args.duration_s)


if __name__ == "__main__":
    main()

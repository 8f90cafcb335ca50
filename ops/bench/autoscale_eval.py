"""Autoscaler evaluation (issue 5, requirement 6): every registered policy side by side in the
simulator on the reference cluster (sim/data/reference_cluster.yaml: Llama-3.1-70B shape,
H100 TP=4, SLO p95 TTFT 2 s / TPOT 0.1 s, 1-16 replicas, start-up 5 s hot / 45 s warm / 180 s
cold), on
  (a) the Azure LLM 2023 conversation trace, whole, as recorded and with token lengths x4
      (`--azure-token-scales`; x4 makes the same arrival process need up to ~10 replicas
      instead of 1-2, so a replica is a finer step); skipped with a reason if the file is absent;
  (b) the synthetic sharp-burst trace (capacity/burst_trace.py, default BurstSpec: 5 req/s with
      four 5-minute steps to 25 req/s in an hour), one run per seed; medians across seeds.

Also one sensitivity row that is NOT a registry baseline: Ray's same default policy with
`target_ongoing_requests` set to what one replica holds at its target load (Little's law:
capacity x target utilisation x static-peak's mean E2E latency), i.e. an operator-tuned Ray.

Also hbmserve with a few other configs (same `decide`, not registry defaults), to show what
configuration alone can and cannot buy: `--variants ''` turns them off.

Target checks (issue 5): hbmserve GPU-hours <= 0.7x static-peak's with SLO attainment >=
static-peak's; SLO attainment >= ray-default's + 10 points with GPU-hours <= ray-default's;
scale actions per hour reported. The simulator is deterministic, so one run per (trace, seed).

    .venv/bin/python ops/bench/autoscale_eval.py --seeds 0,1,2,3,4 --out out/autoscale_eval.json \
        --plot-dir out/autoscale_plots
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from hbmserve.autoscale.baselines import RayDefaultConfig
from hbmserve.capacity.burst_trace import BurstSpec, burst_arrivals
from hbmserve.sim.evaluate import (
    EvalResult,
    TraceScaling,
    evaluate,
    load_eval_cluster,
    scale_trace,
    eval_config,
)
from hbmserve.autoscale.policy import AutoscaleConfig
from hbmserve.autoscale.registry import POLICIES
from hbmserve.capacity.arrivals import read_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"
RAY_TUNED = "ray-default (tuned target)"
# Label -> AutoscaleConfig fields replaced on top of the registry mapping.
VARIANTS = {
    "rate_upscale_delay_s=5": {"rate_upscale_delay_s": 5.0},
    "hot_standby_min=2": {"hot_standby_min": 2},
    "warm_pool_min=3": {"warm_pool_min": 3},
}


def hbmserve_variant(fields: dict[str, Any]):
    base = POLICIES["hbmserve"]
    return dataclasses.replace(base, make_config=lambda c, peak: dataclasses.replace(base.make_config(c, peak), **fields))


def ray_tuned_entry(config: AutoscaleConfig, static: EvalResult):
    e2e = static.summary.e2e.mean or 1.0
    target = max(1.0, round(config.replica_capacity_rps * config.target_utilization * e2e))
    base = POLICIES["ray-default"]
    make = lambda c, peak: RayDefaultConfig(min_replicas=c.min_replicas, max_replicas=c.max_replicas,  # noqa: E731
                                      target_ongoing_requests=target)
    return dataclasses.replace(base, make_config=make), target


def run_case(cluster, arr, variants: list[str]) -> tuple[dict[str, EvalResult], dict[str, Any]]:
    config = eval_config(cluster, arr)
    results = {name: evaluate(name, cluster, arr, config) for name in POLICIES}
    entry, target = ray_tuned_entry(config, results["static-peak"])
    results[RAY_TUNED] = evaluate(RAY_TUNED, cluster, arr, config, entry)
    for v in variants:
        label = f"hbmserve ({v})"
        results[label] = evaluate(label, cluster, arr, config, hbmserve_variant(VARIANTS[v]))
    return results, {"ray_tuned_target_ongoing_requests": target,
                     "replica_capacity_rps": config.replica_capacity_rps, "peak_rps": arr.rate_peak(),
                     "requests": len(arr), "duration_s": arr.duration_s}


def config_of(res: dict[str, EvalResult]) -> dict[str, Any]:
    return dataclasses.asdict(res["hbmserve"].config)


def targets(res: dict[str, EvalResult]) -> dict[str, Any]:
    h, s, r = (res[n].summary for n in ("hbmserve", "static-peak", "ray-default"))
    return {
        "gpu_vs_static_peak": h.gpu_hours / s.gpu_hours,
        "slo_minus_static_peak_pts": 100 * (h.slo_attainment - s.slo_attainment),
        "static_peak_target_met": h.gpu_hours <= 0.7 * s.gpu_hours and h.slo_attainment >= s.slo_attainment,
        "slo_minus_ray_default_pts": 100 * (h.slo_attainment - r.slo_attainment),
        "gpu_vs_ray_default": h.gpu_hours / r.gpu_hours,
        "ray_default_target_met": h.slo_attainment >= r.slo_attainment + 0.10 and h.gpu_hours <= r.gpu_hours,
        "hbmserve_scale_actions_per_hour": res["hbmserve"].scale_actions_per_hour,
    }


def row(name: str, d: dict[str, Any], static_gpu_h: float) -> str:
    ttft = "-" if d["ttft_p95_s"] is None else f"{d['ttft_p95_s']:.2f}"
    return (f"| {name} | {100 * d['slo_attainment']:.2f}% | {ttft} | {d['gpu_hours']:.2f} | "
            f"{d['gpu_hours'] / static_gpu_h:.2f} | {d['mean_replicas']:.2f} / {d['peak_replicas']} | "
            f"{d['scale_actions_per_hour']:.1f} | {d['dropped_requests']} |")


HEADER = ("| policy | SLO attainment | TTFT p95 s | GPU-h | x static-peak | replicas mean / peak | "
          "scale actions / h | dropped |\n|---|---|---|---|---|---|---|---|")


def median_json(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("slo_attainment", "ttft_p95_s", "gpu_hours", "mean_replicas", "peak_replicas",
            "scale_actions_per_hour", "dropped_requests")
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def fmt_targets(t: dict[str, Any]) -> str:
    return (f"hbmserve vs static-peak: GPU-h x{t['gpu_vs_static_peak']:.2f} (target <= 0.70), SLO "
            f"{t['slo_minus_static_peak_pts']:+.2f} pts (target >= 0) -> "
            f"{'met' if t['static_peak_target_met'] else 'missed'}; vs ray-default: SLO "
            f"{t['slo_minus_ray_default_pts']:+.2f} pts (target >= +10) at GPU-h "
            f"x{t['gpu_vs_ray_default']:.2f} (target <= 1) -> "
            f"{'met' if t['ray_default_target_met'] else 'missed'}; hbmserve "
            f"{t['hbmserve_scale_actions_per_hour']:.1f} scale actions/h")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure conv CSV")
    ap.add_argument("--azure-token-scales", default="1,4")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="burst-trace seeds")
    ap.add_argument("--out", type=Path, default=Path("out/autoscale_eval.json"))
    ap.add_argument("--plot-dir", type=Path, default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"hbmserve config variants: {', '.join(VARIANTS)}")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)}")
    cluster = load_eval_cluster()
    report: dict[str, Any] = {"cluster": cluster.source, "startup_s": cluster.model.autoscaling.startup_s.model_dump(),
                              "cases": [], "skipped": []}
    lines: list[str] = []
    t0 = time.perf_counter()

    def plot(results: dict[str, EvalResult], name: str, title: str) -> None:
        if args.plot_dir is None:
            return
        from hbmserve.sim.eval_plot import plot_replicas_vs_load

        args.plot_dir.mkdir(parents=True, exist_ok=True)
        shown = [r for n, r in results.items() if n in POLICIES]  # the registry's four
        plot_replicas_vs_load(shown, args.plot_dir / f"{name}.png", title)

    if args.trace.is_file():
        azure = read_trace(args.trace)
        for k in (float(x) for x in args.azure_token_scales.split(",") if x.strip()):
            arr = scale_trace(azure, TraceScaling(token_scale=k))
            res, info = run_case(cluster, arr, variants)
            t = targets(res)
            static = res["static-peak"].summary.gpu_hours
            name = f"azure-conv tokens x{k:g}"
            report["cases"].append({"name": name, **info, "targets": t, "hbmserve_config": config_of(res),
                                    "results": {n: r.to_json_dict() for n, r in res.items()}})
            lines += [f"\n### {name}: {info['requests']} requests, {info['duration_s'] / 60:.0f} min, "
                      f"{info['replica_capacity_rps']:.2f} req/s per replica, peak {info['peak_rps']:.2f} req/s\n",
                      HEADER, *(row(n, r.to_json_dict(), static) for n, r in res.items()),
                      f"\n{fmt_targets(t)}; tuned Ray target_ongoing_requests = "
                      f"{info['ray_tuned_target_ongoing_requests']:g}"]
            plot(res, f"azure_tokens_x{k:g}", name)
    else:
        report["skipped"].append(f"azure-conv: {args.trace} not found")
        lines.append(f"\nazure-conv skipped: {args.trace} not found")

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        arr = burst_arrivals(BurstSpec(), seed)
        res, info = run_case(cluster, arr, variants)
        per_seed.append({"seed": seed, **info, "targets": targets(res), "hbmserve_config": config_of(res),
                         "results": {n: r.to_json_dict() for n, r in res.items()}})
        if seed == seeds[0]:
            plot(res, f"burst_seed{seed}", f"sharp-burst trace, seed {seed}")
    if per_seed:
        names = list(per_seed[0]["results"])
        med = {n: median_json([c["results"][n] for c in per_seed]) for n in names}
        met = {k: sum(c["targets"][k] for c in per_seed) for k in ("static_peak_target_met", "ray_default_target_met")}
        med_t = {k: statistics.median(c["targets"][k] for c in per_seed)
                 for k in per_seed[0]["targets"] if not k.endswith("_met")}
        report["cases"].append({"name": "sharp-burst", "burst_spec": dataclasses.asdict(BurstSpec()),
                                "seeds": per_seed, "median": med, "median_targets": med_t,
                                "seeds_meeting": met})
        spec0 = per_seed[0]
        lines += [f"\n### sharp-burst trace (BurstSpec defaults), median of {len(seeds)} seeds: "
                  f"~{spec0['requests']} requests, {spec0['replica_capacity_rps']:.2f} req/s per replica\n",
                  HEADER, *(row(n, med[n], med["static-peak"]["gpu_hours"]) for n in names),
                  f"\nmedians: GPU-h x{med_t['gpu_vs_static_peak']:.2f} of static-peak at SLO "
                  f"{med_t['slo_minus_static_peak_pts']:+.2f} pts; SLO {med_t['slo_minus_ray_default_pts']:+.2f} "
                  f"pts vs ray-default at GPU-h x{med_t['gpu_vs_ray_default']:.2f}; seeds meeting the "
                  f"static-peak target {met['static_peak_target_met']}/{len(seeds)}, the ray-default "
                  f"target {met['ray_default_target_met']}/{len(seeds)}"]
    report["bench_wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print("\n".join(lines))
    print(f"\nwrote {args.out} ({report['bench_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()

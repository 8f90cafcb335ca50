"""Fit a hardware profile to `hbmserve bench` runs of the serving path, and test it on held-out runs.

`calibrate_cpu.py` fits `cpu-local` to closed-loop runs of bare vLLM. What `hbmserve bench
--predict` is compared with is different: open-loop arrivals through the whole serving path
(client, front door, relay, the replica in Ray Serve) on the day of the run. This script fits
the same five profile parameters (capacity/perf/calibration.py: per-step, per-sequence and
per-request overheads, FLOP/s and bandwidth efficiencies) to exactly that: each run's records
(`hbmserve bench ... --save-records F`) are replayed through the simulator as `--predict`
replays them (ops/bench_predict.py, same arrivals, same figures), and the fit minimises the mean
absolute log error of TTFT and TPOT p50/p95 over the `--fit-on` runs. MAPE is reported for every
run, the held-out ones marked; `--catalog-out` writes a hardware catalog with the fitted profile,
for `hbmserve bench --predict C --catalog F`.

    python -m hbmserve.ops.bench.calibrate_serving --config cluster.yaml --fit-on r12-1,r12-2 \\
        --catalog-out out/cpu-serving.yaml r4-1.jsonl r12-1.jsonl r24-1.jsonl ...

A run is named by its file's stem. The SLO only labels goodput here; the fit reads latencies.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from hbmserve.capacity.perf.calibration import nelder_mead, params_of, with_params
from hbmserve.capacity.perf.hardware import CATALOG_FILE, GpuProfile, load_catalog
from hbmserve.capacity.perf.scenario import scenario_for
from hbmserve.core.config import load_cluster_spec
from hbmserve.ops.bench_figures import MAPE_KEYS, BenchFigures, RequestRecord, figures_of
from hbmserve.ops.bench_predict import model_for, predict
from hbmserve.ops.loadgen import arrivals_of

# The figures fitted and reported: the ones `bench --predict` takes its MAPE over.
KEYS = MAPE_KEYS


@dataclass(frozen=True)
class Run:
    name: str
    records: tuple[RequestRecord, ...]
    measured: BenchFigures


def read_run(path: Path) -> Run:
    records = tuple(RequestRecord(**{**row, "itl_s": tuple(row.get("itl_s", ()))})
                    for row in map(json.loads, path.read_text().splitlines()) if row)
    if not records:
        raise ValueError(f"{path}: no records (write them with `hbmserve bench ... --save-records {path}`)")
    return Run(path.stem, records, figures_of(records))


def _errors(measured: BenchFigures, predicted: BenchFigures) -> dict[str, float]:
    """Predicted / measured - 1 per figure both have."""
    out = {}
    for key in KEYS:
        m, p = measured.figure(key), predicted.figure(key)
        if m and p is not None and m > 0:
            out[key] = p / m - 1.0
    return out


def _log_error(errors: dict[str, float]) -> float:
    """Mean |ln(predicted / measured)|: what the fit minimises. Unlike MAPE it is symmetric, so the
    fit gains nothing by predicting low (MAPE caps an under-prediction's error at 100%)."""
    return statistics.fmean(abs(math.log(max(1.0 + e, 1e-9))) for e in errors.values()) if errors else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="bench --save-records files")
    ap.add_argument("--config", type=Path, required=True, help="the cluster YAML the runs served")
    ap.add_argument("--model", default=None, help="served model name (default: the config's only model)")
    ap.add_argument("--fit-on", required=True, help="comma list of run names (file stems) to fit on")
    ap.add_argument("--max-evals", type=int, default=150)
    ap.add_argument("--catalog-out", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="JSON report")
    args = ap.parse_args(argv)

    spec = load_cluster_spec(args.config)
    model = model_for(spec, args.model or spec.models[0].name, str(args.config))
    runs = [read_run(p) for p in args.runs]
    fit_names = set(args.fit_on.split(","))
    unknown = fit_names - {r.name for r in runs}
    if unknown:
        ap.error(f"--fit-on names no given run: {', '.join(sorted(unknown))}")
    catalog = load_catalog()
    base = scenario_for(model, catalog).deployment.gpu  # the profile --predict simulates (sim: sim.gpu)
    gpu = base.name
    slo = model.slo.seconds()

    def predicted(profile: GpuProfile, run: Run) -> BenchFigures:
        return predict(model, arrivals_of(list(run.records)), slo, {**catalog, gpu: profile}).figures

    def loss(x: list[float]) -> float:
        profile = with_params(base, x)
        return statistics.fmean(_log_error(_errors(r.measured, predicted(profile, r))) for r in runs
                                if r.name in fit_names)

    x, _, evals = nelder_mead(loss, params_of(base), max_evals=args.max_evals)
    fitted = with_params(base, x)
    rows = []
    print(f"{'run':10} {'':4} " + " ".join(f"{k:>22}" for k in KEYS) + "   MAPE before / after   |ln err| before / after")
    for r in runs:
        before, after = _errors(r.measured, predicted(base, r)), _errors(r.measured, predicted(fitted, r))
        mape_b = 100 * statistics.fmean(abs(e) for e in before.values())
        mape_a = 100 * statistics.fmean(abs(e) for e in after.values())
        held = r.name not in fit_names
        cells = [f"{r.measured.figure(k) * 1e3:7.1f}/{(1 + after[k]) * r.measured.figure(k) * 1e3:7.1f} ms" for k in KEYS]
        print(f"{r.name:10} {'held' if held else 'fit':4} " + " ".join(f"{c:>22}" for c in cells)
              + f"   {mape_b:5.1f}% / {mape_a:5.1f}%   {_log_error(before):5.2f} / {_log_error(after):5.2f}")
        rows.append({"run": r.name, "held_out": held, "sent": r.measured.sent, "mape_before_pct": mape_b,
                     "mape_after_pct": mape_a, "log_error_before": _log_error(before),
                     "log_error_after": _log_error(after), "measured": {k: r.measured.figure(k) for k in KEYS},
                     "error_after": after})
    held_mape = [row["mape_after_pct"] for row in rows if row["held_out"]]
    o, e = fitted.overheads, fitted.efficiency
    summary = {"fit_on": sorted(fit_names), "evaluations": evals,
               "mape_held_out_pct": statistics.fmean(held_mape) if held_mape else None,
               "fitted": {"efficiency": {"flops": e.flops, "hbm_bw": e.hbm_bw},
                          "overheads": {"step_s": o.step_s, "per_seq_s": o.per_seq_s, "request_s": o.request_s}}}
    print(f"held-out MAPE {summary['mape_held_out_pct']}; fitted {summary['fitted']} ({evals} evaluations)")
    if args.catalog_out:
        data = yaml.safe_load(resources.files("hbmserve.capacity.perf").joinpath("data", CATALOG_FILE).read_text())
        data["gpus"][gpu] |= summary["fitted"]
        args.catalog_out.parent.mkdir(parents=True, exist_ok=True)
        args.catalog_out.write_text(f"# {gpu} fitted to {', '.join(sorted(fit_names))} (ops/bench/calibrate_serving.py)\n"
                                    + yaml.safe_dump(data, sort_keys=False))
        load_catalog(args.catalog_out)  # what bench --catalog will read must parse
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**summary, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""hbmserve against every fixed fleet on generator seeds the corpus does not hold (issue 38).

The corpus (ops/bench/autoscale_corpus.py) judges a few seeds of each generator, and the policy
was tuned while looking at them. This replays the same generators on other seeds, each with the
prior learnt from its sibling seed (seed + SIBLING_SEED, the corpus's rule for a generated
trace's past), and with no prior, and says which fixed fleets dominate each run. No oracle and
no baselines: a fixed fleet is the rival a capacity planner would pick.

`--own` adds a third run, the prior learnt from the judged trace itself: a past that was exactly
like today. Dominated with the sibling's prior but not with its own, the policy lacked the
information; dominated with its own as well, the policy's rules cost it.

    python -m hbmserve.ops.bench.autoscale_unseen --trace lulls --seeds 3 4 5 6
    python -m hbmserve.ops.bench.autoscale_unseen --trace diurnal --seeds 2 3 4 5 6 7 --out out/unseen.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hbmserve.autoscale.memory.prior import learn_prior, learnt_config
from hbmserve.capacity.sim.evaluate import EvalResult, eval_config, evaluate, load_eval_cluster
from hbmserve.capacity.sim.frontier import FleetRuns, dominates, static_frontier
from hbmserve.ops.bench.autoscale_corpus import GENERATORS, SIBLING_SEED


def _row(r: EvalResult) -> dict[str, Any]:
    return {"slo_attainment": r.summary.slo_attainment, "gpu_hours": r.summary.gpu_hours}


def one_seed(trace: str, seed: int, clip_s: float | None = None, own: bool = False) -> dict[str, Any]:
    """hbmserve with and without a prior on one seed (and, `own`, with the seed's own past), and
    the fixed fleets that dominate each."""
    cluster = load_eval_cluster(None)
    arr, past = GENERATORS[trace](seed), GENERATORS[trace](seed + SIBLING_SEED)
    if clip_s is not None:
        arr, past = arr.window(0.0, clip_s), past.window(0.0, clip_s)
    config = eval_config(cluster, arr)
    prior = learn_prior(past.t.tolist(), config, source=f"{trace} seed {seed + SIBLING_SEED}")
    runs = {"prior": evaluate("hbmserve", cluster, arr, learnt_config(config, prior)),
            "no prior": evaluate("hbmserve", cluster, arr, config)}
    if own:
        itself = learn_prior(arr.t.tolist(), config, source=f"{trace} seed {seed} itself")
        runs["own prior"] = evaluate("hbmserve", cluster, arr, learnt_config(config, itself))
    fleets = static_frontier(FleetRuns(cluster, arr, config))
    return {"trace": f"{trace}-{seed}",
            "runs": {k: {**_row(r), "dominated_by": [f.policy for f in fleets if dominates(f, r)]}
                     for k, r in runs.items()},
            "fleets": {f.policy: _row(f) for f in fleets}}


def line(case: dict[str, Any]) -> str:
    parts = [f"{k}: {100 * r['slo_attainment']:.2f}% at {r['gpu_hours']:.2f} GPU-h, dominated by "
             f"{', '.join(r['dominated_by']) or 'none'}" for k, r in case["runs"].items()]
    return f"{case['trace']}: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", choices=sorted(GENERATORS), required=True)
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--clip", type=float, help="judge only the first this many seconds of each trace")
    ap.add_argument("--own", action="store_true", help="also run with the prior learnt from the trace itself")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    cases = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        cases.append(one_seed(args.trace, seed, args.clip, args.own))
        print(f"{line(cases[-1])} ({time.perf_counter() - t0:.0f} s)", flush=True)
    dominated = sum(bool(c["runs"]["prior"]["dominated_by"]) for c in cases)
    print(f"with a prior, dominated on {dominated} of {len(cases)} unseen seeds")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "cases": cases}, indent=1))


if __name__ == "__main__":
    main()

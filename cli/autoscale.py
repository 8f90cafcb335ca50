"""`hbmserve autoscale ...`: evaluate scaling policies in the simulator, learn the autoscaler's
prior from a service's past; the synthetic trace writers are in autoscale_traces.py.

Registered through `register(app)`. Heavy imports (numpy, the simulator, matplotlib) happen
inside the commands so `hbmserve --help` stays fast. Bad input prints one `error: ...` line and
exits 2.

`evaluate --json` prints one JSON object for one policy; for `--policy all`, an object with the
run's settings and `policies`: {name: object}. Each object carries at least slo_attainment,
ttft_p95_s, gpu_hours, cost_usd, scale_actions (target changes + cancelled starts),
scale_actions_per_hour and dropped_requests (see capacity/sim/evaluate.py for how each is counted); when
the oracle ran (`--policy all` or `oracle`), every object also carries gpu_hours_vs_oracle and
the oracle's own carries how it was planned (`oracle`: aim, ceiling, trials, the fixed fleets
it tried). With the static frontier (`--frontier`, on by default for `all`), the output also
carries `static_frontier` (one row per fixed fleet: replicas, gpu_hours, slo_attainment, ...)
and every policy object `dominated_by` (the fixed fleets that get at least its attainment for no
more GPU-hours, capacity/sim/frontier.py). When the oracle ran and any policy or fixed fleet reaches its
attainment with fewer GPU-hours, the command prints its output, then one `error: ...` line
naming them, and exits 1: the oracle is not the limit it claims to be. The single object,
or the settings of `all`, also carry `slo_feasible` and `slo_blocker`: whether the config's engine
settings can meet its SLO on this trace at any replica count up to max_replicas
(capacity/perf/slo_cap.py), and why not.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hbmserve.cli import autoscale_traces
from hbmserve.cli.user_errors import fail, user_errors

ALL = "all"
NO_PRIOR = "hbmserve (no prior)"  # with --prior-trace: the same policy starting with no memory


def evaluate_cmd(
    trace: Annotated[Path, typer.Option("--trace", help="CSV (arrived_at,num_prefill_tokens,"
                                        "num_decode_tokens) or JSONL trace")],
    policy: Annotated[str, typer.Option("--policy", help="hbmserve, ray-default, static-peak, "
                                        "queue-threshold, k8s-hpa, keda, oracle (planned from "
                                        "the whole trace: the limit), or all (side by side)")],
    config: Annotated[Optional[Path], typer.Option("--config", help="cluster YAML; default: the "
                                                   "reference cluster (capacity/sim/data/"
                                                   "reference_cluster.yaml)")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="model in the config "
                                                 "(default: first)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    time_scale: Annotated[float, typer.Option("--time-scale", help="stretch trace time "
                                              "(0.5 = twice the rate, half the duration)")] = 1.0,
    token_scale: Annotated[float, typer.Option("--token-scale", help="multiply prompt and "
                                               "output lengths")] = 1.0,
    clip: Annotated[Optional[float], typer.Option("--clip", help="keep the first SECONDS of the "
                                                  "(time-scaled) trace")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write a PNG of replicas vs "
                                                 "load over time, one panel per policy")] = None,
    startup_hot: Annotated[Optional[float], typer.Option("--startup-hot", help="seconds; default: "
                                                         "the config's autoscaling.startup_s")] = None,
    startup_warm: Annotated[Optional[float], typer.Option("--startup-warm", help="seconds")] = None,
    startup_cold: Annotated[Optional[float], typer.Option("--startup-cold", help="seconds")] = None,
    interval: Annotated[float, typer.Option("--decision-interval",
                                            help="policy period, seconds")] = 1.0,
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="hardware catalog "
                                                    "YAML")] = None,
    frontier: Annotated[Optional[bool], typer.Option(
        "--frontier/--no-frontier", help="also replay a fixed fleet of each size (the static "
        "frontier) and mark the policies it dominates; default: with --policy all")] = None,
    allow_slo_miss: Annotated[bool, typer.Option("--allow-slo-miss", help="run even when a full engine step "
                                                 "breaks the TPOT target (max_num_batched_tokens too large)")] = False,
    prior_trace: Annotated[Optional[Path], typer.Option(
        "--prior-trace", help="the service's past: learn the autoscaler's prior from it (autoscale learn) and "
        "judge hbmserve with it on --trace, beside hbmserve without it")] = None,
) -> None:
    """Replay a trace through the simulated cluster under one scaling policy (or all of them)."""
    from hbmserve.autoscale.registry import POLICIES
    from hbmserve.core.scaling import Tier
    from hbmserve.capacity.traces.arrivals import read_trace

    from hbmserve.cli.slo_gate import check_slo, slo_check_for
    from hbmserve.capacity.sim.comparison import compare
    from hbmserve.capacity.sim.evaluate import TraceScaling, eval_config, load_eval_cluster, scale_trace
    from hbmserve.capacity.sim.frontier import frontier_rows
    from hbmserve.capacity.sim.oracle_search import OracleUndercut

    names = list(POLICIES) if policy == ALL else [policy]
    if policy != ALL and policy not in POLICIES:
        raise fail(f"--policy {policy!r}: not one of {', '.join(POLICIES)}, {ALL}")
    try:
        startup = {t: s for t, s in ((Tier.HOT, startup_hot), (Tier.WARM, startup_warm),
                                     (Tier.COLD, startup_cold)) if s is not None}
        cluster = load_eval_cluster(config, model=model, startup_s=startup,
                                    decision_interval_s=interval, catalog=catalog)
        scaling = TraceScaling(time_scale, token_scale, clip)
        arr = scale_trace(read_trace(trace), scaling)
        auto = eval_config(cluster, arr)
        memoryless = auto
        if prior_trace is not None:
            from hbmserve.autoscale.memory.prior import learnt_config

            auto = learnt_config(auto, prior_from_trace(prior_trace, scaling, auto, interval))
    except user_errors() as err:
        raise fail(str(err)) from None
    check = slo_check_for(cluster.scenario, arr, auto.max_replicas)
    check_slo(check, cluster.model_name, allow_slo_miss)
    comparison = compare(names, cluster, arr, auto,
                         frontier=policy == ALL if frontier is None else frontier)
    results, oracle, wall_s = list(comparison.results), comparison.oracle, dict(comparison.wall_s)
    if prior_trace is not None and "hbmserve" in names:
        from hbmserve.capacity.sim.evaluate import evaluate

        t0 = time.perf_counter()
        results.insert(names.index("hbmserve") + 1,
                       replace(evaluate("hbmserve", cluster, arr, memoryless), policy=NO_PRIOR))
        wall_s[NO_PRIOR] = time.perf_counter() - t0
    if plot is not None:
        from hbmserve.capacity.sim.eval_plot import plot_replicas_vs_load

        plot_replicas_vs_load(results, plot, f"{trace.name}: {cluster.model_name} on "
                              f"{cluster.scenario.deployment.gpu.name} "
                              f"TP{cluster.scenario.deployment.tp}", comparison.frontier)
    settings = {"trace": str(trace), "cluster": cluster.source, "model": cluster.model_name,
                "time_scale": time_scale, "token_scale": token_scale, "clip_s": clip,
                "startup_s": {t.value: s for t, s in auto.startup_s.items()},
                "decision_interval_s": interval, **check.to_json_dict(),
                **({"prior": {"trace": str(prior_trace), "learned_from": auto.prior_source,
                              "rises_rps": list(auto.prior_rises_rps)}} if prior_trace is not None else {})}
    if json_out:
        objs = {r.policy: {**r.to_json_dict(), "sim_wall_s": wall_s[r.policy],
                           **_vs_oracle(r, oracle), **_frontier_marks(r, comparison)}
                for r in results}
        if policy != ALL and prior_trace is not None and NO_PRIOR in objs:
            objs[policy]["without_prior"] = objs.pop(NO_PRIOR)
        curve = ({"static_frontier": frontier_rows(comparison.frontier),
                  "static_frontier_wall_s": comparison.wall_s["static frontier"]}
                 if comparison.frontier else {})
        prior = {"prior": settings["prior"]} if "prior" in settings else {}
        out: dict[str, Any] = ({**objs[policy], **check.to_json_dict(), **curve, **prior}
                               if policy != ALL else {**settings, "policies": objs, **curve})
        typer.echo(json.dumps(out))
    else:
        _print_table(results, settings, len(arr), arr.duration_s, oracle, comparison)
    if plot is not None and not json_out:
        typer.echo(f"plot written to {plot}")
    try:
        comparison.check()
    except OracleUndercut as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None


def _vs_oracle(r: Any, oracle: Any) -> dict[str, float]:
    if oracle is None:
        return {}
    return {"gpu_hours_vs_oracle": r.summary.gpu_hours / oracle.summary.gpu_hours}


def _frontier_marks(r: Any, comparison: Any) -> dict[str, list[str]]:
    """`dominated_by`: the fixed fleets that dominate `r`, when the frontier ran."""
    if comparison is None or not comparison.frontier:
        return {}
    return {"dominated_by": comparison.dominated_by(r)}


def _console():
    import sys

    from rich.console import Console

    # Pipes and CI logs get a wide fixed width so tables are not squeezed into 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=150)


def _print_table(results: list[Any], settings: dict[str, Any], n: int, span_s: float,
                 oracle: Any = None, comparison: Any = None) -> None:
    from rich.table import Table

    c = _console()
    config, peak = results[0].config, results[0].peak_rps
    c.print(f"[bold]{settings['trace']}[/]: {n} requests over {span_s / 60:.1f} min "
            f"(time x{settings['time_scale']:g}, tokens x{settings['token_scale']:g}); "
            f"{settings['model']} from {settings['cluster']}; {config.replica_capacity_rps:.2f} "
            f"req/s per replica at the SLO, peak {peak:.2f} req/s")
    if "prior" in settings:
        p = settings["prior"]
        c.print(f"hbmserve starts from the prior learnt from {p['learned_from']}: rises of "
                f"{min(p['rises_rps']):.2f}-{max(p['rises_rps']):.2f} req/s; '{NO_PRIOR}' starts with no memory")
    t = Table("policy", "SLO attain.", "TTFT p95 s", "TPOT p95 ms", "GPU-h",
              *(("GPU-h/oracle",) if oracle is not None else ()), "cost $",
              "replicas mean/peak", "scale actions (/h)", "cancelled starts",
              "dropped", *(("dominated by",) if comparison and comparison.frontier else ()))
    for r in results:
        d = r.to_json_dict()
        tpot = "-" if d["tpot_p95_s"] is None else f"{d['tpot_p95_s'] * 1e3:.1f}"
        ttft = "-" if d["ttft_p95_s"] is None else f"{d['ttft_p95_s']:.2f}"
        ratio = [f"{v:.2f}" for v in _vs_oracle(r, oracle).values()]
        t.add_row(r.policy, f"{d['slo_attainment']:.2%}", ttft, tpot, f"{d['gpu_hours']:.2f}",
                  *ratio, f"{d['cost_usd']:.2f}",
                  f"{d['mean_replicas']:.2f} / {d['peak_replicas']}",
                  f"{d['scale_actions']} ({d['scale_actions_per_hour']:.1f})",
                  str(d["cancelled_starts"]), str(d["dropped_requests"]),
                  *(", ".join(v) or "-" for v in _frontier_marks(r, comparison).values()))
    c.print(t)
    if comparison and comparison.frontier:
        _print_frontier(c, results, comparison, oracle)
    if oracle is not None:
        o = oracle.detail.get("oracle", {})
        if o:
            c.print(f"oracle: the fewest replicas, each ordered one cold start-up before it is "
                    f"needed, that reach {o['aim_slo_attainment']:.2%} (the attainment of "
                    f"max_replicas throughout, {o['ceiling_slo_attainment']:.2%}, less "
                    f"{100 * (o['ceiling_slo_attainment'] - o['aim_slo_attainment']):.2g} "
                    f"point); found in {len(o['trials'])} replays and "
                    f"{len(o['fixed_fleets_tried'])} fixed fleets; kept schedule: {o['schedule']}")


def _print_frontier(c: Any, results: list[Any], comparison: Any, oracle: Any) -> None:
    from rich.table import Table

    t = Table("fixed fleet", "SLO attain.", "GPU-h",
              *(("GPU-h/oracle",) if oracle is not None else ()), "TTFT p95 s", "TPOT p95 ms",
              title="static frontier: a fixed fleet of each size")
    for r in comparison.frontier:
        s = r.summary
        t.add_row(r.policy, f"{s.slo_attainment:.2%}", f"{s.gpu_hours:.2f}",
                  *(f"{v:.2f}" for v in _vs_oracle(r, oracle).values()),
                  "-" if s.ttft.p95 is None else f"{s.ttft.p95:.2f}",
                  "-" if s.tpot.p95 is None else f"{s.tpot.p95 * 1e3:.1f}")
    c.print(t)
    beaten = [f"{r.policy} (by {', '.join(comparison.dominated_by(r))})" for r in results
              if comparison.dominated_by(r)]
    c.print("dominated by a fixed fleet (at least its SLO attainment for no more GPU-hours): "
            + ("; ".join(beaten) if beaten else "none"))


def prior_from_trace(path: Path, scaling: Any, auto: Any, interval_s: float) -> Any:
    """The PriorSpec the trace at `path` teaches the envelope of `auto` (scaled as the trace judged)."""
    from hbmserve.autoscale.memory.prior import learn_prior
    from hbmserve.capacity.sim.evaluate import scale_trace
    from hbmserve.capacity.traces.arrivals import read_trace

    return learn_prior(scale_trace(read_trace(path), scaling).t.tolist(), auto, source=path.name, interval_s=interval_s)


def learn_cmd(
    out: Annotated[Path, typer.Option("--out", help="where to write the prior (YAML)")],
    trace: Annotated[Optional[Path], typer.Option("--trace", help="the service's past: CSV (arrived_at,"
                                                  "num_prefill_tokens,num_decode_tokens) or JSONL")] = None,
    prometheus: Annotated[Optional[str], typer.Option("--prometheus", help="or its own history: the URL of the "
                                                      "Prometheus that scrapes its front doors")] = None,
    window: Annotated[float, typer.Option("--window", help="with --prometheus: seconds of history")] = 86400.0,
    step: Annotated[float, typer.Option("--step", help="with --prometheus: seconds a sample, the scrape "
                                        "interval")] = 15.0,
    config: Annotated[Optional[Path], typer.Option("--config", help="cluster YAML; default: the "
                                                   "reference cluster")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="model in the config (default: first)")] = None,
    time_scale: Annotated[float, typer.Option("--time-scale", help="stretch trace time")] = 1.0,
    interval: Annotated[float, typer.Option("--decision-interval", help="policy period, seconds")] = 1.0,
) -> None:
    """Learn the autoscaler's prior (its burst envelope) from a trace of the service's past, or from
    its Prometheus history; the config takes the file as models[].autoscaling.prior
    (autoscale/memory/prior.py)."""
    import yaml

    from hbmserve.autoscale.memory.prior import arrivals_of_rates, held_before_traffic, learn_prior, learnt_config
    from hbmserve.capacity.sim.evaluate import TraceScaling, eval_config, load_eval_cluster, scale_trace
    from hbmserve.capacity.traces.arrivals import read_trace
    from hbmserve.deployments.control.prometheus_history import request_rates

    if (trace is None) == (prometheus is None):
        raise fail("give the past as one of --trace FILE or --prometheus URL")
    try:
        cluster = load_eval_cluster(config, model=model, decision_interval_s=interval)
        scaling = TraceScaling(time_scale, 1.0, None)
        if trace is not None:
            arr = scale_trace(read_trace(trace), scaling)
            auto = eval_config(cluster, arr)
            prior = learn_prior(arr.t.tolist(), auto, source=trace.name, interval_s=interval)
        else:
            history = request_rates(prometheus, cluster.model_name, window, step, time.time())
            times = arrivals_of_rates(history.rates, history.step_s)
            auto = eval_config(cluster, None)
            prior = learn_prior(times, auto, source=f"Prometheus {prometheus}, the last {window:g} s",
                                interval_s=interval)
    except user_errors() as err:
        raise fail(str(err)) from None
    header = (f"# hbmserve autoscale learn: the burst envelope's prior for {cluster.model_name}, from "
              f"{trace or prometheus}.\n# Use it as models[].autoscaling.prior: {out.name} (a path against the "
              "config's folder) or inline.\n")
    try:
        out.write_text(header + yaml.safe_dump(prior.model_dump(mode="json"), sort_keys=False))
    except OSError as err:
        raise fail(f"--out {out}: {err.strerror or err}") from None
    rises, held = prior.rises_rps, held_before_traffic(learnt_config(auto, prior))
    typer.echo(f"{len(rises)} buckets of {prior.bucket_s:g} s ({prior.learned_from}); rises {min(rises):.2f}-"
               f"{max(rises):.2f} req/s. At {auto.replica_capacity_rps:.2f} req/s a replica, before any traffic: "
               f"{held.describe() if held else 'the burst envelope is off'}. Written to {out}")


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="Evaluate autoscaling policies in the simulator.",
                      no_args_is_help=True)
    sub.command("evaluate")(evaluate_cmd)
    sub.command("learn")(learn_cmd)
    autoscale_traces.register(sub)
    app.add_typer(sub, name="autoscale")

"""`hbmserve autoscale ...`: evaluate scaling policies in the simulator, make a burst trace or a
prompt-heavy (code completion) one.

Registered through `register(app)`. Heavy imports (numpy, the simulator, matplotlib) happen
inside the commands so `hbmserve --help` stays fast. Bad input prints one `error: ...` line and
exits 2.

`evaluate --json` prints one JSON object for one policy; for `--policy all`, an object with the
run's settings and `policies`: {name: object}. Each object carries at least slo_attainment,
ttft_p95_s, gpu_hours, cost_usd, scale_actions (target changes + cancelled starts),
scale_actions_per_hour and dropped_requests (see sim/evaluate.py for how each is counted); when
the oracle ran (`--policy all` or `oracle`), every object also carries gpu_hours_vs_oracle and
the oracle's own carries how it was planned (`oracle`: aim, ceiling, trials). The single object,
or the settings of `all`, also carry `slo_feasible` and `slo_blocker`: whether the config's engine
settings can meet its SLO on this trace at any replica count up to max_replicas
(capacity/slo_cap.py), and why not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hbmserve.cli.user_errors import fail, user_errors

ALL = "all"


def evaluate_cmd(
    trace: Annotated[Path, typer.Option("--trace", help="CSV (arrived_at,num_prefill_tokens,"
                                        "num_decode_tokens) or JSONL trace")],
    policy: Annotated[str, typer.Option("--policy", help="hbmserve, ray-default, static-peak, "
                                        "queue-threshold, oracle (planned from the whole "
                                        "trace: the limit), or all (side by side)")],
    config: Annotated[Optional[Path], typer.Option("--config", help="cluster YAML; default: the "
                                                   "reference cluster (sim/data/"
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
) -> None:
    """Replay a trace through the simulated cluster under one scaling policy (or all of them)."""
    import time

    from hbmserve.autoscale.registry import POLICIES
    from hbmserve.core.scaling import Tier
    from hbmserve.traces.arrivals import read_trace

    from hbmserve.cli.capacity import slo_check_for, warn_slo
    from hbmserve.sim.evaluate import TraceScaling, eval_config, evaluate, load_eval_cluster, scale_trace

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
    except user_errors() as err:
        raise fail(str(err)) from None
    check = slo_check_for(cluster.scenario, arr, auto.max_replicas)
    warn_slo(check, cluster.model_name)
    results, wall = [], {}
    for name in names:
        t0 = time.perf_counter()
        results.append(evaluate(name, cluster, arr, auto))
        wall[name] = time.perf_counter() - t0
    if plot is not None:
        from hbmserve.sim.eval_plot import plot_replicas_vs_load

        plot_replicas_vs_load(results, plot, f"{trace.name}: {cluster.model_name} on "
                              f"{cluster.scenario.deployment.gpu.name} "
                              f"TP{cluster.scenario.deployment.tp}")
    settings = {"trace": str(trace), "cluster": cluster.source, "model": cluster.model_name,
                "time_scale": time_scale, "token_scale": token_scale, "clip_s": clip,
                "startup_s": {t.value: s for t, s in auto.startup_s.items()},
                "decision_interval_s": interval, **check.to_json_dict()}
    oracle = next((r for r in results if POLICIES[r.policy].clairvoyant), None)
    if json_out:
        objs = {r.policy: {**r.to_json_dict(), "sim_wall_s": wall[r.policy],
                           **_vs_oracle(r, oracle)} for r in results}
        out: dict[str, Any] = ({**objs[policy], **check.to_json_dict()} if policy != ALL
                               else {**settings, "policies": objs})
        typer.echo(json.dumps(out))
    else:
        _print_table(results, settings, len(arr), arr.duration_s, oracle)
    if oracle is not None:
        from hbmserve.sim.oracle_search import undercut_oracle

        for name in undercut_oracle(results, oracle):
            typer.echo(f"warning: {name} reaches the oracle's SLO attainment with fewer GPU-hours: "
                       "the oracle's search fell short of the limit on this trace", err=True)
    if plot is not None and not json_out:
        typer.echo(f"plot written to {plot}")


def _vs_oracle(r: Any, oracle: Any) -> dict[str, float]:
    if oracle is None:
        return {}
    return {"gpu_hours_vs_oracle": r.summary.gpu_hours / oracle.summary.gpu_hours}


def _console():
    import sys

    from rich.console import Console

    # Pipes and CI logs get a wide fixed width so tables are not squeezed into 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=150)


def _print_table(results: list[Any], settings: dict[str, Any], n: int, span_s: float,
                 oracle: Any = None) -> None:
    from rich.table import Table

    c = _console()
    config, peak = results[0].config, results[0].peak_rps
    c.print(f"[bold]{settings['trace']}[/]: {n} requests over {span_s / 60:.1f} min "
            f"(time x{settings['time_scale']:g}, tokens x{settings['token_scale']:g}); "
            f"{settings['model']} from {settings['cluster']}; {config.replica_capacity_rps:.2f} "
            f"req/s per replica at the SLO, peak {peak:.2f} req/s")
    t = Table("policy", "SLO attain.", "TTFT p95 s", "TPOT p95 ms", "GPU-h",
              *(("GPU-h/oracle",) if oracle is not None else ()), "cost $",
              "replicas mean/peak", "scale actions (/h)", "cancelled starts",
              "dropped")
    for r in results:
        d = r.to_json_dict()
        tpot = "-" if d["tpot_p95_s"] is None else f"{d['tpot_p95_s'] * 1e3:.1f}"
        ttft = "-" if d["ttft_p95_s"] is None else f"{d['ttft_p95_s']:.2f}"
        ratio = [f"{v:.2f}" for v in _vs_oracle(r, oracle).values()]
        t.add_row(r.policy, f"{d['slo_attainment']:.2%}", ttft, tpot, f"{d['gpu_hours']:.2f}",
                  *ratio, f"{d['cost_usd']:.2f}",
                  f"{d['mean_replicas']:.2f} / {d['peak_replicas']}",
                  f"{d['scale_actions']} ({d['scale_actions_per_hour']:.1f})",
                  str(d["cancelled_starts"]), str(d["dropped_requests"]))
    c.print(t)
    if oracle is not None:
        o = oracle.detail.get("oracle", {})
        if o:
            c.print(f"oracle: the fewest replicas, each ordered one cold start-up before it is "
                    f"needed, that reach {o['aim_slo_attainment']:.2%} (the attainment of "
                    f"max_replicas throughout, {o['ceiling_slo_attainment']:.2%}, less "
                    f"{100 * (o['ceiling_slo_attainment'] - o['aim_slo_attainment']):.2g} "
                    f"point); found in {len(o['trials'])} replays")


def burst_trace_cmd(
    out: Annotated[Path, typer.Option("--out", help="CSV file to write (Azure layout)")],
    seed: Annotated[int, typer.Option("--seed")] = 0,
    duration: Annotated[float, typer.Option("--duration", help="seconds")] = 3600.0,
    base_rps: Annotated[float, typer.Option("--base-rps")] = 5.0,
    burst_rps: Annotated[float, typer.Option("--burst-rps")] = 25.0,
    bursts: Annotated[int, typer.Option("--bursts")] = 4,
    burst_s: Annotated[float, typer.Option("--burst-seconds")] = 300.0,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens", help="mean")] = 1000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens", help="mean")] = 200.0,
) -> None:
    """Write a synthetic trace with sharp bursts (see traces/burst_trace.py)."""
    from hbmserve.traces.burst_trace import BurstSpec, burst_arrivals

    try:
        spec = BurstSpec(duration_s=duration, base_rps=base_rps, burst_rps=burst_rps,
                         bursts=bursts, burst_s=burst_s, prompt_tokens=prompt_tokens,
                         output_tokens=output_tokens)
    except ValueError as err:
        raise fail(str(err)) from None
    _write_trace(burst_arrivals(spec, seed), out, duration)


def code_trace_cmd(
    out: Annotated[Path, typer.Option("--out", help="CSV file to write (Azure layout)")],
    seed: Annotated[int, typer.Option("--seed")] = 0,
    duration: Annotated[float, typer.Option("--duration", help="seconds")] = 3600.0,
    base_rps: Annotated[float, typer.Option("--base-rps")] = 4.0,
    peak_rps: Annotated[float, typer.Option("--peak-rps", help="top of the swell")] = 12.0,
    spikes: Annotated[int, typer.Option("--spikes")] = 2,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens", help="mean")] = 2000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens", help="mean")] = 32.0,
) -> None:
    """Write a synthetic prompt-heavy (code completion) trace (see traces/code_trace.py)."""
    from hbmserve.traces.code_trace import CodeTraceSpec, code_arrivals

    try:
        spec = CodeTraceSpec(duration_s=duration, base_rps=base_rps, peak_rps=peak_rps,
                             spikes=spikes, prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens)
    except ValueError as err:
        raise fail(str(err)) from None
    _write_trace(code_arrivals(spec, seed), out, duration)


def _write_trace(arr: Any, out: Path, duration: float) -> None:
    rows = (f"{t:.6f},{p},{o}" for t, p, o in zip(arr.t, arr.prompt, arr.output))
    try:
        out.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    except OSError as err:
        raise fail(f"--out {out}: {err.strerror or err}") from None
    typer.echo(f"{len(arr)} requests over {duration:g} s written to {out}")


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="Evaluate autoscaling policies in the simulator.",
                      no_args_is_help=True)
    sub.command("evaluate")(evaluate_cmd)
    sub.command("burst-trace")(burst_trace_cmd)
    sub.command("code-trace")(code_trace_cmd)
    app.add_typer(sub, name="autoscale")

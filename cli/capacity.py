"""`hbmserve simulate` and `hbmserve plan`: the capacity planner's command line.

Registered through `register(app)`. Heavy imports (numpy, the simulator, matplotlib) happen
inside the commands so `hbmserve --help` stays fast. Bad input prints one `error: ...` line and
exits 2; an infeasible plan prints the closest plan and exits 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hbmserve.cli.slo_gate import check_slo, slo_check_for
from hbmserve.cli.user_errors import fail, user_errors

EXIT_INFEASIBLE = 1
SYNTHETIC_LENGTH_CV = 0.5  # --rate loads: prompt and output lengths lognormal with this spread


def arrivals_for(trace: Optional[Path], rate: Optional[float], duration: float, prompt: float, output: float,
                 burstiness: float, seed: int, time_scale: float):
    """A trace file (stretched by time_scale), or synthetic gamma arrivals at `rate`."""
    from hbmserve.capacity.traces.arrivals import gamma_arrivals, read_trace

    if trace is not None:
        arr = read_trace(trace)
        return arr.scaled(time_scale) if time_scale != 1.0 else arr
    if rate is None:
        raise fail("give --trace FILE or --rate RPS")
    if rate <= 0 or duration <= 0 or burstiness <= 0:
        raise fail("--rate, --duration and --burstiness must be > 0")
    return gamma_arrivals(rate, duration, burstiness, prompt, output, length_cv=SYNTHETIC_LENGTH_CV, seed=seed)


def config_model(config: Path, model: Optional[str]):
    """The named model of a cluster config (the first without a name); raises `fail` when absent."""
    from hbmserve.core.config import load_cluster_spec

    spec = load_cluster_spec(config)
    m = spec.model(model) if model else spec.models[0]
    if m is None:
        raise fail(f"--model {model!r} is not in {config} ({', '.join(x.name for x in spec.models)})")
    return m


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True, disable=not enabled)


def _fmt(v: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * scale:.{digits}f}"


def _load_policy(ref: str, model_spec: Any, sc: Any, arr: Any) -> tuple[Any, Any, dict]:
    """(policy(snapshot, state), initial state, start-up seconds per tier) for a policy by
    registry name (hbmserve.autoscale.registry.POLICIES), or `module:factory` where
    factory(model_spec) -> (policy(snapshot, state), initial_state)."""
    import importlib

    if ":" not in ref:
        return _registry_policy(ref, model_spec, sc, arr)
    mod_name, _, attr = ref.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as err:
        raise fail(f"--policy {ref}: {err}") from None
    policy, state = factory(model_spec)
    startup = model_spec.autoscaling.startup_s if model_spec.autoscaling else None
    return policy, state, _startup_map(startup)


def _startup_map(startup: Any) -> dict:
    from hbmserve.core.autoscaling_spec import TierStartup
    from hbmserve.core.scaling import Tier

    startup = startup or TierStartup()
    return {Tier.HOT: startup.hot, Tier.WARM: startup.warm, Tier.COLD: startup.cold}


def _registry_policy(name: str, m: Any, sc: Any, arr: Any) -> tuple[Any, Any, dict]:
    """Bind a registered policy to this model with the config the live system would run
    (autoscale/policy_config.py); replica capacity from the capacity model for this trace when the
    file does not state it."""
    from hbmserve.autoscale.policy_config import autoscale_config_for
    from hbmserve.autoscale.registry import POLICIES
    from hbmserve.capacity.perf.scenario import tpot_floor_s
    from hbmserve.capacity.perf.startup_measured import startup_estimate
    from hbmserve.capacity.sim.evaluate import estimate_capacity_rps

    entry = POLICIES.get(name)
    if entry is None:
        raise fail(f"--policy {name!r}: not a registered policy ({', '.join(POLICIES)}) nor module:factory")
    if m.autoscaling is None:
        raise fail(f"models.{m.name}.autoscaling: missing; --policy {name} needs min_replicas and "
                    f"max_replicas")
    config = autoscale_config_for(m, estimate_capacity_rps(sc, arr, m.name), tpot_floor_s(sc),
                                  startup_estimate(m, sc.deployment.gpu))
    cfg = entry.make_config(config, arr.rate_peak())
    return (lambda snapshot, state: entry.decide(snapshot, cfg, state)), entry.initial_state(), \
        config.startup_s


def simulate_cmd(
    config: Annotated[Path, typer.Option("--config", help="cluster YAML (core/config.py schema)")],
    trace: Annotated[Optional[Path], typer.Option("--trace", help="CSV (arrived_at,num_prefill_tokens,"
                                                  "num_decode_tokens) or JSONL trace")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    model: Annotated[Optional[str], typer.Option("--model", help="model name in the config (default: first)")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", help="synthetic arrivals (req/s) when no trace")] = None,
    duration: Annotated[float, typer.Option("--duration", help="synthetic trace length, seconds")] = 600.0,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens", help="synthetic mean prompt")] = 1000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens", help="synthetic mean output")] = 200.0,
    burstiness: Annotated[float, typer.Option("--burstiness", help="gamma CV of gaps: 1 Poisson, >1 bursty")] = 1.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    time_scale: Annotated[float, typer.Option("--time-scale", help="stretch trace time (0.5 = 2x rate)")] = 1.0,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="override the catalog GPU")] = None,
    model_config: Annotated[Optional[str], typer.Option("--model-config", help="override the model shape "
                                                        "(config.json or shipped name)")] = None,
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", help="override max_model_len")] = None,
    clip: Annotated[bool, typer.Option("--clip/--no-clip", help="shorten requests that exceed "
                                       "max_model_len instead of rejecting them")] = False,
    policy: Annotated[Optional[str], typer.Option("--policy", help="scaling policy: a registered name "
                                                  "(hbmserve, ray-default, static-peak, queue-threshold) or "
                                                  "module:factory returning (policy, state)")] = None,
    interval: Annotated[float, typer.Option("--decision-interval", help="policy period, seconds")] = 10.0,
    startup_hot: Annotated[Optional[float], typer.Option("--startup-hot", help="seconds; default: the "
                                                         "config's autoscaling.startup_s")] = None,
    startup_warm: Annotated[Optional[float], typer.Option("--startup-warm")] = None,
    startup_cold: Annotated[Optional[float], typer.Option("--startup-cold")] = None,
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="hardware catalog YAML")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write a time-series PNG")] = None,
    allow_slo_miss: Annotated[bool, typer.Option("--allow-slo-miss", help="run even when a full engine step "
                                                 "breaks the TPOT target (max_num_batched_tokens too large)")] = False,
    series: Annotated[Optional[Path], typer.Option("--series", help="write the per-second time series "
                                                   "(and scaling decisions) as JSON")] = None,
) -> None:
    """Replay a trace (or synthetic load) through a simulated cluster and report latency and cost."""
    import time

    from hbmserve.core.scaling import Tier
    from hbmserve.capacity.sim.evaluate import with_startup

    from hbmserve.capacity.sim.cluster_sim import PolicyBinding, cluster_for, simulate
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import scenario_for

    try:
        m = config_model(config, model)
        overrides = {t: s for t, s in ((Tier.HOT, startup_hot), (Tier.WARM, startup_warm),
                                       (Tier.COLD, startup_cold)) if s is not None}
        m = with_startup(m, overrides)
        sc = scenario_for(m, load_catalog(catalog), gpu, model_config, max_model_len)
        arr = arrivals_for(trace, rate, duration, prompt_tokens, output_tokens, burstiness, seed, time_scale)
    except user_errors() as err:
        raise fail(str(err)) from None
    if clip:
        arr = arr.clipped(sc.engine.max_model_len)
    binding = None
    if policy:
        try:
            pol, state, startup = _load_policy(policy, m, sc, arr)
        except user_errors() as err:
            raise fail(str(err)) from None
        binding = PolicyBinding(pol, state, interval, startup_s=startup)
    check = slo_check_for(sc, arr, m.autoscaling.max_replicas if policy and m.autoscaling else None)
    check_slo(check, m.name, allow_slo_miss)  # before the run: no fleet rescues a step over TPOT
    cluster = cluster_for(sc)
    with _progress(not json_out) as bar:
        bar.add_task(f"simulating {len(arr)} requests", total=None)
        t0 = time.perf_counter()
        result = simulate(cluster, arr, binding)
        wall = time.perf_counter() - t0
    s = result.summary
    out = {**s.to_json_dict(), "sim_wall_s": wall, "model": m.name, "gpu": sc.deployment.gpu.name,
           "model_shape": sc.deployment.model.name, "tp": sc.deployment.tp, "pp": sc.deployment.pp,
           "replicas": sc.replicas, "usd_per_gpu_hour": sc.usd_per_gpu_hour, **check.to_json_dict()}
    if arr.hashes is not None and sc.engine.enable_prefix_caching:
        from hbmserve.capacity.sim.prefix_bounds import cluster_capacity_hashes, prefix_bounds

        fleet = max(sc.replicas, s.peak_replicas)
        out.update(prefix_bounds(arr, cluster_capacity_hashes(sc.engine, fleet), sc.engine.hash_block_tokens)
                   .to_json_dict())
    if plot is not None:
        from hbmserve.capacity.sim.plots import plot_timeseries

        plot_timeseries(result, plot, f"{m.name}: {sc.deployment.model.name} on {sc.deployment.gpu.name} "
                                      f"TP{sc.deployment.tp}, {len(arr)} requests")
    if series is not None:
        ts = {k: [None if x != x else float(x) for x in v] for k, v in result.timeseries.items()}  # NaN -> null
        series.write_text(json.dumps({"series": ts, "decisions": [list(d) for d in result.decisions]}))
    if json_out:
        typer.echo(json.dumps(out))
        return
    _print_sim(out, s.rejected)
    if plot is not None:
        typer.echo(f"time series written to {plot}")


def _print_sim(out: dict[str, Any], rejected: int) -> None:
    from rich.table import Table

    c = wide_console()
    c.print(f"[bold]{out['model']}[/]: {out['model_shape']} on {out['gpu']} TP{out['tp']} PP{out['pp']}, "
            f"{out['replicas']} replica(s) at start")
    t = Table("latency (s)", "p50", "p90", "p95", "p99", "mean")
    for k in ("ttft", "tpot", "itl", "e2e"):
        t.add_row(k.upper(), *(_fmt(out[f"{k}_{q}_s"], digits=4) for q in ("p50", "p90", "p95", "p99", "mean")))
    c.print(t)
    r = Table("metric", "value")
    rows = [("requests finished / total", f"{out['finished']} / {out['requests']}"),
            ("rejected (over max_model_len)", str(rejected)), ("unfinished", str(out["unfinished"])),
            ("goodput (req/s meeting every SLO)", _fmt(out["goodput_rps"])),
            ("SLO attainment", f"{out['slo_attainment']:.2%}"), ("preemptions", str(out["preemptions"])),
            ("GPU-hours", _fmt(out["gpu_hours"])), ("cost", f"${out['cost_usd']:.2f}"),
            ("$ per million output tokens", _fmt(out["usd_per_mtok"])),
            ("output tokens/s", _fmt(out["output_tok_s"], digits=1)),
            ("mean / peak replicas", f"{out['mean_replicas']:.2f} / {out['peak_replicas']}"),
            ("simulated span / wall", f"{out['makespan_s']:.0f} s / {out['sim_wall_s']:.2f} s")]
    if out.get("bound_lru_hit_rate") is not None:
        rows.append(("prefix hit rate (bounds: one LRU of the fleet's cache / infinite)",
                     f"{out['prefix_hit_rate'] or 0:.1%} ({out['bound_lru_hit_rate']:.1%} / "
                     f"{out['bound_infinite_hit_rate']:.1%})"))
        if out.get("host_hit_tokens") and out.get("prompt_tokens"):
            rows.append(("  of which from the host KV tier", f"{out['host_hit_tokens'] / out['prompt_tokens']:.1%}"))
    for k, v in rows:
        r.add_row(k, v)
    c.print(r)
    if rejected:
        c.print(f"[yellow]{rejected} requests exceed max_model_len; raise it or pass --clip[/]")


def plan_cmd(
    model: Annotated[str, typer.Option("--model", help="config.json path or shipped shape name")],
    slo_ttft_p95: Annotated[float, typer.Option("--slo-ttft-p95", help="seconds")],
    slo_tpot_p95: Annotated[float, typer.Option("--slo-tpot-p95", help="seconds")],
    rate: Annotated[Optional[float], typer.Option("--rate", help="mean requests/s (Poisson)")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="CSV or JSONL trace")] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="comma list, e.g. h100,h200 "
                                                "(default: every GPU in the catalog)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print a JSON list of plans")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write the cost/latency frontier PNG")] = None,
    top: Annotated[int, typer.Option("--top", help="plans to print")] = 10,
    confirm_top: Annotated[int, typer.Option("--confirm-top", help="plans to confirm by simulation")] = 5,
    duration: Annotated[float, typer.Option("--duration", help="synthetic load length for --rate")] = 600.0,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens")] = 1000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens")] = 200.0,
    confirm_seconds: Annotated[Optional[float], typer.Option("--confirm-seconds", help="simulate only the "
                                                             "first N seconds of the trace")] = None,
    price: Annotated[Optional[list[str]], typer.Option("--price", help="GPU=USD per GPU-hour (repeat)")] = None,
    max_gpus: Annotated[int, typer.Option("--max-gpus", help="limit on GPUs in one plan")] = 512,
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="hardware catalog YAML")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    quantization: Annotated[Optional[str], typer.Option("--quantization", help="weight formats to search, "
                                                        "comma list of bf16, fp8, int8, int4 (default: bf16,fp8, "
                                                        "the formats without a known quality loss)")] = None,
    emit_config: Annotated[Optional[Path], typer.Option("--emit-config", help="write the first plan as a cluster "
                                                        "config that autoscale evaluate, up and deploy take")] = None,
    source: Annotated[Optional[str], typer.Option("--source", help="the model's weights in that config (hub id or "
                                                  "folder); default: the --model folder")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing --emit-config file")] = False,
    adapters: Annotated[Optional[int], typer.Option("--adapters", help="LoRA adapters served: size their slots on "
                                                    "the first plan (as plan-adapters does)")] = None,
    disagg: Annotated[bool, typer.Option("--disagg", help="also weigh the first plan's layout split into prefill "
                                         "and decode pools (as plan-disagg does)")] = False,
) -> None:
    """Search GPU x TP x PP x quantisation x engine knobs x replicas for the cheapest plan meeting the SLO."""
    from hbmserve.cli import plan_emit
    from hbmserve.cli.tier_plan import disagg_note, plan_note
    from hbmserve.core.config import SloSeconds
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.model_shape import load_model_shape
    from hbmserve.capacity.planning.planner import SearchSpace, plan
    from hbmserve.capacity.perf.scenario import resolve_gpu_name

    if (rate is None) == (trace is None):
        raise fail("give exactly one of --rate RPS or --trace FILE")
    if slo_ttft_p95 <= 0 or slo_tpot_p95 <= 0:
        raise fail("--slo-ttft-p95 and --slo-tpot-p95 must be > 0")
    if adapters is not None and adapters < 1:
        raise fail(f"--adapters: must be >= 1, not {adapters}")
    if emit_config is not None:
        plan_emit.check_target(emit_config, force)
        refs = plan_emit.model_refs(model, source)
    try:
        cat = load_catalog(catalog)
        for item in price or []:
            name, _, usd = item.partition("=")
            try:
                cat[resolve_gpu_name(name, cat)] = cat[resolve_gpu_name(name, cat)].with_price(float(usd))
            except ValueError:
                raise fail(f"--price {item!r}: expected GPU=USD, e.g. h100=2.5") from None
        names = [resolve_gpu_name(g, cat) for g in gpus.split(",") if g.strip()] if gpus else \
            [n for n in cat if n != "cpu-local"]
        shape = load_model_shape(model)
        quants = _quantizations(quantization) if quantization is not None else SearchSpace().quantizations
        arr = arrivals_for(trace, rate, duration, prompt_tokens, output_tokens, 1.0, seed, 1.0)
    except user_errors() as err:
        raise fail(str(err)) from None
    sim_arr = arr.window(0.0, confirm_seconds) if confirm_seconds else arr
    slo = SloSeconds(slo_ttft_p95, slo_tpot_p95)
    with _progress(not json_out) as bar:
        task = bar.add_task("planning", total=1)
        space = SearchSpace(max_total_gpus=max_gpus, quantizations=quants)
        result = plan(shape, [cat[n] for n in names], arr, slo, space,
                      confirm_top=confirm_top, sim_arrivals=sim_arr,
                      progress=lambda d, t, label: bar.update(task, completed=d, total=t, description=label))
    if plot is not None and result.plans:
        from hbmserve.capacity.planning.frontier_plot import plot_frontier

        plot_frontier(result.plans, plot, slo.ttft_s, slo.tpot_s, f"{shape.name}: cost vs latency")
    if json_out:
        typer.echo(json.dumps([p.to_json_dict() for p in result.plans[:max(top, 1)]]))
    else:
        _print_plans(result, top, shape.name)
        if plot is not None:
            typer.echo(f"frontier written to {plot}")
    if adapters and result.feasible:
        plan_note(result.plans[0], shape, cat, sim_arr, adapters, space, slo, json_out)
    if disagg and result.feasible:
        disagg_note(result.plans[0], shape, cat, sim_arr, space, slo, json_out)
    if not result.feasible:
        if not json_out:
            typer.echo("no confirmed plan meets the SLO; the first row is the closest", err=True)
        if emit_config is not None:
            typer.echo(f"no config written to {emit_config}: it would not meet the SLO", err=True)
        raise typer.Exit(EXIT_INFEASIBLE)
    if emit_config is not None:
        first = result.plans[0]
        target = plan_emit.target_for(first, shape.name, refs, slo, cat)
        command = plan_emit.plan_command(model, trace, rate, slo, gpus, emit_config)
        line = plan_emit.write_plan_config(emit_config, force, first, target, arr, cat, command, trace)
        typer.echo(line, err=json_out)  # with --json, stdout holds only the JSON


def _quantizations(text: str) -> tuple[str | None, ...]:
    """`--quantization bf16,fp8` -> (None, "fp8"); unknown names are a user error."""
    from hbmserve.capacity.perf.model_shape import ModelConfigError, weight_format

    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise ModelConfigError("--quantization: name at least one weight format (bf16, fp8, int8, int4)")
    for n in names:
        weight_format(n)  # raises ModelConfigError naming the known formats
    return tuple(dict.fromkeys(None if n in ("bf16", "none") else n for n in names))


def wide_console():
    import sys

    from rich.console import Console

    # Pipes and CI logs get a wide fixed width so tables are not squeezed into 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=150)


def _print_plans(result: Any, top: int, model_name: str) -> None:
    from rich.table import Table

    c = wide_console()
    t = Table("#", "layout", "replicas+warm", "seqs/budget/chunked", "TTFT p95 s", "TPOT p95 ms", "$/h",
              "$/Mtok in/out/blended", "$/1k req", "model err", "status",
              title=f"plans for {model_name} ({result.configs_evaluated} configurations, "
              f"{result.simulated} simulated)")
    style = {"confirmed": "[green]confirmed[/]", "candidate": "[yellow]candidate[/]"}
    for i, p in enumerate(result.plans[:top], start=1):
        engine = f"{p.max_num_seqs}/{p.max_num_batched_tokens}/{'on' if p.chunked_prefill else 'off'}"
        k, err = p.costs, p.analytic_error
        tokens = "-" if k is None else \
            f"{k.usd_per_mtok_input:.3f}/{k.usd_per_mtok_output:.3f}/{k.usd_per_mtok_blended:.3f}"
        t.add_row(str(i), p.layout + (" [red]*[/]" if p.quality_note else ""), f"{p.replicas}+{p.warm_replicas}",
                  engine, _fmt(p.ttft_p95_s), _fmt(p.tpot_p95_s, 1e3, 1), f"{p.usd_per_hour:.2f}", tokens,
                  _fmt(k and k.usd_per_1k_requests), "-" if err is None else f"{err:+.0%}",
                  style.get(p.status, f"[red]{p.status}[/]"))
    c.print(t)
    notes = {p.quantization: p.quality_note for p in result.plans[:top] if p.quality_note}
    for fmt, note in notes.items():
        c.print(f"[red]*[/] {fmt}: {note}", highlight=False)
    c.print("Confirmed plans met the SLO in the simulator on this trace; candidates are the analytic model's "
            "estimate only. Model err: analytic capacity per replica vs simulated. Input and output tokens are "
            "charged the replica time each uses (docs/benchmarks.md, Capacity).", style="dim")
    c.print(result.why)
    if not result.feasible and result.plans and result.plans[0].status != "candidate":
        c.print(f"[red]blocked:[/] {result.plans[0].reason}")
    if result.plans:
        from hbmserve.cli.plan_emit import config_sections

        c.print("the first plan as the model's config sections:\n" + config_sections(result.plans[0]), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
    app.command("plan")(plan_cmd)

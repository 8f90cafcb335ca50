"""Planning what a replica keeps beside its weights: `hbmserve plan-host-tier` (how much host memory
to give a model's KV tier, priced against the GPU-hours it saves on a trace, capacity/planning/
host_tier.py), `hbmserve prefix-trace` (prefix-heavy traces with hash_ids to plan and simulate on)
and `hbmserve plan-adapters` (a model's LoRA slots on adapter traffic, capacity/planning/
adapter_plan.py: per (GPU slots, host slots) the fewest replicas meeting the SLO and their $ per
million tokens, the pick and why, and what each adapter costs; `hbmserve plan --adapters N` prints
the same figures from one quick evaluation on the first plan's layout, `plan_note`) and `hbmserve
plan-disagg` (one fleet or a prefill pool and a decode pool, capacity/planning/disagg_plan.py: each
layout's cheapest size meeting the SLO by $ per million tokens, the pick and why; --plot the break-even)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hbmserve.cli.user_errors import fail, user_errors

# plan-adapters: requests simulated per slot candidate (about 20 candidates, a few runs each,
# stay well under a minute).
MAX_REQUESTS = 3000
# plan-disagg --plot: the knob's values, and the seconds of traffic the plan runs on at each.
SWEEP_PROMPTS = (500, 1000, 2000, 4000, 8000)
SWEEP_TPOT_MS = (10, 15, 20, 25, 30, 40)
SWEEP_SECONDS = 120.0


def plan_host_tier_cmd(
    config: Annotated[Path, typer.Option("--config", help="cluster YAML; the model needs enable_prefix_caching")],
    trace: Annotated[Path, typer.Option("--trace", help="JSONL trace with hash_ids (what can be reused)")],
    model: Annotated[Optional[str], typer.Option("--model", help="model name in the config (default: first)")] = None,
    sizes: Annotated[str, typer.Option("--sizes", help="host tier sizes to try, GiB per replica, comma-separated")]
    = "0,64,128,256,512,1024",
    usd_per_gib_hour: Annotated[Optional[float], typer.Option(
        "--host-usd-per-gib-hour", help="price of host memory, USD per GiB-hour (default: a placeholder of the "
        "order of cloud list prices; set your own)")] = None,
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="hardware catalog YAML")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Size the model's host-memory KV tier on a trace: replicas, hit rate, TTFT and $ per size."""
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import scenario_for
    from hbmserve.capacity.planning.host_tier import DEFAULT_USD_PER_GIB_HOUR, size_host_tier
    from hbmserve.capacity.traces.arrivals import read_trace
    from hbmserve.cli.capacity import config_model
    from hbmserve.core.config import SloSeconds

    try:
        m = config_model(config, model)
        try:
            gibs = tuple(float(x) for x in sizes.split(","))
        except ValueError:
            raise fail(f"--sizes: not a comma-separated list of numbers: {sizes!r}") from None
        sc = scenario_for(m, load_catalog(catalog))
        arrivals = read_trace(trace)
        if arrivals.hashes is None:
            raise fail(f"--trace {trace}: no hash_ids, so nothing in it can be reused from a cache")
        price = DEFAULT_USD_PER_GIB_HOUR if usd_per_gib_hour is None else usd_per_gib_hour
        plan = size_host_tier(sc.deployment, sc.engine, SloSeconds(sc.slo_ttft_s, sc.slo_tpot_s), arrivals,
                              sc.replicas, sc.usd_per_gpu_hour, price, gibs)
    except user_errors() as err:
        raise fail(str(err)) from None
    except ValueError as err:
        raise fail(f"models.{m.name}: {err}") from None
    if json_out:
        print(json.dumps({"model": m.name, "usd_per_gib_hour": price, "best_gib": plan.best.host_gib,
                          "reason": plan.reason, "options": [o.__dict__ for o in plan.options]}))
        return
    _print(m.name, plan, price, usd_per_gib_hour is None)


def _print(name: str, plan, price: float, default_price: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    t = Table("GiB/replica", "replicas", "SLO met", "hit", "host hit", "TTFT p95", "GPU-h", "host GiB-h", "$",
              title=f"{name}: host KV tier sizes on the trace")
    for o in plan.options:
        mark = "[bold]" if o is plan.best else ""
        t.add_row(f"{mark}{o.host_gib:g}", str(o.replicas), "yes" if o.meets_slo else "no", f"{o.prefix_hit_rate:.1%}",
                  f"{o.host_hit_rate:.1%}", "-" if o.ttft_p95_s is None else f"{o.ttft_p95_s:.3f}",
                  f"{o.gpu_hours:.2f}", f"{o.host_gib_hours:,.0f}", f"{o.usd:,.2f}")
    c.print(t)
    c.print(f"[bold]{plan.best.host_gib:g} GiB[/]: {plan.reason}", highlight=False, soft_wrap=True)
    note = " (a placeholder: pass --host-usd-per-gib-hour with your price)" if default_price else ""
    c.print(f"host memory at ${price:g} per GiB-hour{note}; set engine_settings.kv_offload_gib to the size",
            highlight=False, soft_wrap=True)


def prefix_trace_cmd(
    shape: Annotated[str, typer.Option("--shape", help="system-prompts | multi-turn | agent-loops")],
    out: Annotated[Path, typer.Option("--out", help="the JSONL file to write")],
    seed: Annotated[int, typer.Option("--seed")] = 0,
    duration: Annotated[Optional[float], typer.Option("--duration", help="seconds (default: the shape's)")] = None,
) -> None:
    """Write a prefix-heavy trace (shared system prompts, multi-turn chats, agent loops) as JSONL with
    hash_ids, for `simulate`, `plan-host-tier` and `autoscale evaluate`."""
    from dataclasses import replace

    from hbmserve.capacity.traces.arrivals import TraceError, write_jsonl_trace
    from hbmserve.capacity.traces.prefix_trace import PREFIX_SHAPES, prefix_arrivals

    if shape not in PREFIX_SHAPES:
        raise fail(f"--shape {shape!r}: one of {', '.join(PREFIX_SHAPES)}")
    spec = PREFIX_SHAPES[shape]
    try:
        arr = prefix_arrivals(spec if duration is None else replace(spec, duration_s=duration), seed)
        write_jsonl_trace(arr, out)
    except TraceError as err:
        raise fail(str(err)) from None
    except OSError as err:
        raise fail(f"--out {out}: {err.strerror or err}") from None
    typer.echo(f"{len(arr)} requests ({shape}, seed {seed}) written to {out}")


def plan_adapters_cmd(
    config: Annotated[Path, typer.Option("--config", help="cluster YAML")],
    model: Annotated[Optional[str], typer.Option("--model", help="model name in the config (default: first)")] = None,
    adapters: Annotated[Optional[int], typer.Option("--adapters", help="adapters served (default: the model's "
                                                    "declared adapters)")] = None,
    zipf: Annotated[float, typer.Option("--zipf", help="popularity skew: adapter k gets 1/(k+1)^S of the "
                                        "requests (0: all alike; 1 and above: a few hot, a long cold tail)")] = 1.0,
    rate: Annotated[float, typer.Option("--rate", help="requests/s, all adapters together")] = 20.0,
    duration: Annotated[float, typer.Option("--duration", help="seconds of synthetic traffic")] = 120.0,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="CSV or JSONL trace instead of --rate; a JSONL "
                                                  "`adapter` field names each request's adapter, else they are "
                                                  "drawn by --zipf")] = None,
    gpu_slots: Annotated[str, typer.Option("--gpu-slots", help="max_loras values to try, comma-separated")]
    = "1,2,4,8,16,32",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="hardware catalog YAML")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Size the model's LoRA slots on adapter traffic: replicas and $/Mtok per slot setting, $/Mtok per adapter."""
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import scenario_for
    from hbmserve.capacity.planning.adapter_plan import plan_adapter_slots
    from hbmserve.cli.capacity import config_model

    try:
        m = config_model(config, model)
        slots = _slots(gpu_slots)
        sc = scenario_for(m, load_catalog(catalog))
        arr, note = _arrivals(m, adapters, zipf, rate, duration, trace, seed)
        plan = plan_adapter_slots(sc, arr, m.lora.max_lora_rank, slots)
    except user_errors() as err:
        raise fail(str(err)) from None
    except ValueError as err:
        raise fail(f"models.{m.name}: {err}") from None
    title = f"{m.name}: {len(arr.adapter_names)} adapters, {len(arr):,} requests over {arr.duration_s:.0f} s{note}"
    if json_out:
        print(json.dumps({"model": m.name, "requests": len(arr), "adapters": len(arr.adapter_names),
                          **plan_json(plan)}))
        return
    _print_slots(title, plan)


def _slots(text: str, option: str = "--gpu-slots") -> tuple[int, ...]:
    try:
        slots = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise fail(f"{option}: not a comma-separated list of whole numbers: {text!r}") from None
    if min(slots) < 1:
        raise fail(f"{option}: each must be >= 1: {text!r}")
    return slots


def _arrivals(m: Any, adapters: Optional[int], zipf: float, rate: float, duration: float, trace: Optional[Path],
              seed: int) -> tuple[Any, str]:
    """The traffic to plan on, and a note when it was clipped to MAX_REQUESTS."""
    from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, adapter_arrivals, with_adapters
    from hbmserve.capacity.traces.arrivals import read_trace

    if adapters is not None and adapters < 1:
        raise fail(f"--adapters: must be >= 1, not {adapters}")
    if zipf < 0 or (trace is None and min(rate, duration) <= 0):
        raise fail("--zipf must be >= 0, --rate and --duration > 0")
    recorded = read_trace(trace) if trace is not None else None
    named = recorded is not None and recorded.adapters is not None
    if named and adapters is not None:
        raise fail(f"--adapters: the trace {trace} names its own adapters; leave it out")
    n = adapters or len(m.adapters)
    if not n and not named:
        raise fail(f"models.{m.name}.adapters: the model declares none; declare them or pass --adapters N")
    spec = AdapterTraceSpec(adapters=max(n, 1), zipf_s=zipf, rate_rps=rate, duration_s=duration,
                            max_context_tokens=min(4096, m.engine_settings.max_model_len))
    arr = recorded if named else with_adapters(recorded, spec, seed) if recorded is not None else \
        adapter_arrivals(spec, seed)
    if not named and len(m.adapters) == n:  # the model's own names, the first the most popular
        arr = dataclasses.replace(arr, adapter_names=tuple(a.name for a in m.adapters))
    clipped = _first(arr)
    return clipped, "" if clipped is arr else f" (the first {len(clipped):,} of {len(arr):,}, to keep the run short)"


def _first(arr: Any) -> Any:
    """The first MAX_REQUESTS requests of `arr` (all of a shorter trace)."""
    return arr if len(arr) <= MAX_REQUESTS else arr.window(0.0, float(arr.t[MAX_REQUESTS]))


def plan_json(plan: Any) -> dict[str, Any]:
    def cost(c: Any) -> dict[str, Any]:
        return {**dataclasses.asdict(c), "usd_per_mtok_input": c.usd_per_mtok_input,
                "usd_per_mtok_output": c.usd_per_mtok_output, "usd_per_mtok": c.usd_per_mtok}

    return {"best": dataclasses.asdict(plan.best), "reason": plan.reason,
            "options": [dataclasses.asdict(o) for o in plan.options], "adapter_costs": [cost(c) for c in plan.adapters]}


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _print_slots(title: str, plan: Any) -> None:
    from rich.table import Table

    from hbmserve.capacity.planning.adapter_plan import hot_and_tail
    from hbmserve.cli.capacity import wide_console

    c = wide_console()
    t = Table("GPU slots", "host slots", "replicas", "SLO met", "TTFT p95 s", "TPOT p95 ms", "SLO attained",
              "loads/min", "$/Mtok", title=f"{title}: slot settings")
    for o in plan.options:
        mark = "[bold]" if o is plan.best else ""
        t.add_row(f"{mark}{o.max_loras}", str(o.max_cpu_loras), str(o.replicas), "yes" if o.meets_slo else "no",
                  _f(o.ttft_p95_s, ".3f"), _f(o.tpot_p95_s and o.tpot_p95_s * 1e3, ".1f"), f"{o.slo_attainment:.1%}",
                  f"{o.loads_per_min:.1f}", _f(o.usd_per_mtok, ".4f"))
    c.print(t)
    a = Table("adapter", "requests", "loads", "load $", "$/Mtok in", "$/Mtok out", "$/Mtok",
              title=f"per adapter at the pick (${plan.best.usd:.4f} over the trace, split by activity)")
    for row in hot_and_tail(plan.adapters):
        a.add_row(row.adapter, f"{row.requests:,}", str(row.loads), f"{row.load_usd:.5f}",
                  _f(row.usd_per_mtok_input, ".4f"), _f(row.usd_per_mtok_output, ".4f"), _f(row.usd_per_mtok, ".4f"))
    c.print(a)
    b = plan.best
    c.print(f"[bold]lora: {{max_loras: {b.max_loras}, max_cpu_loras: {b.max_cpu_loras}}}[/]: {plan.reason}",
            highlight=False, soft_wrap=True)


def plan_note(first: Any, shape: Any, gpus: dict, arrivals: Any, adapters: int, space: Any, slo: Any,
              to_stderr: bool) -> None:
    """`hbmserve plan --adapters N`: the slot plan of the first plan's layout on the plan's own
    traffic (its first MAX_REQUESTS requests) with N adapters at Zipf 1, in a few lines."""
    from hbmserve.capacity.planning.adapter_plan import hot_and_tail, plan_adapter_slots
    from hbmserve.capacity.planning.planner import scenario_of
    from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, with_adapters
    from hbmserve.core.adapters import LoraSlots

    sc = scenario_of(first, shape, gpus, slo, space)
    arr = with_adapters(_first(arrivals), AdapterTraceSpec(adapters=adapters))
    plan = plan_adapter_slots(sc, arr, LoraSlots().max_lora_rank, first_guess=sc.replicas)
    per = "; ".join(f"{r.adapter} ${_f(r.usd_per_mtok_input, '.4f')} in, ${_f(r.usd_per_mtok_output, '.4f')} out"
                    for r in hot_and_tail(plan.adapters, top=1))
    b = plan.best
    typer.echo(f"LoRA, {adapters} adapters at Zipf 1 on {first.layout} ({len(arr):,} requests simulated; the plan "
               f"without adapters: {sc.replicas} replica{'s' if sc.replicas != 1 else ''}): lora: {{max_loras: {b.max_loras}, max_cpu_loras: "
               f"{b.max_cpu_loras}}}. {plan.reason}. $ per million tokens by adapter: {per}. The whole table, on "
               f"your adapters' own traffic: hbmserve plan-adapters --config C --adapters {adapters}", err=to_stderr)


def plan_disagg_cmd(
    model: Annotated[str, typer.Option("--model", help="config.json path or shipped shape name")],
    slo_ttft_p95: Annotated[float, typer.Option("--slo-ttft-p95", help="seconds")],
    slo_tpot_p95: Annotated[float, typer.Option("--slo-tpot-p95", help="seconds")],
    gpu: Annotated[str, typer.Option("--gpu", help="catalog GPU (a unique prefix will do)")] = "h100",
    tp: Annotated[int, typer.Option("--tp", help="tensor parallelism of a replica")] = 4,
    pool_tps: Annotated[Optional[str], typer.Option("--pool-tps", help="TPs to search per pool and fleet, "
                                                    "comma-separated (default: --tp and twice it, or half)")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", help="mean requests/s (gamma arrivals, CV 1)")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="CSV or JSONL trace instead of --rate")] = None,
    duration: Annotated[float, typer.Option("--duration", help="seconds of synthetic traffic")] = 300.0,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens", help="mean prompt (lognormal, CV 0.5)")] = 1000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens", help="mean output")] = 200.0,
    link: Annotated[str, typer.Option("--link", help="the KV's path between the pools: auto (NVLink within a "
                                      "node, else InfiniBand), nvlink, infiniband or host")] = "auto",
    max_gpus: Annotated[int, typer.Option("--max-gpus", help="the most GPUs a layout may use")] = 16,
    price: Annotated[Optional[float], typer.Option("--usd-per-gpu-hour", help="default: the catalog's")] = None,
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="hardware catalog YAML")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write the break-even plot (PNG): the plan again "
                                                 "as --sweep moves (minutes)")] = None,
    sweep: Annotated[str, typer.Option("--sweep", help=f"the plot's knob: prompt (mean prompts of "
                                       f"{', '.join(map(str, SWEEP_PROMPTS))} tokens at the trace's tokens/s) or tpot "
                                       f"(TPOT targets of {', '.join(map(str, SWEEP_TPOT_MS))} ms)")] = "prompt",
    sweep_seconds: Annotated[float, typer.Option("--sweep-seconds", help="seconds of traffic the plot's plans run "
                                                 "on (tpot: the trace's first)")] = SWEEP_SECONDS,
) -> None:
    """Aggregated or prefill/decode split: each layout's cheapest size meeting the SLO, by $/Mtok, and why."""
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.model_shape import load_model_shape
    from hbmserve.capacity.perf.perf_model import Deployment
    from hbmserve.capacity.perf.scenario import resolve_gpu_name
    from hbmserve.capacity.planning.disagg_plan import LINKS, plan_disagg
    from hbmserve.cli.capacity import arrivals_for
    from hbmserve.core.config import SloSeconds

    if (rate is None) == (trace is None):
        raise fail("give exactly one of --rate RPS or --trace FILE")
    checks = {"--slo-ttft-p95": slo_ttft_p95, "--slo-tpot-p95": slo_tpot_p95, "--prompt-tokens": prompt_tokens,
              "--output-tokens": output_tokens, "--tp": tp, "--max-gpus": max_gpus, "--sweep-seconds": sweep_seconds}
    for name, v in checks.items():
        if v <= 0:
            raise fail(f"{name}: must be > 0, not {v:g}")
    if link not in LINKS:
        raise fail(f"--link {link!r}: one of {', '.join(LINKS)}")
    if sweep not in ("prompt", "tpot"):
        raise fail(f"--sweep {sweep!r}: prompt or tpot")
    tps = _slots(pool_tps, "--pool-tps") if pool_tps else None
    if max_gpus < min(tps or (tp,)):
        raise fail(f"--max-gpus {max_gpus}: below one replica's {min(tps or (tp,))} GPUs")
    try:
        cat = load_catalog(catalog)
        g = cat[resolve_gpu_name(gpu, cat)]  # ScenarioError (a user error) names the known GPUs
        dep = Deployment(load_model_shape(model), g, tp)
        arr = arrivals_for(trace, rate, duration, prompt_tokens, output_tokens, 1.0, seed, 1.0)
        slo = SloSeconds(slo_ttft_p95, slo_tpot_p95)
        plan = plan_disagg(dep, arr, slo, max_gpus, link, tps, usd_per_gpu_hour=price)
    except user_errors() as err:
        raise fail(str(err)) from None
    except ValueError as err:
        where = "--tp/--pool-tps: " if str(err).startswith("TP") else ""
        raise fail(f"{where}{dep.model.name} on {g.name}: {err}") from None
    if plot is not None:
        _plot_break_even(plot, sweep, sweep_seconds, dep, arr, slo,
                         dict(max_gpus=max_gpus, link=link, tps=tps, usd_per_gpu_hour=price), seed)
    if json_out:
        print(json.dumps({"model": dep.model.name, "gpu": g.name, "requests": len(arr), "simulations": len(plan.tried),
                          "best": _option(plan.best), "reason": plan.reason,
                          "options": [_option(o) for o in plan.options]}))
        return
    _print_disagg(f"{dep.model.name} on {g.name}: {len(arr):,} requests over {arr.duration_s:.0f} s, at most "
                  f"{max_gpus} GPUs", plan, slo)
    if plot is not None:
        typer.echo(f"break-even plot written to {plot}")


def _plot_break_even(path: Path, knob: str, seconds: float, dep: Any, arr: Any, slo: Any, plan_kw: dict,
                     seed: int) -> None:
    from hbmserve.capacity.planning.break_even import break_even, plot_break_even

    values = SWEEP_PROMPTS if knob == "prompt" else tuple(ms / 1e3 for ms in SWEEP_TPOT_MS)
    be = break_even(dep, arr, slo, knob, values, seconds, seed, **plan_kw)
    where = (f"{seconds:g} s of traffic at each prompt length, TPOT p95 <= {slo.tpot_s * 1e3:g} ms" if knob == "prompt"
             else f"the trace's first {seconds:g} s ({arr.prompt.mean():,.0f} prompt tokens)")
    plot_break_even(be, path, f"{dep.model.name} on {dep.gpu.name}, at most {plan_kw['max_gpus']} GPUs\n{where}, "
                              f"TTFT p95 <= {slo.ttft_s:g} s, {arr.output.mean():.0f} output tokens (simulated)")


def _option(o: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(o), "layout": o.layout}


def _print_disagg(title: str, plan: Any, slo: Any) -> None:
    from rich.table import Table

    from hbmserve.cli.capacity import wide_console

    c = wide_console()
    t = Table("layout", "GPUs", "SLO met", "TTFT p95 s", "TPOT p95 ms", "SLO attained", "goodput rps", "$/Mtok",
              title=f"{title}: aggregated and split layouts, each at its cheapest size meeting the SLO")
    for o in plan.options:
        mark = "[bold]" if o is plan.best else ""
        t.add_row(f"{mark}{o.layout}" + (f" [dim]({o.note})[/]" if o.note else ""), str(o.gpus),
                  "yes" if o.meets_slo else "no", _f(o.ttft_p95_s, ".2f"),
                  _f(o.tpot_p95_s and o.tpot_p95_s * 1e3, ".1f"),
                  f"{o.slo_attainment:.1%}", f"{o.goodput_rps:.2f}", _f(o.usd_per_mtok, ".3f"))
    c.print(t)
    c.print(f"[bold]{plan.best.kind}[/]: {plan.reason}", highlight=False, soft_wrap=True)
    c.print(f"SLO: TTFT p95 <= {slo.ttft_s:g} s, TPOT p95 <= {slo.tpot_s * 1e3:g} ms; {len(plan.tried)} simulations. "
            "Simulator predictions: $ per million tokens counts input and output.", style="dim")


def disagg_note(first: Any, shape: Any, gpus: dict, arrivals: Any, space: Any, slo: Any, to_stderr: bool) -> None:
    """`hbmserve plan --disagg`: the first plan's GPU and TP, aggregated or split on the plan's own
    traffic (its first MAX_REQUESTS requests), up to twice the plan's GPUs, in a few lines."""
    from hbmserve.capacity.planning.disagg_plan import plan_disagg
    from hbmserve.capacity.planning.planner import scenario_of

    dep = scenario_of(first, shape, gpus, slo, space).deployment
    fleet = (first.replicas + first.warm_replicas) * dep.num_gpus
    arr = _first(arrivals)
    try:
        plan = plan_disagg(dep, arr, slo, max(16, 2 * fleet))
    except ValueError as err:
        typer.echo(f"aggregated or split: not compared on {first.layout}: {err}", err=to_stderr)
        return
    typer.echo(f"Aggregated or split on {first.layout} ({len(arr):,} requests simulated, up to {max(16, 2 * fleet)} "
               f"GPUs): {plan.best.kind} wins. {plan.reason}. The whole table: hbmserve plan-disagg --model "
               f"{shape.name} --gpu {dep.gpu.name} --tp {dep.tp} ...", err=to_stderr)


def register(app: typer.Typer) -> None:
    app.command("plan-host-tier")(plan_host_tier_cmd)
    app.command("prefix-trace")(prefix_trace_cmd)
    app.command("plan-adapters")(plan_adapters_cmd)
    app.command("plan-disagg")(plan_disagg_cmd)

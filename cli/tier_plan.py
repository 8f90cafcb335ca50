"""KV cache planning commands: `hbmserve plan-host-tier` (how much host memory to give a model's
KV tier, priced against the GPU-hours it saves on a trace, capacity/planning/host_tier.py) and
`hbmserve prefix-trace` (prefix-heavy traces with hash_ids to plan and simulate on)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from hbmserve.cli.user_errors import fail, user_errors


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


def register(app: typer.Typer) -> None:
    app.command("plan-host-tier")(plan_host_tier_cmd)
    app.command("prefix-trace")(prefix_trace_cmd)

"""The per-model lines of `hbmserve status` (cli/serve.py prints the table above them)."""

from __future__ import annotations

import statistics

from rich.console import Console

from hbmserve.core.scaling import ReplicaState


def print_models(out: Console, models) -> None:
    """Each model's lines under the table: latency against the SLO, autoscaling, weights, sleep,
    front doors, LoRA adapters, KV routing, placement."""
    for m in models:
        out.print(f"[bold]{m.name}[/] {_figures(m)}", highlight=False, soft_wrap=True)
        if m.autoscale:
            out.print(f"[bold]{m.name}[/] autoscale -> {m.autoscale.serve_target} replicas: {m.autoscale.reason}",
                      highlight=False)
        starts = [r for r in m.replica_stats if r.weights_cached is not None]
        if starts:
            hits = sum(1 for r in starts if r.weights_cached)
            out.print(f"[bold]{m.name}[/] weights: {hits} of {len(starts)} replicas started from the node's cache; "
                      f"{len(starts) - hits} fetched from the source (slowest "
                      f"{max(r.weights_s or 0.0 for r in starts):.1f} s)", highlight=False)
        if any(r.sleeping or r.wake_s is not None for r in m.replica_stats):
            out.print(f"[bold]{m.name}[/] {_sleep_line(m.replica_stats)}", highlight=False)
        if m.traffic:
            t = m.traffic
            out.print(f"[bold]{m.name}[/] front doors: {sum(x.accepted for x in t)} accepted, "
                      f"{sum(x.rejected for x in t)} refused, {sum(x.queued for x in t)} queued now; "
                      f"replicas reached: {' / '.join(str(x.routable) for x in t)}", highlight=False)
        pools_line = _pools_line(m.traffic or ())
        if pools_line:
            out.print(f"[bold]{m.name}[/] {pools_line}", highlight=False, soft_wrap=True)
        adapter_line = _adapter_line(m)
        if adapter_line:
            out.print(f"[bold]{m.name}[/] {adapter_line}", highlight=False, soft_wrap=True)
        kv_line = _kv_line(m)
        if kv_line:
            out.print(f"[bold]{m.name}[/] {kv_line}", highlight=False, soft_wrap=True)
        placed = [r.placement for r in m.replica_stats if r.placement is not None]
        if placed:
            ok = sum(1 for p in placed if p.placement_verified)
            out.print(f"[bold]{m.name}[/] placement verified on {ok}/{len(placed)} replicas", highlight=False)
            for p in placed:
                if not p.placement_verified:
                    out.print(f"  [yellow]{p.reason}[/] (expected extra all-reduce "
                              f"{p.expected_extra_allreduce_us} us)", highlight=False)


def _pools_line(traffic) -> str | None:
    """A disaggregated model's pools as the front doors reach them, and how its requests ran."""
    doors = [t for t in traffic if t.prefill_routable is not None]
    if not doors:
        return None
    runs: dict[str, int] = {}
    for t in doors:
        for outcome, n in t.two_phase:
            runs[outcome] = runs.get(outcome, 0) + n
    aggregated = {k.removeprefix("aggregated_").replace("_", " "): n for k, n in runs.items()
                  if k.startswith("aggregated_")}
    whole = (f"{sum(aggregated.values())} aggregated ({', '.join(f'{k}: {n}' for k, n in sorted(aggregated.items()))})"
             if aggregated else "0 aggregated")
    return (f"pools: prefill {' / '.join(str(t.prefill_routable) for t in doors)}, decode "
            f"{' / '.join(str(t.routable) for t in doors)} replicas reached; requests: {runs.get('two_phase', 0)} "
            f"in two phases, {whole}, {runs.get('prefill_failed', 0)} prefills tried again")


def role_note(r) -> str:
    if r.role is not ReplicaState.STANDBY:
        return ""
    return " (asleep)" if r.sleeping else " (standby)"


def _sleep_line(stats) -> str:
    """Standbys asleep now and the wakes the replicas measured (the sleeping tier's start-up)."""
    asleep = sum(1 for r in stats if r.sleeping)
    wakes = [r.wake_s for r in stats if r.wake_s is not None]
    wake = (f"last wake {statistics.median(wakes):.2f} s (median of {len(wakes)} replica{'s' * (len(wakes) > 1)})"
            if wakes else "no wake measured yet")
    return f"sleep mode: {asleep} standby asleep; {wake}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else (f"{value:.2f}s" if value >= 1 else f"{value * 1000:.0f}ms")


def _figures(m) -> str:
    """p95 TTFT/TPOT against the SLO, replicas by role, $/hour: one line."""
    r = m.roles
    roles = (f"replicas {r.active} active, {r.standby} standby, {r.starting} starting, {r.draining} draining, "
             f"{r.warm} warm")
    cost = "$/hour -" if m.usd_per_hour is None else f"${m.usd_per_hour:.2f}/hour"
    lat = m.latency
    if lat is None:
        return f"p95 TTFT -, TPOT - (no replica reported); {roles}; {cost}"
    verdict = {True: "ok", False: "[red]over[/]", None: "-"}
    return (f"p95 TTFT {_seconds(lat.ttft_p95_s)} / SLO {_seconds(lat.slo_ttft_p95_s)} {verdict[lat.ttft_ok]}, "
            f"TPOT {_seconds(lat.tpot_p95_s)} / SLO {_seconds(lat.slo_tpot_p95_s)} {verdict[lat.tpot_ok]} "
            f"({lat.requests} requests since the replicas started); {roles}; {cost}")


ADAPTERS_SHOWN = 5


def _adapter_line(m) -> str | None:
    """Each LoRA adapter's traffic over the doors, busiest first (the rest summed)."""
    rows: dict[str, list] = {}
    for t in m.traffic:
        for a in t.adapters:
            r = rows.setdefault(a.adapter, [0, 0, 0, 0, 0, 0, None])
            for i, v in enumerate((a.requests, a.failed, a.prompt_tokens + a.completion_tokens, a.loads, a.unloads,
                                   a.resident)):
                r[i] += v
            if a.ttft_p95_s is not None:
                r[6] = max(r[6] or 0.0, a.ttft_p95_s)
    if not rows:
        return None
    busiest = sorted(rows.items(), key=lambda kv: -kv[1][0])
    parts = [f"{name} {req} req ({bad} failed), {tok} tok, TTFT p95 {_seconds(p95)}, loads {loads}/unloads "
             f"{unloads}, on {held} replica(s)" for name, (req, bad, tok, loads, unloads, held, p95) in busiest[:ADAPTERS_SHOWN]]
    rest = busiest[ADAPTERS_SHOWN:]
    if rest:
        parts.append(f"{len(rest)} more: {sum(r[0] for _, r in rest)} req, loads {sum(r[3] for _, r in rest)}")
    return "adapters: " + "; ".join(parts)


def _kv_line(m) -> str | None:
    """The prefix cache's hit rate (the model, then each replica) and each door's KV index."""
    rates = [(r.prefix_hit_tokens, r.prompt_tokens) for r in m.replica_stats if r.prompt_tokens]
    doors = [t.kv for t in m.traffic if t.kv is not None]
    if not rates and not doors:
        return None
    parts = []
    if rates:
        hits, prompt = sum(h for h, _ in rates), sum(p for _, p in rates)
        parts.append(f"prefix cache hit {hits / prompt:.1%} ({' / '.join(f'{h / p:.0%}' for h, p in rates)} by replica)")
    if doors:
        hashed = sum(k.hashed for k in doors)
        ms = sum(k.hash_ms * k.hashed for k in doors) / hashed if hashed else 0.0
        parts.append(f"KV index at {len(doors)} door(s): {max(k.hbm_blocks for k in doors)} HBM + "
                     f"{max(k.host_blocks for k in doors)} host blocks, streams {' / '.join(str(k.streams) for k in doors)}, "
                     f"untrusted {sum(k.untrusted for k in doors)}, lag {max(k.max_lag_s for k in doors):.2f} s, "
                     f"batches lost {sum(k.lost for k in doors)} of {sum(k.batches for k in doors)}, "
                     f"hashing {ms:.2f} ms a request")
    return "; ".join(parts)

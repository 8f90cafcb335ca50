"""`hbmserve autoscale burst-trace | code-trace | lulls-trace | diurnal-trace`: write a synthetic
trace (sharp bursts, prompt-heavy code completion, heavy-tailed lulls and bursts, bursty diurnal)
in the Azure layout every trace reader takes. Registered on `hbmserve autoscale` by autoscale.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from hbmserve.cli.user_errors import fail

# Options every trace writer takes, and the mean overrides of the ones with a length mix.
TraceOut = Annotated[Path, typer.Option("--out", help="CSV file to write (Azure layout)")]
Seed = Annotated[int, typer.Option("--seed")]
Duration = Annotated[float, typer.Option("--duration", help="seconds")]
MixPromptTokens = Annotated[Optional[float], typer.Option("--prompt-tokens", help="mean; default: "
                                                          "the mix's")]
MixOutputTokens = Annotated[Optional[float], typer.Option("--output-tokens", help="mean; default: "
                                                          "the mix's")]


def burst_trace_cmd(
    out: TraceOut,
    seed: Seed = 0,
    duration: Duration = 3600.0,
    base_rps: Annotated[float, typer.Option("--base-rps")] = 5.0,
    burst_rps: Annotated[float, typer.Option("--burst-rps")] = 25.0,
    bursts: Annotated[int, typer.Option("--bursts")] = 4,
    burst_s: Annotated[float, typer.Option("--burst-seconds")] = 300.0,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens", help="mean")] = 1000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens", help="mean")] = 200.0,
) -> None:
    """Write a synthetic trace with sharp bursts (see capacity/traces/burst_trace.py)."""
    from hbmserve.capacity.traces.burst_trace import BurstSpec, burst_arrivals

    spec = _spec(BurstSpec, duration_s=duration, base_rps=base_rps, burst_rps=burst_rps,
                 bursts=bursts, burst_s=burst_s, prompt_tokens=prompt_tokens,
                 output_tokens=output_tokens)
    _write_trace(burst_arrivals(spec, seed), out, duration)


def code_trace_cmd(
    out: TraceOut,
    seed: Seed = 0,
    duration: Duration = 3600.0,
    base_rps: Annotated[float, typer.Option("--base-rps")] = 4.0,
    peak_rps: Annotated[float, typer.Option("--peak-rps", help="top of the swell")] = 12.0,
    spikes: Annotated[int, typer.Option("--spikes")] = 2,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens", help="mean")] = 2000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens", help="mean")] = 32.0,
) -> None:
    """Write a synthetic prompt-heavy (code completion) trace (see capacity/traces/code_trace.py)."""
    from hbmserve.capacity.traces.code_trace import CodeTraceSpec, code_arrivals

    spec = _spec(CodeTraceSpec, duration_s=duration, base_rps=base_rps, peak_rps=peak_rps,
                 spikes=spikes, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    _write_trace(code_arrivals(spec, seed), out, duration)


def lulls_trace_cmd(
    out: TraceOut,
    seed: Seed = 0,
    duration: Duration = 3600.0,
    lull_rps: Annotated[float, typer.Option("--lull-rps")] = 1.0,
    burst_rps: Annotated[float, typer.Option("--burst-rps", help="mean burst height")] = 10.0,
    lull_s: Annotated[float, typer.Option("--lull-seconds", help="mean lull")] = 180.0,
    burst_s: Annotated[float, typer.Option("--burst-seconds", help="mean burst")] = 90.0,
    mix: Annotated[str, typer.Option("--mix", help="prompt-heavy or chat")] = "prompt-heavy",
    diurnal_amplitude: Annotated[float, typer.Option("--diurnal-amplitude", help="0 to 1")] = 0.0,
    diurnal_period: Annotated[float, typer.Option("--diurnal-period", help="seconds")] = 86400.0,
    prompt_tokens: MixPromptTokens = None,
    output_tokens: MixOutputTokens = None,
) -> None:
    """Write a synthetic trace of heavy-tailed lulls and bursts (see capacity/traces/lulls_trace.py)."""
    from hbmserve.capacity.traces.lulls_trace import LullsTraceSpec, lulls_arrivals

    spec = _spec(LullsTraceSpec, duration_s=duration, lull_rps=lull_rps, burst_rps=burst_rps,
                 lull_s=lull_s, burst_s=burst_s, mix=mix, diurnal_amplitude=diurnal_amplitude,
                 diurnal_period_s=diurnal_period, prompt_tokens=prompt_tokens,
                 output_tokens=output_tokens)
    _write_trace(lulls_arrivals(spec, seed), out, duration)


def diurnal_trace_cmd(
    out: TraceOut,
    seed: Seed = 0,
    duration: Duration = 3600.0,
    base_rps: Annotated[float, typer.Option("--base-rps", help="the swell's mean")] = 4.0,
    amplitude: Annotated[float, typer.Option("--amplitude", help="0 to 1, of base")] = 0.5,
    period: Annotated[Optional[float], typer.Option("--period", help="seconds; default: "
                                                    "the duration")] = None,
    bursts: Annotated[int, typer.Option("--bursts")] = 4,
    mix: Annotated[str, typer.Option("--mix", help="chat or prompt-heavy")] = "chat",
    prompt_tokens: MixPromptTokens = None,
    output_tokens: MixOutputTokens = None,
) -> None:
    """Write a synthetic diurnal trace with bursts on the swell (see capacity/traces/diurnal_trace.py)."""
    from hbmserve.capacity.traces.diurnal_trace import DiurnalTraceSpec, diurnal_arrivals

    spec = _spec(DiurnalTraceSpec, duration_s=duration, base_rps=base_rps, amplitude=amplitude,
                 period_s=period, bursts=bursts, mix=mix, prompt_tokens=prompt_tokens,
                 output_tokens=output_tokens)
    _write_trace(diurnal_arrivals(spec, seed), out, duration)


def _spec(cls: Any, **fields: Any) -> Any:
    """`cls(**fields)`, its ValueError a one-line error."""
    try:
        return cls(**fields)
    except ValueError as err:
        raise fail(str(err)) from None


def _write_trace(arr: Any, out: Path, duration: float) -> None:
    rows = (f"{t:.6f},{p},{o}" for t, p, o in zip(arr.t, arr.prompt, arr.output))
    try:
        out.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    except OSError as err:
        raise fail(f"--out {out}: {err.strerror or err}") from None
    typer.echo(f"{len(arr)} requests over {duration:g} s written to {out}")


def register(sub: typer.Typer) -> None:
    sub.command("burst-trace")(burst_trace_cmd)
    sub.command("code-trace")(code_trace_cmd)
    sub.command("lulls-trace")(lulls_trace_cmd)
    sub.command("diurnal-trace")(diurnal_trace_cmd)

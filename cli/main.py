"""`hbmserve` command line. Each area registers its own commands (see SUBCOMMAND_MODULES)."""

from __future__ import annotations

import importlib
import os
import sys

import typer

# Each module exposes `register(app: typer.Typer) -> None`. Kept as a registry so an area's
# commands live beside its code and this file never grows an if/elif of features.
SUBCOMMAND_MODULES = (
    "hbmserve.cli.serve",
    "hbmserve.cli.placement",
    "hbmserve.cli.capacity",
    "hbmserve.cli.tier_plan",
    "hbmserve.cli.autoscale",
    "hbmserve.cli.weights_cache",
    "hbmserve.cli.bench",
)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="hbmserve",
        help="Ray-based LLM serving: serve, place, autoscale and plan capacity around HBM.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(app)
    return app


def main() -> None:
    # Every command connects to a named cluster or none. Without this, a Ray call made after
    # disconnecting (e.g. by a Serve handle's background thread) would silently start a private
    # local cluster, and Ray 2.60 would write ~/.ray/auth_token, which turns token auth on for
    # every later `ray start` on the machine. Read by Ray when it is first imported.
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    try:
        build_app()()
    except SystemExit as done:
        _exit(done)


def _exit(done: SystemExit) -> None:
    """Leave with the command's exit code. A command that is still connected to Ray (status,
    deploy) skips Ray's teardown at interpreter exit: a Serve handle's background thread can touch
    the core worker after `ray.shutdown()`, and the core worker then ends the process with 1
    after the command had printed its answer (seen in CI: `status --json` printed in full, exit
    1). The output is flushed first; the cluster notices the driver's exit as it would anyway."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        raise done
    code = done.code
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

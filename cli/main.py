"""`hbmserve` command line. Each area registers its own commands (see SUBCOMMAND_MODULES)."""

from __future__ import annotations

import importlib
import os

import typer

# Each module exposes `register(app: typer.Typer) -> None`. Kept as a registry so an area's
# commands live beside its code and this file never grows an if/elif of features.
SUBCOMMAND_MODULES = (
    "hbmserve.cli.serve",
    "hbmserve.cli.serve_config",
    "hbmserve.cli.placement",
    "hbmserve.cli.capacity",
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
    build_app()()

"""`hbmserve serve-config`: the Serve config that deploys a cluster config with Ray's own tooling
(`serve deploy`, or a KubeRay RayService's serveConfigV2) instead of `hbmserve deploy`."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from hbmserve.cli.serve import ALLOW_SLO_MISS_HELP, _load
from hbmserve.deployments.apps.declarative import DEFAULT_INTERNAL_TOKEN_FILE, serve_config


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
    app.command("serve-config")(serve_config_command)

"""Ray's token authentication (Ray 2.60, `RAY_AUTH_MODE=token`) and loopback binding for the
local head `hbmserve up` starts, and for the commands that talk to it.

A plain `ray start --head` lets anyone who reaches the machine run code on it. The local head is
therefore started with token authentication on, with a token kept where Ray's own tools look
for it after the environment: `~/.ray/auth_token` (or `RAY_AUTH_TOKEN_PATH`), mode 0600. Ray
only reads it in token mode, so a shell that runs Ray's CLI against the head (`ray job submit`,
`ray status`) needs one step, which `hbmserve ray-env` prints:

    eval "$(hbmserve ray-env)"      # export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=...

hbmserve's own commands (`deploy`, `status`, `down`) take that step themselves.

On loopback the head runs in Ray's single-machine mode (LOOPBACK_ENV, what Ray runs on macOS):
`ray start` otherwise swaps a loopback `--node-ip-address` for the machine's own address and
its GCS, raylet, agents and metrics listen on every interface. A client of such a head needs
the same mode, or Ray swaps 127.0.0.1 in the address it dials too.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def token_path() -> Path:
    """Where the token is kept: Ray's own default unless RAY_AUTH_TOKEN_PATH says otherwise."""
    return Path(os.environ.get(TOKEN_PATH_ENV) or Path.home() / ".ray" / "auth_token")


def ensure_token() -> Path | None:
    """The token file, written (0600, in a 0700 folder) when there is none; its mode is
    tightened to 0600 when looser. None when RAY_AUTH_TOKEN gives the token itself."""
    if os.environ.get(TOKEN_ENV):
        return None
    path = token_path()
    if path.is_file() and path.read_text().strip():
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            path.chmod(0o600)
        return path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def head_auth_on() -> bool:
    """Token authentication for the local head, unless the caller set RAY_AUTH_MODE=disabled
    (Ray's own opt-out; `up` then also needs --insecure)."""
    return os.environ.get(MODE_ENV, "token").lower() != "disabled"


def head_env() -> dict[str, str]:
    """What `ray start --head` is given: token mode and the token, unless opted out."""
    if not head_auth_on():
        return {}
    path = ensure_token()
    return {MODE_ENV: "token", **({TOKEN_PATH_ENV: str(path)} if path is not None else {})}


def token_env() -> dict[str, str] | None:
    """The variables that put a Ray client in token mode with the token kept here; None when
    none is kept here (no head with auth was started by this user)."""
    if os.environ.get(TOKEN_ENV):
        return {MODE_ENV: "token"}
    path = token_path()
    return {MODE_ENV: "token", TOKEN_PATH_ENV: str(path)} if path.is_file() else None


def client_env() -> dict[str, str]:
    """What this process needs to talk to the local head: nothing when its environment already
    chose a mode (the caller's word stands) or when no token is kept here."""
    if os.environ.get(MODE_ENV):
        return {}
    return token_env() or {}

"""May this request go on? The one auth decision for a path and its Authorization header.

Fails closed: with a key ring, only `/health` goes through without a credential; inference
paths need a tenant key, every other path the admin token (paths.py). The decision carries the
HTTP status and OpenAI error fields the driver answers with; its `reason` is safe to send and
to log (it never contains a key).
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.access.keys import KeyRing, Tenant, authenticate, is_admin
from hbmserve.access.paths import PathClass, required_credential


@dataclass(frozen=True)
class Granted:
    path_class: PathClass
    # The caller's tenant on an inference path; None on public and admin paths and with auth off.
    tenant: Tenant | None
    reason: str


@dataclass(frozen=True)
class Denied:
    status: int  # 401: no valid credential for the path; 403: a tenant key on an admin path
    err_type: str  # OpenAI error `type` and `code`
    code: str
    reason: str  # the error message sent to the client


def authorize(ring: KeyRing | None, path: str, authorization: bytes | str | None) -> Granted | Denied:
    """`ring` None means auth is off (the config has no `serve.auth`): everything is granted."""
    path_class = required_credential(path)
    if ring is None:
        return Granted(path_class, None, "auth is off (no serve.auth in the config)")
    if path_class is PathClass.PUBLIC:
        return Granted(path_class, None, "public path")
    tenant = authenticate(ring, authorization)
    if path_class is PathClass.INFERENCE:
        if tenant is None:
            return Denied(401, "authentication_error", "invalid_api_key", "Invalid or missing API key.")
        return Granted(path_class, tenant, f"tenant {tenant.name}")
    if is_admin(ring, authorization):
        return Granted(path_class, None, "admin token")
    if tenant is not None:
        return Denied(403, "permission_error", "admin_token_required",
                      "This path needs the admin token; an API key is not enough.")
    why = "" if ring.admin_digest is not None else ", and none is configured (serve.auth.admin_token_file)"
    return Denied(401, "authentication_error", "invalid_admin_token", f"This path needs the admin token{why}.")

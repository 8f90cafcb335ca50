"""The front door's adapter to the access brain (access/): loads the key files, authorizes each
request, and keeps each tenant's rate-limit buckets.

Fails closed: a config with `serve.auth` whose files cannot be read or parsed raises
`AccessConfigError` in the front door's constructor, so the deployment fails and `hbmserve
deploy` says why; there is no fallback to "no auth". Errors name the config field and the file,
never a key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hbmserve.access.authorize import Denied, authorize
from hbmserve.access.keys import KeyRing, KeysFileError, Tenant, parse_admin_token, parse_keys_file
from hbmserve.access.limits import Allowed, Limited, TenantLimits, estimated_tokens
from hbmserve.core.config import AuthSpec


class AccessConfigError(RuntimeError):
    """serve.auth names files this process cannot use; the message says which and why."""


@dataclass(frozen=True)
class Refusal:
    """A request answered with an OpenAI-style error instead of being served."""

    status: int
    message: str
    err_type: str
    code: str
    retry_after_s: int | None = None


@dataclass(frozen=True)
class Credential:
    tenant: Tenant | None  # None with auth off, or on an admin path


def _read(field: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise AccessConfigError(f"serve.auth.{field}: cannot read {path} ({err.strerror or err}); the front "
                                "door refuses to start without its keys") from None


def load_key_ring(auth: AuthSpec | None) -> KeyRing | None:
    """The configured key ring, or None when the config has no `serve.auth` (auth off)."""
    if auth is None:
        return None
    try:
        ring = parse_keys_file(_read("keys_file", auth.keys_file), auth.keys_file)
        if auth.admin_token_file is not None:
            token = parse_admin_token(_read("admin_token_file", auth.admin_token_file), auth.admin_token_file)
            ring = KeyRing(tenants=ring.tenants, keys=ring.keys, admin_digest=token)
    except KeysFileError as err:
        raise AccessConfigError(f"serve.auth: {err}") from None
    return ring


class AccessGuard:
    def __init__(self, ring: KeyRing | None, clock=time.monotonic):
        self.ring = ring
        self._limits: dict[str, TenantLimits] = {}
        self._clock = clock

    @property
    def enforced(self) -> bool:
        return self.ring is not None

    def check(self, path: str, headers: list[tuple[bytes, bytes]]) -> Credential | Refusal:
        authorization = next((v for k, v in headers if k == b"authorization"), None)
        decision = authorize(self.ring, path, authorization)
        if isinstance(decision, Denied):
            return Refusal(decision.status, decision.reason, decision.err_type, decision.code)
        return Credential(decision.tenant)

    def charge(self, credential: Credential, prompt_tokens: int, max_tokens: int, n: int) -> Refusal | None:
        """Draw one request and its estimated tokens from the tenant's buckets, or refuse: 429 with
        Retry-After when the tenant is over its rate, 400 when the request alone exceeds a
        minute's allowance (no wait would help)."""
        tenant = credential.tenant
        if tenant is None or (tenant.requests_per_minute is None and tenant.tokens_per_minute is None):
            return None
        limits = self._limits.get(tenant.name) or TenantLimits.of(tenant)
        decision, self._limits[tenant.name] = limits.take(estimated_tokens(prompt_tokens, max_tokens, n),
                                                          self._clock())
        if isinstance(decision, Allowed):
            return None
        if isinstance(decision, Limited):
            return Refusal(429, decision.reason, "rate_limit_error", "rate_limit_exceeded", decision.retry_after_s)
        return Refusal(400, decision.reason, "invalid_request_error", "request_too_large")

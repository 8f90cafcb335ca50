"""API keys and the tenants they name, parsed from the keys file; who a request's key belongs to.

The keys file (`serve.auth.keys_file`, typically a mounted Kubernetes Secret) is YAML:

    tenants:
      - name: team-a                  # shown in logs, metrics and `status`; a key never is
        keys: [sk-team-a-0123456789, "sha256:9f86d0...(64 hex digits)"]
        priority: 1                   # larger is more important; default 0
        requests_per_minute: 600      # omitted = unlimited
        tokens_per_minute: 200000     # charged at most at admission, settled by the engine's usage

A key is held only as its SHA-256 digest, and `sha256:<hex>` lets the file hold the digest
alone. Digests, not keys, are compared, each with `hmac.compare_digest`, and against every
stored digest with no early exit: how long a check takes depends on the number of keys, not on
which key (if any) matched. Nothing here returns, formats or logs a key: `Tenant` has no key
field, `KeyRing`'s repr shows names and counts, and `KeysFileError` names the field at fault
(`tenants.1.keys.0`), never its value.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

MIN_KEY_CHARS = 16
_DIGEST_PREFIX = "sha256:"


class KeysFileError(ValueError):
    """A keys or admin token file that cannot be used; the message is for the user as-is and
    never contains a key."""


@dataclass(frozen=True)
class Tenant:
    name: str
    priority: int
    requests_per_minute: int | None  # None: unlimited
    tokens_per_minute: int | None


@dataclass(frozen=True, repr=False)
class KeyRing:
    tenants: tuple[Tenant, ...]
    # (SHA-256 digest of a key, the tenant it names); never the key itself.
    keys: tuple[tuple[bytes, Tenant], ...]
    admin_digest: bytes | None = None  # the admin token's digest; None: admin paths are refused

    def __repr__(self) -> str:
        counts = {t.name: 0 for t in self.tenants}
        for _, tenant in self.keys:
            counts[tenant.name] += 1
        listed = ", ".join(f"{name} ({n} key{'s' * (n != 1)})" for name, n in counts.items())
        return f"KeyRing(tenants=[{listed}], admin_token={'yes' if self.admin_digest else 'no'})"


def _key_problem(key: str) -> str | None:
    """Why `key` (a key or its `sha256:` form) cannot be used, without quoting it; None if it can."""
    if key.startswith(_DIGEST_PREFIX):
        hexdigits = key.removeprefix(_DIGEST_PREFIX)
        if len(hexdigits) != 64 or any(c not in "0123456789abcdefABCDEF" for c in hexdigits):
            return ("a sha256: key must be 64 hex digits, the SHA-256 of the key "
                    "(printf %s \"$KEY\" | sha256sum)")
        return None
    if len(key) < MIN_KEY_CHARS:
        return f"too short: a key needs at least {MIN_KEY_CHARS} characters"
    # A key travels in an Authorization header: anything else could never be presented intact.
    if any(not "!" <= c <= "~" for c in key):
        return "a key may hold only visible ASCII characters (no spaces)"
    return None


def _digest(key: str) -> bytes:
    if key.startswith(_DIGEST_PREFIX):
        return bytes.fromhex(key.removeprefix(_DIGEST_PREFIX))
    return hashlib.sha256(key.encode()).digest()


def _valid_key(key: str) -> bytes:
    problem = _key_problem(key)
    if problem is not None:
        raise PydanticCustomError("key", "{problem}", {"problem": problem})
    return _digest(key)


class _Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Names go into metrics labels and logs: a short, plain label.
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    # Validated into SHA-256 digests (bytes): the key strings go no further than this model.
    keys: Annotated[list[Annotated[str, AfterValidator(_valid_key)]], Field(min_length=1)]
    priority: int = 0
    requests_per_minute: Annotated[int, Field(gt=0)] | None = None
    tokens_per_minute: Annotated[int, Field(gt=0)] | None = None


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tenants: Annotated[list[_Tenant], Field(min_length=1)]


def _error_lines(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            # The unknown name itself is not shown: a key pasted one level too high would be it.
            allowed = _KeysFile.model_fields if len(loc) == 1 else _Tenant.model_fields
            loc, msg = loc[:-1], f"unknown field (allowed: {', '.join(allowed)})"
        lines.append(f"  {'.'.join(loc) or '(top level)'}: {msg}")
    return lines


def _duplicate_lines(parsed: _KeysFile) -> list[str]:
    lines = []
    first_name: dict[str, int] = {}
    first_key: dict[bytes, str] = {}
    for i, t in enumerate(parsed.tenants):
        if t.name in first_name:
            lines.append(f"  tenants.{i}.name: {t.name!r} is already tenants.{first_name[t.name]}; "
                         "tenant names must be unique")
        first_name.setdefault(t.name, i)
        for j, digest in enumerate(t.keys):
            where = f"tenants.{i}.keys.{j}"
            if digest in first_key:
                lines.append(f"  {where}: the same key as {first_key[digest]} (a key and its sha256: form "
                             "are one key); each key names one tenant")
            first_key.setdefault(digest, where)
    return lines


def parse_keys_file(text: str, source: str) -> KeyRing:
    """The tenants and key digests of a keys file's text; `source` names the file in errors.
    The ring has no admin token: `parse_admin_token` reads that from its own file."""
    head = f"invalid keys file {source}:"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        # PyYAML's message quotes the offending line, which may hold a key: position only.
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise KeysFileError(f"{head} not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise KeysFileError(f"{head} the top level must be a mapping with a 'tenants' list")
    try:
        parsed = _KeysFile.model_validate(data)
    except ValidationError as err:  # its str() shows input values (keys): never chained
        raise KeysFileError("\n".join([head, *_error_lines(err)])) from None
    duplicates = _duplicate_lines(parsed)
    if duplicates:
        raise KeysFileError("\n".join([head, *duplicates]))
    tenants = tuple(Tenant(t.name, t.priority, t.requests_per_minute, t.tokens_per_minute)
                    for t in parsed.tenants)
    keys = tuple((digest, tenant) for t, tenant in zip(parsed.tenants, tenants) for digest in t.keys)
    return KeyRing(tenants, keys)


def parse_admin_token(text: str, source: str) -> bytes:
    """The digest of the admin token in a token file's text (surrounding whitespace ignored; the
    `sha256:` form allowed as for keys). Set it as `KeyRing.admin_digest`."""
    token = text.strip()
    problem = "the file is empty" if not token else _key_problem(token)
    if problem is not None:
        raise KeysFileError(f"invalid admin token file {source}: {problem}")
    return _digest(token)


def _presented_digest(authorization: bytes | str | None) -> bytes | None:
    """SHA-256 of the key in an `Authorization: Bearer <key>` header; None when there is none."""
    if authorization is None:
        return None
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")  # how ASGI and HTTP/1.1 carry header bytes
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return hashlib.sha256(key.encode()).digest()


def authenticate(ring: KeyRing, authorization: bytes | str | None) -> Tenant | None:
    """The tenant whose key the header presents, or None (no header, not Bearer, unknown key)."""
    presented = _presented_digest(authorization)
    if presented is None:
        return None
    found = None
    for digest, tenant in ring.keys:  # every digest, no early exit (module docstring)
        if hmac.compare_digest(digest, presented):
            found = tenant
    return found


def is_admin(ring: KeyRing, authorization: bytes | str | None) -> bool:
    """Whether the header presents the admin token. Tenant keys are not admin tokens (unless the
    same string is listed as both)."""
    presented = _presented_digest(authorization)
    if presented is None or ring.admin_digest is None:
        return False
    return hmac.compare_digest(ring.admin_digest, presented)

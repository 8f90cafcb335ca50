"""The keys file parser and key checks (access/keys.py): errors name the field and never a key."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.access.keys import (KeyRing, KeysFileError, Tenant, authenticate, is_admin, parse_admin_token,
                                  parse_keys_file)

KEY_A1 = "sk-team-a-0123456789"
KEY_A2 = "sk-team-a-second-key"
KEY_B = "sk-team-b-abcdefghij"
ADMIN = "admin-token-0123456789"

GOOD = f"""
tenants:
  - name: team-a
    keys: [{KEY_A1}, {KEY_A2}]
    priority: 2
    requests_per_minute: 600
    tokens_per_minute: 200000
  - name: team-b
    keys: [{KEY_B}]
"""


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def ring_with_admin(text: str = GOOD, token: str = ADMIN) -> KeyRing:
    return dataclasses.replace(parse_keys_file(text, "keys.yaml"), admin_digest=parse_admin_token(token, "admin"))


def test_good_file_gives_tenants_with_defaults_and_no_keys():
    ring = parse_keys_file(GOOD, "keys.yaml")
    assert ring.tenants == (Tenant("team-a", 2, 600, 200_000), Tenant("team-b", 0, None, None))
    assert [t.name for _, t in ring.keys] == ["team-a", "team-a", "team-b"]
    assert ring.admin_digest is None
    # Held as digests only: no field of the ring holds a key.
    assert all(len(d) == 32 for d, _ in ring.keys)
    for key in (KEY_A1, KEY_A2, KEY_B):
        assert key not in repr(ring) and key.encode() not in repr(dataclasses.astuple(ring)).encode()


def test_repr_is_names_and_counts_without_digests():
    ring = ring_with_admin()
    assert repr(ring) == "KeyRing(tenants=[team-a (2 keys), team-b (1 key)], admin_token=yes)"
    assert str(ring) == repr(ring)


def test_sha256_form_is_the_same_key():
    plain = parse_keys_file(GOOD, "k")
    upper_hex = "sha256:" + sha(KEY_B).removeprefix("sha256:").upper()
    hashed = parse_keys_file(GOOD.replace(KEY_A1, sha(KEY_A1)).replace(KEY_B, upper_hex), "k")
    assert plain == hashed
    assert authenticate(hashed, f"Bearer {KEY_A1}") == Tenant("team-a", 2, 600, 200_000)
    # Presenting the digest itself is presenting some other key: refused.
    assert authenticate(hashed, f"Bearer {sha(KEY_A1)}") is None


def _bad(text: str) -> str:
    with pytest.raises(KeysFileError) as err:
        parse_keys_file(text, "keys.yaml")
    message = str(err.value)
    assert message.startswith("invalid keys file keys.yaml")
    for secret in (KEY_A1, KEY_A2, KEY_B, "short-key", "has a space in it ok", "0123456789abcdef0123"):
        assert secret not in message
    return message


@pytest.mark.parametrize(("text", "words"), [
    ("tenants: []", ["tenants:", "at least 1"]),
    ("tenants: [{name: a, keys: []}]", ["tenants.0.keys:", "at least 1"]),
    ("tenants: [{name: a}]", ["tenants.0.keys:", "Field required"]),
    (f"tenants: [{{keys: [{KEY_A1}]}}]", ["tenants.0.name:", "Field required"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}]}}, {{name: b, keys: [{KEY_B}, short-key]}}]",
     ["tenants.1.keys.1:", "at least 16 characters"]),
    ('tenants: [{name: a, keys: ["has a space in it ok"]}]', ["tenants.0.keys.0:", "visible ASCII"]),
    ("tenants: [{name: a, keys: [sha256:0123456789abcdef0123]}]", ["tenants.0.keys.0:", "64 hex digits"]),
    (f"tenants: [{{name: a, keys: [sha256:{'g' * 64}]}}]", ["tenants.0.keys.0:", "64 hex digits"]),
    ("tenants: [{name: a, keys: [12345678901234567890]}]", ["tenants.0.keys.0:", "valid string"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}]}}, {{name: b, keys: [{KEY_B}, {KEY_A1}]}}]",
     ["tenants.1.keys.1:", "same key as tenants.0.keys.0"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}, {sha(KEY_A1)}]}}]", ["tenants.0.keys.1:", "same key as tenants.0.keys.0"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}]}}, {{name: a, keys: [{KEY_B}]}}]",
     ["tenants.1.name:", "'a' is already tenants.0", "unique"]),
    (f"tenants: [{{name: 'team a', keys: [{KEY_A1}]}}]", ["tenants.0.name:", "pattern"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}], requests_per_minute: 0}}]",
     ["tenants.0.requests_per_minute:", "greater than 0"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}], tokens_per_minute: -5}}]",
     ["tenants.0.tokens_per_minute:", "greater than 0"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}], priority: high}}]", ["tenants.0.priority:", "valid integer"]),
    # An unknown field is named by its place and the allowed fields, not by itself: it could be a key.
    (f"tenants: [{{name: a, keys: [{KEY_A1}], {KEY_B}: 1}}]", ["tenants.0: unknown field", "requests_per_minute"]),
    (f"tenant: [{{name: a, keys: [{KEY_A1}]}}]", ["(top level): unknown field (allowed: tenants)"]),
    ("- just a list", ["top level must be a mapping"]),
    ("", ["top level must be a mapping"]),
    (f"tenants: [{{name: a, keys: [{KEY_A1}]\n  bad: [{KEY_B}", ["not valid YAML (line"]),
])
def test_bad_file_names_the_field_and_never_a_key(text, words):
    message = _bad(text)
    for word in words:
        assert word in message, message


def test_every_problem_is_reported_at_once():
    message = _bad(f"tenants: [{{name: a, keys: [short-key]}}, {{name: b, keys: [], priority: x}}]")
    assert all(p in message for p in ("tenants.0.keys.0:", "tenants.1.keys:", "tenants.1.priority:"))


@pytest.mark.parametrize(("text", "words"), [
    ("", ["admin-token: the file is empty"]),
    ("  \n", ["the file is empty"]),
    ("short-key\n", ["at least 16"]),
    ("two words here in a token", ["visible ASCII"]),
    ("sha256:abc", ["64 hex digits"]),
])
def test_bad_admin_token(text, words):
    with pytest.raises(KeysFileError) as err:
        parse_admin_token(text, "admin-token")
    assert str(err.value).startswith("invalid admin token file admin-token:")
    for word in words:
        assert word in str(err.value)
    assert text.strip() not in str(err.value) or not text.strip()


def test_admin_token_whitespace_and_sha256_form():
    assert parse_admin_token(f"\n  {ADMIN}\n", "t") == hashlib.sha256(ADMIN.encode()).digest()
    assert parse_admin_token(sha(ADMIN), "t") == parse_admin_token(ADMIN, "t")


@pytest.mark.parametrize(("header", "tenant"), [
    (f"Bearer {KEY_A1}", "team-a"),
    (f"Bearer {KEY_A2}".encode(), "team-a"),  # ASGI header bytes
    (f"bearer {KEY_B}", "team-b"),  # the scheme is case-insensitive (RFC 7235)
    (f"  Bearer   {KEY_B} ", "team-b"),
    (f"Bearer {KEY_B}x", None),
    (f"Bearer {KEY_B[:-1]}", None),
    (KEY_B, None),  # no scheme
    (f"Basic {KEY_B}", None),
    ("Bearer ", None),
    ("Bearer", None),
    ("", None),
    (None, None),
    (f"Bearer {ADMIN}", None),  # the admin token is not a tenant key
])
def test_authenticate(header, tenant):
    found = authenticate(ring_with_admin(), header)
    assert (found.name if found else None) == tenant


def test_admin_and_tenant_credentials_are_separate():
    ring = ring_with_admin()
    assert is_admin(ring, f"Bearer {ADMIN}") and is_admin(ring, f"Bearer {ADMIN}".encode())
    assert not any(is_admin(ring, f"Bearer {k}") for k in (KEY_A1, KEY_A2, KEY_B))
    assert not is_admin(ring, None) and not is_admin(ring, f"Bearer {ADMIN}x")
    # Without an admin token nothing is admin.
    assert not is_admin(parse_keys_file(GOOD, "k"), f"Bearer {ADMIN}")
    # Listed as a tenant key too, the same string is both (the operator's choice).
    both = ring_with_admin(GOOD, KEY_B)
    assert is_admin(both, f"Bearer {KEY_B}") and authenticate(both, f"Bearer {KEY_B}").name == "team-b"


_VISIBLE = st.characters(min_codepoint=33, max_codepoint=126)


@given(st.lists(st.text(_VISIBLE, min_size=16, max_size=40).filter(lambda k: not k.startswith("sha256:")),
                min_size=1, max_size=8, unique=True), st.data())
def test_each_key_finds_its_own_tenant_only(keys, data):
    # One tenant per key, named t<i>: a key finds exactly its tenant, any other string none.
    text = yaml.safe_dump({"tenants": [{"name": f"t{i}", "keys": [k]} for i, k in enumerate(keys)]})
    ring = parse_keys_file(text, "k")
    i = data.draw(st.integers(0, len(keys) - 1))
    assert authenticate(ring, f"Bearer {keys[i]}").name == f"t{i}"
    other = data.draw(st.text(_VISIBLE, min_size=1).filter(lambda s: s not in keys))
    assert authenticate(ring, f"Bearer {other}") is None

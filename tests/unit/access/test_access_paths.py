"""Path classes (access/paths.py) and the auth decision built on them (access/authorize.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.access.authorize import Denied, Granted, authorize
from hbmserve.access.keys import parse_admin_token, parse_keys_file
from hbmserve.access.paths import PathClass, required_credential

PUBLIC, INFERENCE, ADMIN = PathClass.PUBLIC, PathClass.INFERENCE, PathClass.ADMIN


@pytest.mark.parametrize(("path", "cls"), [
    ("/health", PUBLIC),
    ("/healthz", ADMIN), ("/health/", ADMIN), ("/Health", ADMIN), ("/health/x", ADMIN),
    ("/v1/chat/completions", INFERENCE), ("/v1/completions", INFERENCE), ("/v1/embeddings", INFERENCE),
    ("/v1/models", INFERENCE), ("/v1/models/llama-70b", INFERENCE), ("/v1/models/org/name", INFERENCE),
    ("/v1/responses", INFERENCE), ("/v1/audio/transcriptions", INFERENCE), ("/v1/score", INFERENCE),
    ("/v1/models/", INFERENCE),
    ("/tokenize", INFERENCE), ("/detokenize", INFERENCE), ("/invocations", INFERENCE), ("/pooling", INFERENCE),
    ("/classify", INFERENCE), ("/score", INFERENCE), ("/rerank", INFERENCE), ("/v2/rerank", INFERENCE),
    ("/metrics", ADMIN), ("/version", ADMIN), ("/docs", ADMIN), ("/openapi.json", ADMIN), ("/redoc", ADMIN),
    ("/hbm/status", ADMIN), ("/hbm/", ADMIN), ("/ping", ADMIN), ("/sleep", ADMIN), ("/wake_up", ADMIN),
    ("/reset_prefix_cache", ADMIN), ("/collective_rpc", ADMIN), ("/server_info", ADMIN),
    ("/v1/load_lora_adapter", ADMIN), ("/v1/unload_lora_adapter", ADMIN), ("/v1/load_lora_adapter/", ADMIN),
    ("/", ADMIN), ("", ADMIN), ("/v1", ADMIN), ("/V1/models", ADMIN), ("/tokenize/x", ADMIN),
    # Not canonical: whatever a normaliser behind the check would make of them, they need admin.
    ("/v1/../metrics", ADMIN), ("/v1/./models", ADMIN), ("/v1//models", ADMIN), ("//v1/models", ADMIN),
    ("/v1/models/..", ADMIN), ("/v1\\models", ADMIN), ("/v1/models\x00", ADMIN), ("v1/models", ADMIN),
    ("/./health", ADMIN), ("/health/.", ADMIN),
    # The dashboard's page and static files hold no data; its data needs the admin token.
    ("/hbm/dashboard", PUBLIC), ("/hbm/dashboard/app.js", PUBLIC), ("/hbm/dashboard/app.css", PUBLIC),
    ("/hbm/dashboard/data", ADMIN), ("/hbm/dashboard/", ADMIN), ("/hbm/dashboard/other.js", ADMIN),
    ("/hbm/dashboard/../dashboard/data", ADMIN),
])
def test_path_table(path, cls):
    assert required_credential(path) is cls


@given(st.text(max_size=40))
def test_only_health_and_the_dashboard_page_are_public_and_unknown_is_admin(path):
    cls = required_credential(path)
    assert (cls is PUBLIC) == (path in {"/health", "/hbm/dashboard", "/hbm/dashboard/app.js",
                                        "/hbm/dashboard/app.css"})
    if not path.startswith("/v1/") and path not in {"/tokenize", "/detokenize", "/pooling", "/classify",
                                                     "/score", "/rerank", "/v2/rerank", "/invocations"}:
        assert cls is not INFERENCE


TENANT_KEY = "sk-tenant-0123456789"
ADMIN_TOKEN = "admin-token-0123456789"
KEYS = f"tenants: [{{name: t, keys: [{TENANT_KEY}]}}]"
RING = dataclasses.replace(parse_keys_file(KEYS, "k"), admin_digest=parse_admin_token(ADMIN_TOKEN, "a"))


@pytest.mark.parametrize(("path", "key", "expected"), [
    ("/health", None, (PUBLIC, None)),
    ("/health", "garbage-garbage-garbage", (PUBLIC, None)),
    ("/v1/chat/completions", TENANT_KEY, (INFERENCE, "t")),
    ("/v1/chat/completions", None, (401, "invalid_api_key")),
    ("/v1/chat/completions", ADMIN_TOKEN, (401, "invalid_api_key")),
    ("/metrics", ADMIN_TOKEN, (ADMIN, None)),
    ("/metrics", TENANT_KEY, (403, "admin_token_required")),
    ("/metrics", None, (401, "invalid_admin_token")),
    ("/whatever", "sk-unknown-0123456789", (401, "invalid_admin_token")),
])
def test_authorize(path, key, expected):
    d = authorize(RING, path, None if key is None else f"Bearer {key}")
    if isinstance(d, Granted):
        assert (d.path_class, d.tenant and d.tenant.name) == expected
    else:
        assert isinstance(d, Denied) and (d.status, d.code) == expected
        assert d.err_type == ("permission_error" if d.status == 403 else "authentication_error")
        assert TENANT_KEY not in d.reason and ADMIN_TOKEN not in d.reason


def test_without_admin_token_admin_paths_are_refused_and_say_why():
    d = authorize(parse_keys_file(KEYS, "k"), "/metrics", f"Bearer {ADMIN_TOKEN}")
    assert isinstance(d, Denied) and d.status == 401 and "serve.auth.admin_token_file" in d.reason


def test_auth_off_grants_everything():
    for path in ("/health", "/v1/models", "/metrics", "/v1/../x"):
        d = authorize(None, path, None)
        assert isinstance(d, Granted) and d.tenant is None and d.path_class is required_credential(path)

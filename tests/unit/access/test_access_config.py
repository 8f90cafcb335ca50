"""`serve.auth` in the cluster config (core/config.py), and the migration from `api_key_env`."""

from __future__ import annotations

from pathlib import Path

import pytest

from hbmserve.core.config import ConfigError, load_cluster_spec, parse_cluster_spec

MODELS = [{"name": "m", "source": "hub/model"}]


def test_auth_block_parses_and_is_off_by_default():
    assert parse_cluster_spec({"models": MODELS}).serve.auth is None
    auth = parse_cluster_spec({"serve": {"auth": {"keys_file": "/s/keys.yaml", "admin_token_file": "/s/admin"}},
                               "models": MODELS}).serve.auth
    assert auth is not None and (auth.keys_file, auth.admin_token_file) == ("/s/keys.yaml", "/s/admin")
    only_keys = parse_cluster_spec({"serve": {"auth": {"keys_file": "/s/keys.yaml"}}, "models": MODELS})
    assert only_keys.serve.auth is not None and only_keys.serve.auth.admin_token_file is None


@pytest.mark.parametrize(("auth", "line"), [
    ({}, "serve.auth.keys_file: Field required"),
    ({"keys_file": ""}, "serve.auth.keys_file: String should have at least 1 character"),
    ({"keys_file": "k", "admin_token_file": ""}, "serve.auth.admin_token_file:"),
    ({"keys_file": "k", "keys": ["sk-inline"]}, "serve.auth.keys: unknown field"),
])
def test_bad_auth_block_names_the_field(auth, line):
    with pytest.raises(ConfigError) as err:
        parse_cluster_spec({"serve": {"auth": auth}, "models": MODELS}, "c.yaml")
    assert line in str(err.value)


def test_api_key_env_is_refused_with_the_way_forward():
    with pytest.raises(ConfigError) as err:
        parse_cluster_spec({"serve": {"api_key_env": "HBMSERVE_API_KEYS"}, "models": MODELS}, "c.yaml")
    message = str(err.value)
    assert message.startswith("invalid config c.yaml:\n  serve: api_key_env was removed")
    assert "serve.auth.keys_file" in message and "Value error" not in message


def test_auth_files_resolve_against_the_config_folder_and_need_not_exist_yet(tmp_path: Path):
    cfg = tmp_path / "sub" / "c.yaml"
    cfg.parent.mkdir()
    cfg.write_text("serve: {auth: {keys_file: secrets/keys.yaml, admin_token_file: ~/admin}}\n"
                   "models: [{name: m, source: hub/model}]\n")
    auth = load_cluster_spec(cfg).serve.auth
    assert auth is not None
    assert auth.keys_file == str((tmp_path / "sub" / "secrets" / "keys.yaml").resolve())
    assert auth.admin_token_file == str(Path("~/admin").expanduser())

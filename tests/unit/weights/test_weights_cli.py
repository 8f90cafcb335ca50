"""`hbmserve cache ls|prefetch|evict|manifest` on a real cache directory; the JSON shapes are the
contract scripts read, so they are pinned here."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from hbmserve.cli.weights_cache import register
from hbmserve.weights.manifest import MANIFEST_NAME, manifest_of_dir


def cli(*args: str):
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # typer flattens a lone sub-app; a second command keeps `cache`
    return CliRunner().invoke(app, ["cache", *args])


def test_prefetch_ls_evict_round_trip(tmp_path, kit) -> None:
    files = kit.model_files()
    src, root = kit.write_dir(tmp_path / "src", files), str(tmp_path / "c")
    r = cli("prefetch", str(src), "--root", root, "--json", "--pin")
    assert r.exit_code == 0, r.output
    [got] = json.loads(r.stdout)
    total = sum(map(len, files.values()))
    assert (got["hit"], got["bytes_fetched"], got["key"]) == (False, total, manifest_of_dir(src).key)
    assert json.loads(cli("prefetch", str(src), "--root", root, "--json").stdout)[0]["hit"] is True

    listing = json.loads(cli("ls", "--root", root, "--json").stdout)
    [entry] = listing["entries"]
    assert {k: entry[k] for k in ("key", "source", "size_bytes", "files", "in_use", "pinned")} == \
        {"key": got["key"], "source": str(src), "size_bytes": total, "files": 3, "in_use": False, "pinned": True}

    r = cli("evict", "--all", "--root", root, "--json")  # pinned: --all leaves it
    assert json.loads(r.stdout) == {"evicted": []}
    r = cli("evict", got["key"][:8], "--root", root)
    assert r.exit_code == 1 and "pinned" in r.output
    r = cli("evict", str(src), "--root", root, "--force", "--json")  # by source, as configs name it
    assert json.loads(r.stdout)["evicted"][0]["key"] == got["key"]
    assert json.loads(cli("ls", "--root", root, "--json").stdout)["entries"] == []


def test_prefetch_by_model_name_from_the_config(tmp_path, kit) -> None:
    src = kit.write_dir(tmp_path / "src", kit.model_files())
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(f"cache: {{root: {tmp_path / 'c'}, max_gib: 1}}\nmodels:\n  - {{name: tiny, source: {src}}}\n")
    r = cli("prefetch", "--config", str(cfg), "--json")  # no names: every model in the config
    assert r.exit_code == 0, r.output
    assert [(g["model"], g["source"]) for g in json.loads(r.stdout)] == [("tiny", str(src))]
    assert (tmp_path / "c" / "entries").is_dir()


def test_errors_name_the_cause_and_exit_non_zero(tmp_path) -> None:
    r = cli("prefetch", str(tmp_path / "missing"), "--root", str(tmp_path / "c"))
    assert r.exit_code == 1 and "no model directory at" in r.output
    r = cli("evict", "nope", "--root", str(tmp_path / "c"))
    assert r.exit_code == 2 and "no cache entry matches 'nope'" in r.output
    r = cli("evict", "--root", str(tmp_path / "c"))
    assert r.exit_code == 2


def test_manifest_writes_what_the_http_source_reads(tmp_path, kit) -> None:
    src = kit.write_dir(tmp_path / "src", kit.model_files())
    r = cli("manifest", str(src))
    assert r.exit_code == 0, r.output
    assert (src / MANIFEST_NAME).read_text() == manifest_of_dir(src).to_json()

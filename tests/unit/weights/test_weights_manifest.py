"""Manifests: the content address, digests (sha256 and git's blob sha1), and what a hostile or
broken manifest is refused for."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from hbmserve.weights.errors import ManifestError
from hbmserve.weights.manifest import FORMAT, FileEntry, hash_file, make_manifest, manifest_of_dir, parse_manifest

SHA = "sha256:" + "0" * 64


def test_key_is_content_addressed(tmp_path, kit) -> None:
    files = kit.model_files()
    m1 = manifest_of_dir(kit.write_dir(tmp_path / "a", files))
    m2 = manifest_of_dir(kit.write_dir(tmp_path / "b", files))
    assert m1.key == m2.key  # same bytes wherever they live
    changed = manifest_of_dir(kit.write_dir(tmp_path / "c", {**files, "config.json": b"{}"}))
    assert changed.key != m1.key
    assert parse_manifest(m1.to_json(), "roundtrip") == m1


def test_manifest_of_dir_hashes_each_file(tmp_path, kit) -> None:
    files = kit.model_files()
    m = manifest_of_dir(kit.write_dir(tmp_path, files))
    assert [f.path for f in m.files] == sorted(files)
    for f in m.files:
        assert f.digest == "sha256:" + hashlib.sha256(files[f.path]).hexdigest()
        assert f.size == len(files[f.path])


def test_git_sha1_matches_git(tmp_path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"hello hub\n")
    git = subprocess.run(["git", "hash-object", str(p)], capture_output=True, text=True, check=True).stdout.strip()
    assert hash_file(p, FileEntry("f", 10, "git-sha1:")) == f"git-sha1:{git}"


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs", "a/../../b", "a\\b", "a//b", ""])
def test_paths_that_escape_the_entry_are_refused(path: str) -> None:
    doc = {"format": FORMAT, "files": [{"path": path, "size": 1, "sha256": "0" * 64}]}
    with pytest.raises(ManifestError, match="files.0.path"):
        parse_manifest(json.dumps(doc), "test")


@pytest.mark.parametrize("raw, needle", [
    ("not json", "not JSON"),
    (json.dumps({"files": []}), FORMAT),
    (json.dumps({"format": FORMAT, "files": [{"path": "a", "size": -1, "sha256": "0" * 64}]}), "size"),
    (json.dumps({"format": FORMAT, "files": [{"path": "a", "size": 1}]}), "exactly one digest"),
    (json.dumps({"format": FORMAT, "files": [{"path": "a", "size": 1, "sha256": "xyz"}]}), "hex digest"),
    (json.dumps({"format": FORMAT, "files": []}), "at least one file"),
])
def test_bad_manifests_say_why(raw: str, needle: str) -> None:
    with pytest.raises(ManifestError, match=needle):
        parse_manifest(raw, "http://x/m")


def test_duplicate_paths_are_refused() -> None:
    with pytest.raises(ManifestError, match="twice: a"):
        make_manifest([FileEntry("a", 1, SHA), FileEntry("a", 2, SHA)])

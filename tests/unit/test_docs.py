"""docs/architecture.md cannot drift from the code: every `path.py` `name` it cites exists, every
path it names is a file, every package folder has its place in it, and no two modules share a
file name (a name in the tree means one thing)."""

from __future__ import annotations

import importlib
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.unit.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
# `folder/module.py` followed by `Name`, `Name.attr` or `name(args)`.
CITED = re.compile(r"`((?:\w+/)+\w+\.py)`\s+`(\w+(?:\.\w+)*)")
PATH = re.compile(r"`((?:\w+/)+\w+\.py)`")


def citations(text: str) -> list[tuple[str, str]]:
    return CITED.findall(text)


def missing(path: str, name: str, root: Path = ROOT) -> str | None:
    """Why `name` is not found in module `path` (None: it is there)."""
    if not (root / path).is_file():
        return f"{path}: no such file"
    if path.startswith("tests/"):
        return None
    module = importlib.import_module("hbmserve." + path.removesuffix(".py").replace("/", "."))
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            return f"{path}: no {name}"
        obj = getattr(obj, part)
    return None


def test_the_architecture_cites_only_what_exists():
    text = DOC.read_text()
    found = citations(text)
    assert len(found) > 40, "the walk-throughs cite the code they describe"
    assert [m for p, n in found if (m := missing(p, n))] == []


def test_every_path_the_docs_name_is_a_file():
    for doc in (DOC, ROOT / "README.md"):
        assert [p for p in PATH.findall(doc.read_text()) if not (ROOT / p).is_file()] == [], doc.name


def test_every_package_folder_has_its_place():
    text = DOC.read_text()
    assert [f for f in LAYERS if f"`{f}/`" not in text and f"{f}/ " not in text] == []


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for f in LAYERS for p in (ROOT / f).rglob("*.py") if p.name != "__init__.py")
    assert [n for n, k in names.items() if k > 1] == []


@pytest.mark.parametrize("cite, broken", [
    ("`wire/records_store.py` `held_at_ingress`", True),  # the name docs once cited for ingress_demand
    ("`wire/records_store.py` `ingress_demand`", False),
    ("`routing/queue.py` `admit(ask, capacity, waiting, now)`", False),
    ("`deployments/serve_app.py` `EngineReplica`", True),  # a file that moved
    ("`ingress/replica_table.py` `ReplicaTable.update`", False),
    ("`ingress/replica_table.py` `ReplicaTable.gone`", True),
])
def test_the_check_catches_a_stale_citation(cite, broken):
    ((path, name),) = citations(cite)
    assert (missing(path, name) is not None) is broken

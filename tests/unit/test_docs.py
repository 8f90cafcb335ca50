"""docs/architecture.md cannot drift from the code: every `path.py` `name` it cites exists, every
path it names is a file, every package folder has its place in it, and no two modules share a
file name (a name in the tree means one thing)."""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.unit.test_layers import LAYERS, package_files

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


# Any file a doc names in backticks; `out/...` is what a benchmark writes, not a file of the tree.
NAMED_FILE = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|json|png|txt|tpl))`")


def test_every_path_the_docs_name_is_a_file():
    for doc in (DOC, ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "helm" / "README.md"):
        named = [p for p in NAMED_FILE.findall(doc.read_text()) if not p.startswith("out/")]
        assert len(named) > 2, doc.name
        # Relative to the root, or to the doc's own folder (helm/README.md names hbmserve/...).
        assert [p for p in named if not (ROOT / p).is_file() and not (doc.parent / p).is_file()] == [], doc.name


def test_every_package_folder_has_its_place():
    text = DOC.read_text()
    assert [f for f in LAYERS if f"`{f}/`" not in text and f"{f}/ " not in text] == []


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in package_files(ROOT) if p.name != "__init__.py")
    assert [n for n, k in names.items() if k > 1] == []


@pytest.mark.parametrize("cite, broken", [
    ("`deployments/wire/records_store.py` `held_at_ingress`", True),  # the name docs once cited for ingress_demand
    ("`deployments/wire/records_store.py` `ingress_demand`", False),
    ("`routing/queue.py` `admit(ask, capacity, waiting, now)`", False),
    ("`deployments/serve_app.py` `EngineReplica`", True),  # a file that moved
    ("`deployments/ingress/replica_table.py` `ReplicaTable.update`", False),
    ("`deployments/ingress/replica_table.py` `ReplicaTable.gone`", True),
])
def test_the_check_catches_a_stale_citation(cite, broken):
    ((path, name),) = citations(cite)
    assert (missing(path, name) is not None) is broken


# `python -m hbmserve.x.y` in a doc; `hbmserve.x.y:attr` (a Serve import path) in a doc or the chart.
MODULE_RUN = re.compile(r"python -m (hbmserve(?:\.\w+)+)")
IMPORT_PATH = re.compile(r"\b(hbmserve(?:\.\w+)+):(\w+)")
ENTRY_DOCS = ["README.md", "docs/benchmarks.md", "docs/architecture.md", "helm/README.md"]


def entry_points(root: Path = ROOT) -> tuple[set[str], set[tuple[str, str]]]:
    texts = [(root / d).read_text() for d in ENTRY_DOCS]
    texts += [p.read_text() for p in (root / "helm").rglob("*") if p.suffix in {".tpl", ".yaml", ".json"}]
    return ({m for t in texts for m in MODULE_RUN.findall(t)},
            {m for t in texts for m in IMPORT_PATH.findall(t)})


def unresolved(runs: set[str], paths: set[tuple[str, str]]) -> list[str]:
    def found(module: str, attr: str | None = None) -> bool:
        try:
            return importlib.util.find_spec(module) is not None and (
                attr is None or hasattr(importlib.import_module(module), attr))
        except ModuleNotFoundError:  # a parent package that is not there
            return False
    return [m for m in sorted(runs) if not found(m)] + [f"{m}:{a}" for m, a in sorted(paths) if not found(m, a)]


def test_every_entry_point_the_docs_and_chart_name_resolves():
    """What users type (`python -m ...`) and what Serve imports (the chart's `import_path`s)."""
    runs, paths = entry_points()
    assert len(runs) >= 10 and ("hbmserve.deployments.apps.declarative", "model_app") in paths
    assert unresolved(runs, paths) == []


def test_the_entry_point_check_catches_an_old_path(tmp_path):
    for d in ENTRY_DOCS:
        (tmp_path / d).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / d).write_text("python -m hbmserve.ingress.front_door\n" if d == "README.md" else "")
    (tmp_path / "helm" / "x.tpl").write_text('"import_path" "hbmserve.apps.declarative:model_app"')
    assert unresolved(*entry_points(tmp_path)) == ["hbmserve.ingress.front_door", "hbmserve.apps.declarative:model_app"]

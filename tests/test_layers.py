"""The house's rules, executable: imports go only down the pipeline's stages, no module reaches into
another's private names, no import cycle, SQL and ``sqlite3`` only in store/.  Read from the source with ``ast``, so a
change that breaks a rule fails here, naming the file and the line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "relocverify"

#: The stages, lowest first: a module may import from its own stage or any stage below it.  A top-level
#: module (``errors.py``) is its own stage, named by its file.
STAGES = [
    ("errors", "text", "environment", "outputs", "collector", "extensions", "processes"),  # the shared base: no project imports but each other
    ("x86",),  # the decoder-neutral instruction
    ("inputs", "versions", "__init__"),  # values a user types; the tools' versions
    ("image", "plan"),  # image -> functions; instruction -> plan
    ("concrete",),  # concrete execution: unicorn, the native CPU, the effect interpreter
    ("proof",),  # plan -> proof
    ("kernel", "corpus"),  # kernel sites and patch ranges (read proofs); the corpora runner
    ("store", "selftest", "gate"),  # results on disk; the false-proof generator; the decoder gate
    ("schedule",),  # pools of workers, the SMT helper, progress: runs tasks, knows no verdicts
    ("engine", "report"),  # batch orchestration; the HTML report (reads the store)
    ("runtime", "tracers", "confirm"),  # probes placed for proved plans; tracer models audited; audits confirmed on a booted kernel
    ("cli",),  # parse, call, render
    ("__main__",),
]
RANK = {name: rank for rank, names in enumerate(STAGES) for name in names}

SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA|WITH)\b", re.I)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        yield rel, ast.parse(path.read_text(), str(path))


def _stage(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(rel: Path, tree: ast.Module):
    """(line, target module path parts under relocverify, imported names) of every project import."""
    here = list(rel.with_suffix("").parts)
    if here[-1] == "__init__":
        here = here[:-1] + ["__init__"]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = here[:len(here) - node.level]
            target = base + (node.module.split(".") if node.module else [])
            yield node.lineno, target, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("relocverify"):
            yield node.lineno, node.module.split(".")[1:], [a.name for a in node.names]


def test_every_module_has_a_stage():
    unknown = sorted({_stage(rel) for rel, _ in _modules()} - set(RANK))
    assert not unknown, f"add these to STAGES (where they sit in the pipeline): {unknown}"


def test_imports_go_only_down_the_stages():
    wrong = []
    for rel, tree in _modules():
        mine = RANK[_stage(rel)]
        for line, target, _ in _imports(rel, tree):
            theirs = RANK.get(target[0] if target else "__init__", RANK["__init__"])
            if theirs > mine:
                wrong.append(f"relocverify/{rel}:{line} imports {'.'.join(target)} (a later stage)")
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    wrong = []
    for rel, tree in _modules():
        for line, target, names in _imports(rel, tree):
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    wrong.append(f"relocverify/{rel}:{line} imports {name} from {'.'.join(target)}")
    assert not wrong, "make these public (named, documented) or move the code:\n" + "\n".join(wrong)


def _module_names(rel: Path, tree: ast.Module) -> dict[str, str]:
    """Local name -> the project module it is bound to by an import in ``tree`` (``from . import semantics as
    S``, ``from ..tracers import uprobes_6_1 as up``, ``import relocverify.x86.registers as regs``)."""
    files = {".".join(r.with_suffix("").parts) for r in (p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py"))}
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for _, target, _ in _imports(rel, ast.Module([node], [])):
                for a in node.names:
                    dotted = ".".join(target + [a.name])
                    if dotted in files or dotted + ".__init__" in files:
                        out[a.asname or a.name] = dotted
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("relocverify.") and a.asname:
                    out[a.asname] = a.name.split(".", 1)[1]
    return out


def private_reaches(rel: Path, tree: ast.Module) -> list[str]:
    """Where a module reads another project module's private name as an attribute (``S._Path``)."""
    modules = _module_names(rel, tree)
    return sorted(f"relocverify/{rel}:{node.lineno} reaches {modules[node.value.id]}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
            and node.attr.startswith("_") and not node.attr.startswith("__"))


def test_no_private_name_is_reached_as_an_attribute_of_another_module():
    wrong = [w for rel, tree in _modules() for w in private_reaches(rel, tree)]
    assert not wrong, "make these public (named, documented) or move the code:\n" + "\n".join(wrong)


def test_no_import_cycle_between_modules():
    graph: dict[str, set[str]] = {}
    names = {".".join(rel.with_suffix("").parts) for rel, _ in _modules()}
    for rel, tree in _modules():
        me = ".".join(rel.with_suffix("").parts)
        for _, target, imported in _imports(rel, tree):
            submodules = [".".join(target + [n]) for n in imported if ".".join(target + [n]) in names]
            # `from . import check` imports the module check; `from .x import name` imports x (or x/__init__)
            for option in submodules or [".".join(target), ".".join(target + ["__init__"])]:
                if option in names and option != me:
                    graph.setdefault(me, set()).add(option)
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle.extend(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, path + [nxt]):
                return True
        state[node] = 2
        return False

    for node in sorted(graph):
        if state.get(node) is None and visit(node, [node]):
            break
    assert not cycle, " -> ".join(cycle)


def test_sql_lives_only_in_store():
    wrong = []
    for rel, tree in _modules():
        if rel.parts[0] == "store":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.match(node.value) \
                    and (" FROM " in node.value.upper() or " TABLE " in node.value.upper()
                         or node.value.upper().lstrip().startswith(("INSERT", "PRAGMA"))):
                wrong.append(f"relocverify/{rel}:{node.lineno}: {node.value.strip()[:60]}")
    assert not wrong, "SQL belongs in relocverify/store/:\n" + "\n".join(wrong)


def sqlite_imports(rel: Path, tree) -> list[str]:
    """Where a module outside store/ imports ``sqlite3``."""
    if rel.parts[0] == "store":
        return []
    return [f"relocverify/{rel}:{node.lineno}" for node in ast.walk(tree)
            if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sqlite3" for a in node.names))
            or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlite3" and not node.level)]


def test_sqlite3_is_imported_only_in_store():
    wrong = [w for rel, tree in _modules() for w in sqlite_imports(rel, tree)]
    assert not wrong, "sqlite3 belongs in relocverify/store/ (its errors: store.sqlite_errors):\n" + "\n".join(wrong)


def test_the_rules_can_fail(tmp_path):
    """The checks above see what they are meant to: a private import, an upward import and SQL."""
    tree = ast.parse("from ..cli.main import _Parser\nQ = 'SELECT id FROM runs'\n")
    rel = Path("proof") / "bad.py"
    found = list(_imports(rel, tree))
    assert found == [(1, ["cli", "main"], ["_Parser"])]
    assert RANK["cli"] > RANK["proof"]
    assert any(isinstance(n, ast.Constant) and SQL.match(str(n.value)) for n in ast.walk(tree))
    assert sqlite_imports(rel, ast.parse("import sqlite3\n")) == ["relocverify/proof/bad.py:1"]
    assert sqlite_imports(Path("store") / "x.py", ast.parse("import sqlite3\n")) == []
    reach = ast.parse("from . import semantics as S\nfrom ..x86 import registers\nS._Path(1)\nregisters._x\nS.Path\n")
    assert private_reaches(rel, reach) == ["relocverify/proof/bad.py:3 reaches proof.semantics._Path",
                                           "relocverify/proof/bad.py:4 reaches x86.registers._x"]


def test_readme_names_every_module_in_its_stage_row():
    """README's stage table is the newcomer's map: every module of a subpackage is named in its row."""
    readme = (PACKAGE.parent / "README.md").read_text()
    start = readme.index("| stage | subpackage | produces |")
    table = readme[start:readme.index("\n\n", start)]
    rows = {}
    for line in table.splitlines()[2:]:
        cell = line.split("|")[2]
        package = re.search(r"`(\w+)/`", cell)
        rows[package.group(1) if package else "(top)"] = set(re.findall(r"`([\w.]+?)/?`", cell))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.stem in ("__init__", "__main__"):
            continue
        row = rows.get(rel.parts[0] if len(rel.parts) > 1 else "(top)", set())
        if path.stem not in row:
            missing.append(str(rel))
    assert not missing, f"README's stage table does not name: {missing}"

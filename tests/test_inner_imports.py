"""Issue 45's rule for imports inside functions, executable: an import sits at the top of its module unless it
has a reason to wait until a function runs, and the reasons are the KINDS below (docs/imports.md).  Read from
the source with ``ast``.  What a module brings is the closure of its module-level imports (a function's imports
run only when it does; ``if TYPE_CHECKING:`` never), checked against a fresh interpreter below.  An import
inside a function that brings no library of HEAVY or CODECS its module lacks, and adds nothing to every
command's start, saves nothing: it goes to the top.  ``python tests/test_inner_imports.py`` prints every import
inside a function with its kind.

"cycle-break" is no kind: tests/test_layers.py's cycle check (and ``../shared/tools/imports.py``) count the
imports inside functions as edges too, so moving one to the top makes no cycle they do not already see."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Why an import may wait until its function runs, one row per kind.
KINDS = {
    "cli-subcommand": "relocverify/cli/ loads a command's machinery only when that command runs: every command "
                      "starts by building the whole parser, 43 relocverify modules, 0.09 s and 33 MB for "
                      "`relocverify --help`; with cli/'s imports at the top, 226 modules, 1.0 s and 145 MB",
    "heavy-library": "a library of HEAVY that the module does not already bring, loaded where it is used: a run's "
                     "parent and the light commands do not pay for it (tests/test_light_imports.py)",
    "heavy-module": "a relocverify module that brings a library of HEAVY or CODECS its importer does not: the same "
                    "reason, one step removed",
    "command-start": "the module is loaded at every command's start (``started``: building the parser imports "
                     "each command's module) and the import would add modules to that start: report.shown's "
                     "and report.probe_points' seven at their tops made `relocverify --help` 0.14 s, not 0.09",
    "codec": "a decompressor of CODECS, loaded when a file in its format is met (most inputs need none)",
}

#: Libraries worth loading only where they are used: what one costs to import alone in a fresh interpreter
#: (time, peak RSS added; 2026-11-28, this machine's two cores), and what relocverify uses it for.
HEAVY = {
    "angr": "0.93 s, 109 MB: the symbolic machine of proof.smt",
    "cle": "0.20 s, 48 MB (comes with angr)",
    "archinfo": "95 ms, 33 MB (comes with pyvex's users): the architecture VEX lifts for",
    "pyvex": "54 ms, 16 MB: libVEX, the lifter",
    "claripy": "44 ms, 18 MB with z3: the solver's front end",
    "z3": "the solver (comes with claripy)",
    "networkx": "comes with angr",
    "capstone": "27 ms, 11 MB: the decoder",
    "unicorn": "20 ms, 9 MB: concrete runs and replays",
    "iced_x86": "7 ms, 3 MB: the cross-checking decoder and the encoder",
    "elftools": "23 ms, 5 MB: ELF files",
    "debian": "22 ms, 5 MB: .deb packages (`relocverify package`)",
    "rich": "26 ms, 5 MB: the progress bar on a terminal",
    "dask": "comes with distributed",
    "distributed": "0.19 s, 36 MB: a Dask cluster, for --scheduler only",
    "multiprocessing": "9 ms, 3 MB, 43 modules with multiprocessing.connection: worker processes (processes.fork_map, "
                       "the local pool, the SMT helper)",
}
#: Decompressors of one format each.
CODECS = {
    "zstandard": "3 ms, 1 MB: .zst packages and modules, zstd bzImages",
    "lz4": "1 ms: lz4 bzImages",
}
#: What a library brings with it (a fresh interpreter's sys.modules, among HEAVY and CODECS; checked below).
COMES_WITH = {
    "angr": ("archinfo", "capstone", "claripy", "cle", "elftools", "multiprocessing", "networkx", "pyvex", "rich",
             "unicorn", "z3"),
    "cle": ("archinfo", "capstone", "elftools", "pyvex", "unicorn"),
    "archinfo": ("capstone", "pyvex", "unicorn"),
    "claripy": ("z3",),
    "distributed": ("dask", "lz4", "multiprocessing", "zstandard"),
}

#: Files whose imports inside functions fit no kind, each with how many and why they are still there.  The
#: test fails when a file has more, and when it has fewer (then lower the count, or take the file out).
ALLOWED: dict[str, tuple[int, str]] = {}


class InnerImport(NamedTuple):
    """One import inside a function: one per name of ``import a, b``, one per ``from ... import``."""
    path: str  # relocverify/engine/run.py
    line: int
    function: str  # Class.method, outer.inner
    modules: tuple[str, ...]  # what it loads, absolute: ('relocverify.x86.decode',), ('pyvex.native',)


def module_name(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def _loads(path: str, node: ast.Import | ast.ImportFrom, modules: set[str]) -> list[tuple[str, ...]]:
    """The modules a statement (each name of ``import a, b``) loads: ``from .x import y`` loads x, and x.y
    too when that is a module."""
    if isinstance(node, ast.Import):
        return [(a.name,) for a in node.names]
    source = node.module
    if node.level:
        base = module_name(path).split(".")
        base = base[:len(base) - node.level + path.endswith("/__init__.py")]
        source = ".".join(base + ([node.module] if node.module else []))
    return [(source,) + tuple(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules)]


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"


class Package:
    """relocverify as the scanner reads it: each module's module-level imports (``top``), and every import
    inside a function (``inner``).  ``sources``: relocverify/x.py -> its text."""

    def __init__(self, sources: dict[str, str]):
        self.modules = {module_name(p) for p in sources}
        self.top: dict[str, set[str]] = {m: set() for m in self.modules}
        self.inner: list[InnerImport] = []
        self._closures: dict[str, frozenset[str]] = {}
        for path, text in sorted(sources.items()):
            self._walk(path, ast.parse(text, path).body, "")

    def _walk(self, path: str, body: list[ast.stmt], function: str) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for loaded in _loads(path, node, self.modules):
                    if function:
                        self.inner.append(InnerImport(path, node.lineno, function, loaded))
                    else:
                        self.top[module_name(path)].update(loaded)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._walk(path, node.body, f"{function}.{node.name}" if function else node.name)
            elif isinstance(node, ast.ClassDef):  # a class body runs when its scope does; its methods do not
                self._walk_class(path, node, f"{function}.{node.name}" if function else node.name, function)
            elif _type_checking(node) and not function:  # never runs
                self._walk(path, node.orelse, function)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    for child in getattr(node, field, ()):
                        self._walk(path, getattr(child, "body", None) if not isinstance(child, ast.stmt)
                                   else [child], function)

    def _walk_class(self, path: str, node: ast.ClassDef, name: str, function: str) -> None:
        for child in node.body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._walk(path, child.body, f"{name}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                self._walk_class(path, child, f"{name}.{child.name}", function)
            else:
                self._walk(path, [child], function)

    def closure(self, module: str) -> frozenset[str]:
        """What importing ``module`` loads: its packages' ``__init__`` and its own module-level imports,
        followed through relocverify's modules (named in full), and the libraries they import (top-level
        names)."""
        if module not in self._closures:
            seen: set[str] = set()
            todo = [module]
            while todo:
                parts = todo.pop().split(".")
                if parts[0] != "relocverify":
                    seen.add(parts[0])
                    continue
                for n in range(1, len(parts) + 1):
                    here = ".".join(parts[:n])
                    if here in self.top and here not in seen:
                        seen.add(here)
                        todo.extend(self.top[here])
            self._closures[module] = frozenset(seen)
        return self._closures[module]

    def brings(self, module: str) -> frozenset[str]:
        """The libraries importing ``module`` loads (top-level names), with what HEAVY's libraries bring."""
        found = {m for m in self.closure(module) if not m.startswith("relocverify")}
        return frozenset(found.union(*(COMES_WITH.get(lib, ()) for lib in found)))


def heavy(libraries: frozenset[str]) -> frozenset[str]:
    return frozenset(libraries & (HEAVY.keys() | CODECS.keys()))


def kind_of(package: Package, imp: InnerImport, started: frozenset[str]) -> str | None:
    """The kind of an import inside a function, or None: it has no reason to wait.  ``started``: the modules
    every command's start loads (``started()``)."""
    here = module_name(imp.path)
    mine = package.brings(here)
    library = imp.modules[0].split(".")[0]
    loads = frozenset().union(*(package.closure(m) for m in imp.modules))
    adds_to_start = here in started and any(
        m not in started if m.startswith("relocverify") else m not in {s.split(".")[0] for s in started}
        for m in loads)
    if library == "relocverify" and imp.path.startswith("relocverify/cli/"):
        return "cli-subcommand"
    if library == "relocverify" and heavy(frozenset().union(*(package.brings(m) for m in imp.modules))) - mine:
        return "heavy-module"
    if library != "relocverify" and library not in mine and library in HEAVY:
        return "heavy-library"
    if library != "relocverify" and library not in mine and library in CODECS:
        return "codec"
    if library not in mine and adds_to_start:
        return "command-start"
    return None


def violations(classified_imports, allowed: dict[str, tuple[int, str]]) -> tuple[list[str], dict[str, tuple]]:
    """(imports of no kind beyond what ``allowed`` lets a file keep, {file: (found, allowed)} for a file that
    keeps fewer than it is allowed)."""
    found: dict[str, list[InnerImport]] = {}
    for imp, kind in classified_imports:
        if kind is None:
            found.setdefault(imp.path, []).append(imp)
    over = [_line(imp, None) for path, imps in found.items() if len(imps) > allowed.get(path, (0, ""))[0]
            for imp in imps]
    fewer = {path: (len(found.get(path, [])), n) for path, (n, _) in allowed.items() if len(found.get(path, [])) < n}
    return over, fewer


def _line(imp: InnerImport, kind: str | None) -> str:
    return f"{imp.path}:{imp.line} {imp.function}: {', '.join(imp.modules)} ({kind or 'no reason'})"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "relocverify").rglob("*.py"))}


@lru_cache(maxsize=1)
def started() -> frozenset[str]:
    """The modules every command's start loads: ``relocverify --help``'s, in a fresh interpreter."""
    code = ("import contextlib, io, sys\nfrom relocverify.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main(['--help'])\n"
            "print(' '.join(sys.modules))")
    return frozenset(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    cwd=ROOT).stdout.split())


@lru_cache(maxsize=1)
def package() -> Package:
    return Package(_sources())


@lru_cache(maxsize=1)
def classified() -> tuple[tuple[InnerImport, str | None], ...]:
    return tuple((imp, kind_of(package(), imp, started())) for imp in package().inner)


def test_every_import_inside_a_function_has_a_kind():
    counts = Counter(kind or "no reason (ALLOWED)" for _, kind in classified())
    print(f"\n{sum(counts.values())} imports inside functions: "
          + ", ".join(f"{kind} {n}" for kind, n in counts.most_common()))
    over, fewer = violations(classified(), ALLOWED)
    assert not over, ("an import that brings nothing its module lacks belongs at the module's top (KINDS says "
                      "when one may wait; python3 ../shared/tools/imports.py relocverify after):\n" + "\n".join(over))
    assert not fewer, f"fewer than ALLOWED says (found, allowed): lower the count or take the file out: {fewer}"


def test_every_kind_has_a_reason_and_is_used():
    used = {kind for _, kind in classified()}
    assert all(KINDS.values()) and all(HEAVY.values()) and all(CODECS.values())
    assert all(reason for _, reason in ALLOWED.values())
    assert set(KINDS) <= used, f"no import is of these kinds: take them out of KINDS: {set(KINDS) - used}"


def test_every_command_starts_light():
    """``started`` is what it says: the parser's modules (every command's), and no lifter, solver or emulator."""
    assert {"relocverify.cli.main", "relocverify.cli.show", "relocverify.cli.elf"} <= started()
    assert not {m.split(".")[0] for m in started()} & {"angr", "pyvex", "claripy", "unicorn"}


def _loaded(module: str) -> set[str]:
    """The libraries of HEAVY and CODECS that importing ``module`` loads in a fresh interpreter."""
    code = (f"import sys, {module}; print(' '.join({{m.split('.')[0] for m in sys.modules}} & "
            f"{set(HEAVY) | set(CODECS)!r}))")
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.split())


@pytest.mark.parametrize("library", sorted(COMES_WITH))
def test_what_a_library_brings_is_as_the_table_says(library):
    assert _loaded(library) - {library} == set(COMES_WITH[library])


@pytest.mark.parametrize("module", ["relocverify.cli.main", "relocverify.proof.precondition", "relocverify.proof.smt",
                                    "relocverify.engine.row_memo", "relocverify.image.loader",
                                    "relocverify.report.build"])
def test_what_a_module_brings_is_what_a_fresh_interpreter_loads(module):
    """The static closure is the cost a module's import really has."""
    assert _loaded(module) == heavy(package().brings(module))


SYNTHETIC = {
    "relocverify/__init__.py": "",
    "relocverify/errors.py": "class Error(Exception):\n    pass\n",
    "relocverify/x86/__init__.py": "",
    "relocverify/x86/decode.py": "import capstone\n",
    "relocverify/x86/registers.py": "",
    "relocverify/proof/__init__.py": "",
    "relocverify/proof/smt.py": "import angr\n",
    "relocverify/proof/bad.py": ("from typing import TYPE_CHECKING\nfrom ..x86 import decode\n"
                                 "if TYPE_CHECKING:\n    import unicorn\n"
                                 "def f():\n    from ..errors import Error\n    from .smt import run\n    import re\n"
                                 "    import angr, capstone\n    import zstandard\n"
                                 "class C:\n    import iced_x86\n    def m(self):\n        from . import smt\n"),
    "relocverify/report/__init__.py": "",
    "relocverify/report/shown.py": ("def show():\n    from ..proof import bad\n    from ..x86 import registers\n"
                                    "    import shlex, re\n"),
    "relocverify/cli/__init__.py": "",
    "relocverify/cli/show.py": "from ..report import shown\ndef command():\n    from ..errors import Error\n"
                               "    from ..proof import smt\n",
}
STARTED = frozenset({"relocverify", "relocverify.cli", "relocverify.cli.show", "relocverify.report",
                     "relocverify.report.shown", "relocverify.x86", "relocverify.x86.registers", "re"})


def test_the_rule_can_fail():
    """A light import inside a function is found and has no kind; the others have theirs."""
    package = Package(SYNTHETIC)
    got = [(imp.function, imp.modules, kind_of(package, imp, STARTED)) for imp in package.inner]
    assert got == [
        ("command", ("relocverify.errors",), "cli-subcommand"),
        ("command", ("relocverify.proof", "relocverify.proof.smt"), "cli-subcommand"),
        ("f", ("relocverify.errors",), None),
        ("f", ("relocverify.proof.smt",), "heavy-module"),
        ("f", ("re",), None),
        ("f", ("angr",), "heavy-library"),
        ("f", ("capstone",), None),  # bad.py brings capstone already (x86.decode)
        ("f", ("zstandard",), "codec"),
        ("C.m", ("relocverify.proof", "relocverify.proof.smt"), "heavy-module"),
        ("show", ("relocverify.proof", "relocverify.proof.bad"), "heavy-module"),
        ("show", ("relocverify.x86", "relocverify.x86.registers"), None),  # already there at every start
        ("show", ("shlex",), "command-start"),
        ("show", ("re",), None),
    ]
    assert package.brings("relocverify.proof.bad") >= {"capstone", "iced_x86"}  # a class body runs at import
    assert "unicorn" not in package.brings("relocverify.proof.bad")  # TYPE_CHECKING never does
    over, fewer = violations([(imp, kind_of(package, imp, STARTED)) for imp in package.inner],
                             {"relocverify/report/shown.py": (3, "to move")})
    assert [line.split(" ")[0] for line in over] == ["relocverify/proof/bad.py:6", "relocverify/proof/bad.py:8",
                                                     "relocverify/proof/bad.py:9"]
    assert fewer == {"relocverify/report/shown.py": (2, 3)}


if __name__ == "__main__":
    for imp, kind in classified():
        print(_line(imp, kind))
    print(Counter(kind or "no reason" for _, kind in classified()))

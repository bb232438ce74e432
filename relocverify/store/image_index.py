"""An image with the index a question about it needs, cached on disk: ask twice, load once.

``indexed(path, system_map)`` returns an ``Indexed``: the image's code (its
executable sections, which hold the instructions and the alternatives'
replacements, and the thunk symbols the variants need), its functions and
its kernel sites.  Loading the Debian 6.1 vmlinux and finding its functions
and sites takes seconds; the index is an SQLite file under the user cache
(``<cache>/index/<key>.sqlite``), keyed by the files' identity (realpath,
device, inode, size and modification time of the image and of the map), the
index format and the tools' versions, and it records the image's content
hash.  The next question about the same files opens it and reads only what
it needs: one function by name, the sites at one address, the code bytes.
A cache file that is not such an index is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass
from urllib.parse import quote

from ..environment import default_cache_dir
from ..image.functions import Function, find_functions, iter_instruction_spans
from ..image.image import Image, Section, Symbol
from ..image.locations import FunctionIndex, Location, LocationSpec
from ..kernel.sites import Site, find_sites, kind_key
from ..processes import alive
from ..versions import versions_tag

INDEX_FORMAT = "3"  # 3: the loader's notes kept
APPLICATION_ID = 0x52564958  # 'RVIX'

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sections (name TEXT, address INTEGER, flags INTEGER, data BLOB);
CREATE TABLE symbols (name TEXT, address INTEGER, size INTEGER, kind TEXT);
CREATE TABLE functions (name TEXT, start INTEGER, stop INTEGER, section TEXT);
CREATE INDEX functions_by_name ON functions (name);
CREATE INDEX functions_by_start ON functions (start);
CREATE TABLE sites (kind TEXT, address INTEGER, length INTEGER, detail TEXT, target INTEGER, target_length INTEGER,
                    tag INTEGER);
CREATE INDEX sites_by_address ON sites (address);
"""
#: Sites longer than this (a blacklisted function, a text range) are few: kept in memory, not looked up.
SHORT_SITE = 64


def _s(v: int | None) -> int | None:
    return None if v is None else (v - (1 << 64) if v >> 63 else v)


def _u(v: int | None) -> int | None:
    return None if v is None else v + (1 << 64) if v < 0 else v


class IndexedSites:
    """The sites of one kernel image, looked up by address in the index (``SiteIndex.sites_at``'s answer)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.long = [self._site(r) for r in db.execute(
            "SELECT kind, address, length, detail, target, target_length, tag FROM sites WHERE length > ?",
            (SHORT_SITE,))]

    @staticmethod
    def _site(r) -> Site:
        return Site(r[0], _u(r[1]), r[2], r[3], _u(r[4]), r[5], r[6])

    def sites_at(self, address: int, length: int = 1) -> list[Site]:
        end = address + max(length, 1)
        lo = _s(address - SHORT_SITE)
        rows = self.db.execute("SELECT kind, address, length, detail, target, target_length, tag FROM sites "
                               "WHERE address >= ? AND address < ? AND length <= ?", (lo, _s(end), SHORT_SITE))
        found = [s for s in map(self._site, rows) if s.address < end and s.address + s.length > address]
        found += [s for s in self.long if s.address < end and s.address + s.length > address]
        found.sort(key=lambda s: (kind_key(s.kind), s.address))
        return found


@dataclass
class Indexed:
    """An image's code, functions and sites (see the module doc)."""

    image: Image  # its executable sections and thunk symbols only
    functions: FunctionIndex
    sites: IndexedSites | None  # None: not a kernel
    identity: str

    def boundaries(self, function: Function) -> list[int]:
        """The offsets of ``function``'s instructions, as the batch walks them (iced-x86, linearly)."""
        return [address - function.start for address, _ in iter_instruction_spans(self.image, function)]

    def locate(self, spec: LocationSpec) -> Location:
        """Where ``spec`` points, at an instruction boundary of its function (InputError otherwise)."""
        return self.functions.resolve(spec, self.boundaries)


class _LazyFunctions(FunctionIndex):
    """A FunctionIndex that asks the index database instead of holding every function."""

    where = "the image"

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def _rows(self, sql: str, args) -> list[Function]:
        return [Function(r[0], _u(r[1]), _u(r[2]), r[3]) for r in self.db.execute(sql, args)]

    @property
    def by_name(self):  # what ``named`` reads: the functions of one name, on demand
        return _ByName(self)

    def containing(self, address: int) -> Function | None:
        for f in self._rows("SELECT name, start, stop, section FROM functions WHERE start <= ? "
                            "ORDER BY start DESC LIMIT 16", (_s(address),)):
            if f.start <= address < f.end:
                return f
        return None


class _ByName:
    def __init__(self, index: _LazyFunctions):
        self.index = index

    def get(self, name: str, default=None):
        found = self.index._rows("SELECT name, start, stop, section FROM functions WHERE name = ? ORDER BY start",
                                 (name,))
        return found or default

    def __iter__(self):
        return (r[0] for r in self.index.db.execute("SELECT DISTINCT name FROM functions"))


def _identity(path: str) -> list:
    st = os.stat(path)
    return [os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _key(path: str, system_map: str | None, kernel: bool) -> str:
    doc = [INDEX_FORMAT, versions_tag().hex(), kernel, _identity(path), _identity(system_map) if system_map else None]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


def _sweep(directory: str) -> None:
    """The files of indexes that processes now gone were making (``<key>.sqlite.<pid>.tmp``: killed half way)
    deleted."""
    for name in os.listdir(directory):
        head, _, pid = name[:-len(".tmp")].rpartition(".") if name.endswith(".tmp") else ("", "", "")
        if head.endswith(".sqlite") and pid.isdigit() and not alive(int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def indexed(path: str, system_map: str | None = None, kernel: bool = True, cache_dir: str | None = None) -> Indexed:
    """See the module doc.  ``kernel``: require a kernel image (``loader.require_kernel``) and index its sites.
    A cache that cannot hold the index (a read-only home, a cache path that is a file or a dangling link, a
    full disk) costs only the time: the index is built in memory for this question."""
    directory = os.path.join(cache_dir or default_cache_dir(), "index")
    file = os.path.join(directory, f"{_key(path, system_map, kernel)}.sqlite")
    hit = _open(file)
    if hit is not None:
        return hit
    fill = _contents(path, system_map, kernel)
    tmp = f"{file}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        _sweep(directory)
        db = sqlite3.connect(tmp)
        try:
            fill(db)
        finally:
            db.close()
        os.replace(tmp, file)
    except (OSError, sqlite3.Error):
        pass
    finally:  # an index not made whole (no room, or a question refused: not a kernel) leaves no file behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
    hit = _open(file)
    if hit is None:  # the cache directory cannot hold it: answer from memory this time
        db = sqlite3.connect(":memory:")
        fill(db)
        hit = _indexed(db)
    return hit


def _contents(path: str, system_map: str | None, kernel: bool):
    """The image loaded, and a function that writes its index into a database."""
    from ..image.loader import load_image, require_kernel

    image = load_image(path, system_map)
    if kernel:
        require_kernel(image)
    functions = find_functions(image)
    sites = find_sites(image) if kernel else None

    def fill(db: sqlite3.Connection) -> None:
        db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        db.executescript(_SCHEMA)
        db.executemany("INSERT INTO meta VALUES (?, ?)",
                       [("format", INDEX_FORMAT), ("identity", image.identity), ("path", os.fsencode(image.path)),
                        ("image_format", image.format), ("symbol_source", image.symbol_source),
                        ("kernel", "1" if kernel else "0"), ("notes", json.dumps(image.notes))])
        db.executemany("INSERT INTO sections VALUES (?, ?, ?, ?)",
                       [(s.name, _s(s.address), s.flags, s.data) for s in image.sections if s.executable])
        db.executemany("INSERT INTO symbols VALUES (?, ?, ?, ?)",
                       [(s.name, _s(s.address), s.size, s.kind) for s in image.symbols if s.name.startswith("__x86_")])
        db.executemany("INSERT INTO functions VALUES (?, ?, ?, ?)",
                       [(f.name, _s(f.start), _s(f.end), f.section) for f in functions])
        if sites is not None:
            db.executemany("INSERT INTO sites VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(s.kind, _s(s.address), s.length, s.detail, _s(s.target), s.target_length, s.tag)
                            for s in sites.iter_sites()])
        db.commit()

    return fill


def _open(file: str) -> Indexed | None:
    if not os.path.isfile(file):
        return None
    try:
        return _indexed(sqlite3.connect(f"file:{quote(os.fsencode(file))}?mode=ro", uri=True))
    except (sqlite3.DatabaseError, KeyError, TypeError):
        return None


def _indexed(db: sqlite3.Connection) -> Indexed | None:
    """The index in ``db``, or None if it is of another format."""
    meta = dict(db.execute("SELECT key, value FROM meta"))
    if meta.get("format") != INDEX_FORMAT:
        db.close()
        return None
    sections = tuple(Section(name=r[0], address=_u(r[1]), data=r[3], executable=True, flags=r[2])
                     for r in db.execute("SELECT name, address, flags, data FROM sections"))
    symbols = tuple(Symbol(r[0], _u(r[1]), r[2], r[3]) for r in db.execute("SELECT * FROM symbols"))
    image = Image(path=os.fsdecode(meta["path"]), identity=meta["identity"], format=meta["image_format"],
                  compression=None, sections=sections, symbols=tuple(sorted(symbols, key=lambda s: (s.address, s.name))),
                  symbol_source=meta["symbol_source"], notes=tuple(json.loads(meta.get("notes", "[]"))))
    sites = IndexedSites(db) if meta.get("kernel") == "1" else None
    return Indexed(image, _LazyFunctions(db), sites, meta["identity"])


__all__ = ["Indexed", "IndexedSites", "indexed"]

"""The store's one schema (``schema.sql``), and the shard's tables made from it.

A worker's shard (``shard``) holds the store's row tables as ``schema.sql`` defines them, with two
differences the merge resolves: a variant is named by its text (``variants.name TEXT``), and the outcomes
and variant names a worker found new are defined under provisional ids (``new_outcomes``, the store's
``outcomes`` with ``pid`` for ``id``; ``new_names``).  ``done`` lists the functions a shard holds, ``seals`` the
seals its worker made (``row_seals.function_mac``: the functions it copied from the proof cache), and
``seal_outcomes`` the reason those seals give each outcome id they name (provisional or the store's)."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def schema_sql() -> str:
    """The text of ``schema.sql``: every table and index a store has."""
    return resources.files(__package__).joinpath("schema.sql").read_text()


def table_sql(name: str) -> str:
    """The ``CREATE TABLE`` statement of table ``name`` in ``schema.sql``, with its closing semicolon."""
    m = re.search(rf"^CREATE TABLE {name} \(.*?;$", schema_sql(), re.M | re.S)
    if m is None:
        raise KeyError(f"schema.sql defines no table {name}")
    return m.group(0)


def _changed(text: str, old: str, new: str) -> str:
    if old not in text:
        raise KeyError(f"schema.sql no longer reads {old!r}: the shard's tables follow it")
    return text.replace(old, new)


@lru_cache(maxsize=1)
def shard_schema() -> str:
    """The tables of a shard (see the module's docstring)."""
    return "\n".join([
        table_sql("instructions"),
        table_sql("packed"),
        "CREATE TABLE new_names (pid INTEGER PRIMARY KEY, name TEXT NOT NULL);",
        _changed(table_sql("variants"), "name INTEGER NOT NULL", "name TEXT NOT NULL"),
        _changed(_changed(table_sql("outcomes"), "CREATE TABLE outcomes (", "CREATE TABLE new_outcomes ("),
                 "id INTEGER PRIMARY KEY", "pid INTEGER PRIMARY KEY"),
        table_sql("counterexamples"),
        "CREATE TABLE done (function INTEGER PRIMARY KEY, config INTEGER NOT NULL);",
        "CREATE TABLE seals (function INTEGER PRIMARY KEY, mac BLOB NOT NULL);",
        "CREATE TABLE seal_outcomes (outcome INTEGER PRIMARY KEY, reason TEXT NOT NULL);",
    ]) + "\n"

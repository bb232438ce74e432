"""store.tally: an image's packed counts added up in C, held to the Python loop it replaces
(``store.store.add_counts``) on generated rows, and to its source (``extensions.build_digest``)."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.extensions import build_digest
from relocverify.store import native_tally
from relocverify.store.packed_rows import pack_ids, pack_u32
from relocverify.store.store import add_counts

tally = native_tally.TALLY


def test_the_tally_is_built_from_the_source_beside_it():
    assert tally is not None, native_tally.STATUS
    assert build_digest(native_tally.__file__.replace("native_tally.py", "tally.c")) == tally.SOURCE_SHA256


_ids = st.integers(-(1 << 31), (1 << 31) - 1)
_function = st.tuples(st.integers(1, 1 << 40), st.sampled_from([".text", ".init.text", ".noinstr.text", "x"]),
                      st.lists(st.tuples(st.one_of(st.integers(1, 40), _ids), st.integers(0, (1 << 32) - 1)),
                               max_size=12))


_masks = st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 4096), st.one_of(st.integers(1, 64),
                                                                                  st.integers(0, (1 << 32) - 1))),
                                         max_size=6))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_function, _masks), max_size=40), st.frozensets(st.integers(1, 40), max_size=10),
       st.booleans(), st.booleans())
def test_c_adds_up_as_the_python_loop(functions, weak, as_set, with_sites):
    """The same sections, ids, sums (counts of 0 and sums past 32 bits included), weak rows, in order, and site
    masks (every mask a u32, a row without sites counting none)."""
    rows = [(fid, section, pack_ids([o for o, _ in pairs]), pack_u32([n for _, n in pairs]))
            + ((None if sites is None else pack_u32([v for pair in sites for v in pair]),) if with_sites else ())
            for (fid, section, pairs), sites in functions]
    weak = set(weak) if as_set else weak
    assert tally.add(rows, weak) == add_counts(rows, frozenset(weak))
    got, weak_rows, masks = tally.add(rows, weak)
    assert list(masks.items()) == list(add_counts(rows, frozenset(weak))[2].items())
    assert sum(masks.values()) == sum(len(s or ()) for _, s in functions) * with_sites
    assert [list(d) for d in got.values()] == [list(d) for d in add_counts(rows, frozenset(weak))[0].values()]
    assert all(r is w for r, w in zip(weak_rows, [r for r in rows if set(array("i", r[2])) & set(weak)]))


def test_bad_rows_are_refused_not_misread():
    with pytest.raises(ValueError, match="whole 4-byte"):
        tally.add([(1, ".text", b"\0\0\0", pack_u32([1]))], frozenset())
    with pytest.raises(TypeError):
        tally.add([(1, ".text", pack_ids([1]))], frozenset())
    with pytest.raises(ValueError, match="pairs"):
        tally.add([(1, ".text", pack_ids([1]), pack_u32([1]), pack_u32([4]))], frozenset())
    with pytest.raises(TypeError):
        tally.add([], [1])

"""engine.row_pack: a function's packed row written in C, held to the walk it replaces.

``Worker.function_rows`` writes the rows of instructions whose key has a plain shared finding from
tables by key number (``row_pack.scan`` / ``row_pack.pack``), and takes the per-instruction path for
the others; ``Worker._walk_rows`` is one walk in address order over every instruction.  Both must
give the same rows: every instruction's outcome, length, fresh mark and proof time, the site masks,
the live variants, the full rows and the rows kept for the proof cache."""

from __future__ import annotations

import pickle
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.engine import native_rows
from relocverify.engine import worker as worker_module
from relocverify.store.packed_rows import unpack_u32

row_pack = native_rows.ROW_PACK


def test_the_packed_row_writer_is_built():
    assert row_pack is not None, native_rows.STATUS


def test_a_build_is_stale_when_its_source_or_its_own_header_changes(tmp_path):
    """``extensions.build_digest``: the ``.c`` file and the headers beside it that it includes (row_pack.c and
    jump_walk.c share buffers.h); a header from the include path (pyvex's) is not ours and does not count."""
    from relocverify.extensions import build_digest

    (tmp_path / "walk.c").write_text('#include <Python.h>\n#include "buffers.h"\n#include "libvex.h"\nint x;\n')
    (tmp_path / "buffers.h").write_text("typedef int Buf;\n")
    first = build_digest(tmp_path / "walk.c")
    (tmp_path / "buffers.h").write_text("typedef long Buf;\n")
    second = build_digest(tmp_path / "walk.c")
    (tmp_path / "walk.c").write_text('#include <Python.h>\n#include "buffers.h"\n#include "libvex.h"\nint y;\n')
    assert len({first, second, build_digest(tmp_path / "walk.c")}) == 3
    assert build_digest(native_rows.__file__.replace("native_rows.py", "row_pack.c")) == row_pack.SOURCE_SHA256


def _model(lengths, numbers, oid, us, specials, s_oid, s_us, s_flags, s_mask, variants, marks):
    """``row_pack.pack`` in Python: the bookkeeping of ``Worker._walk_rows``."""
    kmap, order, counts, plain, sites, out_variants = {}, [], [], [], [], []
    by_special = {p: (s_oid[k], s_us[k], s_flags[k], s_mask[k], k) for k, p in enumerate(specials)}
    off = 0
    for i, n in enumerate(lengths):
        if i in by_special:
            ident, time, flags, mask, k_special = by_special[i]
        else:
            ident, time, flags, mask, k_special = oid[numbers[i]], us[numbers[i]], 0, marks.get(i, 0), None
        if not flags & 1:
            if ident not in kmap:
                kmap[ident] = len(order)
                order.append(ident)
                counts.append(0)
            k = kmap[ident]
            counts[k] += 1
            if not flags & 2:
                plain += [off, n | (16 if flags & 4 else 0) | k << 5, time]
                if mask:
                    sites += [off, mask]
        for s, vid, j in variants:
            if k_special is not None and s == k_special:
                if vid not in kmap:
                    kmap[vid] = len(order)
                    order.append(vid)
                    counts.append(0)
                if j >= 0:
                    out_variants += [off, j, kmap[vid]]
        off += n
    return order, counts, plain, sites, out_variants


@st.composite
def rows(draw):
    n = draw(st.integers(0, 40))
    lengths = bytes(draw(st.lists(st.integers(1, 15), min_size=n, max_size=n)))
    tab = draw(st.integers(1, 12))
    ids = st.one_of(st.integers(1, 6), st.integers(-(1 << 40), -1))
    oid = [draw(ids) for _ in range(tab)]
    us = [draw(st.integers(0, (1 << 32) - 1)) for _ in range(tab)]
    numbers = [draw(st.integers(0, tab - 1)) for _ in range(n)]
    specials = sorted(draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n)) if n else set())
    s_oid = [draw(ids) for _ in specials]
    s_us = [draw(st.integers(0, (1 << 32) - 1)) for _ in specials]
    s_flags = [draw(st.sampled_from([0, 1, 2, 4])) for _ in specials]
    s_mask = [draw(st.integers(0, 1 << 20)) for _ in specials]
    variants = sorted(draw(st.lists(st.tuples(st.integers(0, max(len(specials) - 1, 0)), ids, st.integers(-1, 5)),
                                    max_size=8)) if specials else [], key=lambda v: v[0])
    # positions at sites that only mark them: special ones among them too (the special's own mask wins)
    marks = draw(st.dictionaries(st.integers(0, n - 1), st.integers(0, 1 << 20), max_size=n)) if n else {}
    return lengths, numbers, oid, us, specials, s_oid, s_us, s_flags, s_mask, variants, marks


def _marks(marks: dict) -> array:
    return array("I", [x for p in sorted(marks.items()) for x in p])


@settings(max_examples=400, deadline=None)
@given(rows())
def test_pack_does_what_the_walk_does(case):
    lengths, numbers, oid, us, specials, s_oid, s_us, s_flags, s_mask, variants, marks = case
    got = row_pack.pack(lengths, array("I", numbers), array("q", oid), array("I", us), array("I", specials),
                        array("q", s_oid), array("I", s_us), bytes(s_flags), array("I", s_mask),
                        array("I", [v[0] for v in variants]), array("q", [v[1] for v in variants]),
                        array("i", [v[2] for v in variants]), _marks(marks))
    order, counts, plain, sites, out_variants = _model(*case)
    assert got[0] == order
    assert list(unpack_u32(got[1])) == counts
    assert list(unpack_u32(got[2])) == plain
    assert list(unpack_u32(got[3])) == sites
    assert list(unpack_u32(got[4])) == out_variants


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 15), max_size=40), st.integers(0, 1 << 40), st.data())
def test_scan_finds_every_position_the_tables_cannot_serve(lengths, start, data):
    tab = data.draw(st.integers(1, 10))
    numbers = [data.draw(st.integers(0, tab + 2)) for _ in lengths]  # some beyond the tables
    oid = [data.draw(st.sampled_from([0, 3, -7])) for _ in range(tab)]
    addresses = [start + sum(lengths[:i]) for i in range(len(lengths))]
    rep = [data.draw(st.sampled_from([0] + addresses[:3])) for _ in range(tab)]
    forced = sorted(data.draw(st.sets(st.integers(0, max(len(lengths) - 1, 0)), max_size=5)) if lengths else set())
    got = unpack_u32(row_pack.scan(bytes(lengths), array("I", numbers), start, array("q", oid), array("Q", rep),
                                   array("I", forced)))
    want = [i for i, j in enumerate(numbers)
            if i in forced or j >= tab or oid[j] == 0 or rep[j] == addresses[i]]
    assert list(got) == want


def test_mismatched_arrays_are_refused():
    with pytest.raises(ValueError):
        row_pack.pack(b"\x01", array("I", [0, 0]), array("q", [1]), array("I", [0]), array("I"), array("q"),
                      array("I"), b"", array("I"), array("I"), array("q"), array("i"), array("I"))
    with pytest.raises(ValueError):  # a position with no outcome that is not special: a caller's bug
        row_pack.pack(b"\x01", array("I", [0]), array("q", [0]), array("I", [0]), array("I"), array("q"),
                      array("I"), b"", array("I"), array("I"), array("q"), array("i"), array("I"))
    for marks in ([1, 5], [0, 5, 0, 6], [0, 5, 1]):  # past the end, twice the same position, half a pair
        with pytest.raises(ValueError):
            row_pack.pack(b"\x01", array("I", [0]), array("q", [1]), array("I", [0]), array("I"), array("q"),
                          array("I"), b"", array("I"), array("I"), array("q"), array("i"), array("I", marks))


def _rows_of(batch, ids):
    """A batch's rows by function, with outcome ids and variant name ids replaced by what they stand for."""
    out = {}
    for fid, outcomes, counts, names, variants, sites, data in batch.packed:
        o = [ids.described(i) for i in array("q", outcomes)]
        nm = [ids.name_text(i) for i in array("q", names)] if names else []
        words = unpack_u32(data)
        plain = [(words[i], words[i + 1] & 31, o[words[i + 1] >> 5], words[i + 2]) for i in range(0, len(words), 3)]
        v = unpack_u32(variants) if variants else []
        out[fid] = (plain, list(unpack_u32(counts)), sorted(zip(o, unpack_u32(counts))),
                    list(unpack_u32(sites)) if sites else [],
                    [(v[i], nm[v[i + 1]], o[v[i + 2]]) for i in range(0, len(v), 3)])
    full = [(r[0], r[1], r[2], ids.described(r[3])) + tuple(r[4:9]) + (r[9] is not None,) for r in batch.full]
    reasoned = [(r[0], r[1], r[2], ids.described(r[3]), r[4]) for r in batch.variants]
    return out, sorted(full), sorted(reasoned), batch.functions


@pytest.mark.slow
def test_the_packed_rows_are_the_walks_on_a_kernel_slice(tmp_path, monkeypatch):
    """Two workers with the same findings write the rows of 4,000 functions spread over the Debian 6.1
    kernel (every site kind among them), one by the packed path and one by the walk.  Each proves the
    variants of its sites once, and the other takes its findings; the proof clock stands still, so every
    proof time is the same."""
    import types

    from relocverify.engine import pipeline

    monkeypatch.setattr(pipeline, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))
    from relocverify.engine.run import overlaps
    from relocverify.engine.site_memo import cached_sites
    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions
    from relocverify.image.loader import load_image
    from relocverify.plan.policy import POLICIES
    from relocverify.proof.cache_key import cache_tag

    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    functions = dict(enumerate(find_functions(image)[::11][:4000]))
    (tmp_path / "cache").mkdir()
    job = worker_module.Job(image, functions, 0xFFFFFFFFC0001000, 10.0, cached_sites(image, None), {},
                            str(tmp_path / "cache"), cache_tag(), str(tmp_path / "s.sqlite"), 1, {},
                            overlaps(image, list(functions.items())), frozenset(), POLICIES["kernel"], None, True)
    packed, walked = worker_module.Worker(job), worker_module.Worker(job)
    fids = sorted(functions)
    misses, waiting = {}, []
    for w in (packed, walked):
        for i in range(0, len(fids), 64):
            m, _, _, later, _, _ = w.survey(fids[i:i + 64])
            if w is packed:
                for key, rep in m.items():
                    misses.setdefault(key, rep)
                waiting += later
    learned = packed.prove([(k, raw, a) for k, (raw, a) in misses.items()])
    walked.accept(pickle.loads(pickle.dumps(learned)))
    sites = 0
    for i in range(0, len(waiting), 64):
        chunk = waiting[i:i + 64]
        a, b = worker_module._Batch(), worker_module._Batch()
        for fid in chunk:
            packed.function_rows(fid, a)
        # what the packed worker proved for the chunk's sites (their variants): the walk takes the same findings
        # (a worker proving them again might word an SMT answer otherwise: which model z3 picks follows its past)
        walked.accept(pickle.loads(pickle.dumps({k: v for k, v in packed.learned.items() if k not in walked.learned})))
        for fid in chunk:
            walked._walk_rows(fid, b)
        assert _rows_of(a, packed.ids) == _rows_of(b, walked.ids), chunk
        sites += sum(1 for row in a.packed if row[5])
    assert sites > 1000
    assert packed.kept.new_rows.keys() == walked.kept.new_rows.keys() and len(packed.kept.new_rows) > 3000
    for fkey, (context, value) in packed.kept.new_rows.items():
        assert walked.kept.new_rows[fkey] == (context, value)

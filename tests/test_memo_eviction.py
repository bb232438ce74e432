"""The tracer audit's outcome memos stay bounded (issue 43: a cache that only grew, 3.2 GB of memos of
source versions never read again): after a save the least recently used memos go first, a loaded memo
counts as used, and the memo just saved is kept whatever its size."""

from __future__ import annotations

import os
import time

from hypothesis import given, settings, strategies as st

from relocverify.tracers.audit import OutcomeMemo


def _memo(n: int) -> dict:
    return {i.to_bytes(4, "little"): ("copy", "proved", "", "", "g", "{}") for i in range(n)}


def _sizes(directory) -> dict:
    d = os.path.join(directory, "tracers")
    return {e.name: e.stat().st_size for e in os.scandir(d) if e.name.endswith(".marshal")}


def test_old_memos_are_evicted_and_a_loaded_one_is_kept(tmp_path):
    memo = OutcomeMemo(str(tmp_path), limit=10**9)
    for k in range(4):
        memo.save(f"tag{k}".encode(), "kprobes@6.1", _memo(200))
        past = time.time() - 100 + k
        os.utime(memo._path(f"tag{k}".encode(), "kprobes@6.1"), (past, past))
    assert len(_sizes(tmp_path)) == 4
    one = max(_sizes(tmp_path).values())
    assert memo.load(b"tag0", "kprobes@6.1")  # the oldest, now used
    small = OutcomeMemo(str(tmp_path), limit=3 * one)
    small.save(b"tag9", "kprobes@6.1", _memo(200))
    left = _sizes(tmp_path)
    assert sum(left.values()) <= 3 * one
    assert os.path.basename(small._path(b"tag9", "kprobes@6.1")) in left  # the one just saved
    assert os.path.basename(small._path(b"tag0", "kprobes@6.1")) in left  # loaded: recently used
    assert os.path.basename(small._path(b"tag1", "kprobes@6.1")) not in left  # least recently used


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=8), limit=st.integers(0, 20_000))
def test_the_directory_stays_under_its_limit_and_keeps_the_last_save(tmp_path_factory, sizes, limit):
    root = tmp_path_factory.mktemp("memo")
    memo = OutcomeMemo(str(root), limit=limit)
    for k, n in enumerate(sizes):
        memo.save(f"t{k}".encode(), "uprobes@6.1", _memo(n))
    last = os.path.basename(memo._path(f"t{len(sizes) - 1}".encode(), "uprobes@6.1"))
    left = _sizes(root)
    assert last in left
    assert sum(left.values()) <= max(limit, left[last])
    assert memo.load(f"t{len(sizes) - 1}".encode(), "uprobes@6.1") == _memo(sizes[-1])

"""A misspelt function name gets the names nearest it by edit similarity, and the message says where the
names come from (issue 43: ``show STORE vfs_raed`` suggested ``vfs_caches_init`` and said "in the image")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.errors import InputError
from relocverify.image.functions import Function
from relocverify.image.locations import FunctionIndex

NAMES = ["vfs_read", "vfs_readv", "vfs_write", "vfs_caches_init", "vfs_fsync", "tcp_v4_rcv", "tcp_v4_connect",
         "do_sys_open", "__x64_sys_read", "ksys_read", "kernel_read"]


def index(where: str = "the image") -> FunctionIndex:
    return FunctionIndex([Function(n, 0x1000 * (i + 1), 0x1000 * (i + 1) + 0x100, ".text")
                          for i, n in enumerate(NAMES)], where)


def test_a_transposition_suggests_the_name_first_and_says_where():
    with pytest.raises(InputError) as err:
        index("the store").named("vfs_raed")
    text = str(err.value)
    assert "in the store" in text and "did you mean vfs_read" in text


def _typo(name: str, kind: int, at: int) -> str:
    at %= len(name) - 1
    if kind == 0:  # two neighbours swapped
        return name[:at] + name[at + 1] + name[at] + name[at + 2:]
    if kind == 1:  # one dropped
        return name[:at] + name[at + 1:]
    return name[:at] + "x" + name[at:]  # one added


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(NAMES), st.integers(0, 2), st.integers(0, 40))
def test_a_one_edit_typo_is_among_the_suggestions(name, kind, at):
    typo = _typo(name, kind, at)
    if typo in NAMES:
        return
    assert name in index().close_names(typo), (typo, index().close_names(typo))

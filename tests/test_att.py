"""``x86.att.objdump_immediates`` against objdump itself, on instructions with immediates of every width
and sign (issue 43: ``show`` printed ``$18446744073709551607``)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.x86.att import objdump_immediates
from relocverify.x86.decode import decode

pytestmark = pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump is the judge")

#: (prefix bytes, opcode with ModRM, immediate width in bytes): ALU, mov, push, imul, ret, shifts.
SHAPES = [("48", "83c0", 1), ("", "83c0", 1), ("66", "83c0", 1), ("", "04", 1), ("", "6a", 1), ("48", "c7c0", 4),
          ("", "c7c0", 4), ("48", "81e8", 4), ("", "68", 4), ("48", "69c0", 4), ("", "c2", 2), ("48", "c1e0", 1),
          ("", "b8", 4), ("48", "b8", 8), ("66", "b8", 2)]


def _objdump(raw: bytes, tmp_path) -> str:
    path = tmp_path / "i.bin"
    path.write_bytes(raw)
    out = subprocess.run(["objdump", "-D", "--insn-width=16", "-b", "binary", "-mi386:x86-64", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return out.strip().splitlines()[-1].split("\t")[-1]


def _immediates(text: str) -> list[int]:
    return [int(v, 16) for v in re.findall(r"\$0x([0-9a-f]+)", text)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SHAPES), st.data())
def test_immediates_are_objdumps(tmp_path_factory, shape, data):
    prefix, opcode, width = shape
    imm = data.draw(st.integers(0, (1 << (8 * width)) - 1))
    raw = bytes.fromhex(prefix + opcode) + imm.to_bytes(width, "little")
    insn = decode(raw, 0)
    ours = objdump_immediates(insn.text)
    theirs = _objdump(raw, tmp_path_factory.mktemp("od"))
    assert _immediates(ours) == _immediates(theirs), (raw.hex(), ours, theirs)
    assert not re.search(r"\$-|\$\d+(?![\dx])", ours), ours


def test_show_prints_immediates_as_objdump_does():
    from relocverify.report.shown import disassemble

    raw = bytes.fromhex("48c7c0f7ffffff")  # mov $-9, %rax: capstone says $18446744073709551607
    assert disassemble(raw, 0x1000, lambda a: None) == "movq $0xfffffffffffffff7, %rax"

"""A toy pass for tests/test_passes.py: instructions counted per opcode (capstone's mnemonic), per function."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import NamedTuple

import capstone

from relocverify.engine.passes import FunctionPass
from relocverify.image.functions import iter_instruction_spans

_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


class OpcodeRow(NamedTuple):
    function: str
    opcode: str
    count: int


class OpcodeCount(FunctionPass):
    """Keys: each instruction's bytes; a key's value: its mnemonic; rows: one per (function, opcode).
    ``RV_TEST_PASS_DELAY`` (seconds per function) slows it, for a test that kills a run in this pass."""

    name = "opcodes"
    row = OpcodeRow

    def keys(self, image, fn, data):
        return [raw for _, raw in iter_instruction_spans(image, fn)]

    def compute(self, key):
        insn = next(_CS.disasm(key, 0), None)
        return insn.mnemonic if insn is not None else "(bad)"

    def rows(self, fn, found):
        delay = float(os.environ.get("RV_TEST_PASS_DELAY", "0"))
        if delay:
            time.sleep(delay)
        return [OpcodeRow(fn.name, op, n) for op, n in sorted(Counter(v for _, v in found).items())]

    def summarize(self, rows):
        by = Counter()
        functions = set()
        for r in rows:
            by[r.opcode] += r.count
            functions.add(r.function)
        return {"instructions": sum(by.values()), "functions": len(functions), "by_opcode": dict(sorted(by.items()))}

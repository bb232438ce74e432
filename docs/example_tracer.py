#!/usr/bin/env python3
"""A tracer for ``relocverify audit --tracer-cmd`` (docs/audit.md): it refuses calls and copies every
other instruction verbatim to its slot, followed by ``jmp rel32`` back to A+len.

Reads ``ADDR_HEX TRAMP_HEX BYTES_HEX`` lines, answers ``refuse REASON`` or ``reloc CODE_HEX``."""

import struct
import sys

for line in sys.stdin:
    address, tramp, raw = line.split()
    a, t, code = int(address, 16), int(tramp, 16), bytes.fromhex(raw)
    opcode = code.lstrip(b"\x2e\x3e\x66\xf2\xf3")[:1]  # past the legacy prefixes a compiler puts on a call
    if opcode == b"\xe8":
        print("refuse calls are not traced", flush=True)
        continue
    back = (a + len(code)) - (t + len(code) + 5)
    print("reloc " + (code + b"\xe9" + struct.pack("<i", back)).hex(), flush=True)

"""``relocverify prove``: check a relocation made by another tool."""

from __future__ import annotations

import json
from typing import TextIO

from ..inputs import parse_hex_bytes
from .check import one_instruction


def command(args, out: TextIO) -> int:
    orig = parse_hex_bytes(args.orig, "--orig")
    reloc = parse_hex_bytes(args.reloc, "--reloc")
    from . import locate

    at, _ = locate.resolve(args.at, locate.image_index(args), 0)
    decoded = one_instruction(orig, at)

    from ..proof.prove import prove_relocation
    from ..proof.verdict import verdict_exit_code

    result = prove_relocation(decoded, reloc, args.tramp, timeout_ms=int(args.timeout * 1000),
                              tracer_memory=tuple(args.tracer_memory or ()))
    if args.json:
        json.dump(result.as_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(result.render())
    return verdict_exit_code(result.verdict)

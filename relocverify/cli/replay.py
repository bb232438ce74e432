"""``relocverify replay``: a counterexample replayed concretely on unicorn, both sides."""

from __future__ import annotations

import json
from typing import TextIO

from ..concrete.outcome import Outcome, state_from_json, unmodelled_registers
from ..concrete.replay import replay
from ..errors import InputError
from ..inputs import load_json, parse_hex_bytes
from ..plan.effects import effects_from_json
from ..plan.plan import make_plan
from ..x86.decode import decode


def _describe(label: str, o: Outcome) -> str:
    return f"{label:<10} " + (f"fault: {o.fault}" if o.fault else f"next rip {o.next_rip:#x}, "
                                                              f"{len(o.writes)} byte(s) written")


def _outcome_json(o: Outcome) -> dict:
    return {"fault": o.fault, "next_rip": hex(o.next_rip),
            "registers": {k: hex(v) for k, v in sorted(o.registers.items())},
            "writes": {hex(a): f"{b:02x}" for a, b in sorted(o.writes.items())}}


def _planned_tracer_memory(orig: bytes, at: int, tramp: int, reloc: bytes) -> tuple[tuple[int, int], ...]:
    """Our planner's tracer memory if ``reloc`` is its trampoline (save slot included), else the trampoline."""
    plan = make_plan(decode(orig, at), tramp)
    return plan.tracer_memory if plan.trampoline == reloc else ((tramp, len(reloc)),)


def command(args, out: TextIO) -> int:
    """``relocverify replay``: 0 equal, 1 different, 2 bad input (raised as InputError), 3 not replayable."""
    if (args.reloc is None) == (args.effects is None):
        raise InputError("give exactly one of --reloc HEX and --effects JSON")
    orig = parse_hex_bytes(args.orig, "--orig")
    if len(orig) > 15:
        raise InputError(f"--orig has {len(orig)} bytes; an x86 instruction has at most 15")
    state = state_from_json(load_json(args.state, "--state"))
    from . import locate

    args.at, _ = locate.resolve(args.at, locate.image_index(args), 0)
    if args.reloc is not None:
        reloc = parse_hex_bytes(args.reloc, "--reloc")
        result = replay(orig, args.at, args.tramp, state, reloc=reloc,
                        tracer_memory=_planned_tracer_memory(orig, args.at, args.tramp, reloc))
    else:
        effects = effects_from_json(load_json(args.effects, "--effects"))
        result = replay(orig, args.at, args.tramp, state, effects=effects)
    if args.json:
        json.dump({"original": _outcome_json(result.original), "relocated": _outcome_json(result.relocated),
                   "differences": [{"what": d.what, "original": d.original, "relocated": d.relocated}
                                   for d in result.differences],
                   "replayable": result.replayable, "limit": result.limit or None, "differ": result.differ,
                   "not_modelled": list(unmodelled_registers(state))}, out, indent=2)
        out.write("\n")
        return 3 if not result.replayable else 1 if result.differ else 0
    if unmodelled_registers(state):
        out.write(f"note: not modelled by the replay, ignored: {', '.join(unmodelled_registers(state))}\n")
    out.write(_describe("original:", result.original) + "\n")
    out.write(_describe("relocated:", result.relocated) + "\n")
    for d in result.differences:
        out.write(f"differs: {d.what}: original {d.original}, relocated {d.relocated}\n")
    if not result.replayable:
        out.write(f"inconclusive: {result.limit}\n")
        return 3
    out.write("equal\n" if not result.differ else f"{len(result.differences)} difference(s)\n")
    return 1 if result.differ else 0

"""Instructions VEX lifts without error but wrongly (docs/references.md, "VEX").

A byte-identical copy of one is ``opaque``: the copy runs the same hardware
instruction, but no VEX-based proof of that exists."""

from __future__ import annotations

from ..x86.instruction import Instruction

OPAQUE_LIFTS: dict[str, str] = {
    "swapgs": "VEX lifts swapgs as a no-op",
    "cli": "VEX lifts cli as a privileged exit",
    "sti": "VEX lifts sti as a privileged exit",
    "iretq": "VEX's iretq ignores CS and SS",
    "rdmsr": "VEX models rdmsr as an effect-less helper",
    "sysret": "VEX models sysret as an effect-less helper",
    "sysretq": "VEX models sysret as an effect-less helper",
}


def opaque_lift_reason(insn: Instruction) -> str | None:
    if insn.opname in OPAQUE_LIFTS:
        return OPAQUE_LIFTS[insn.opname]
    if insn.opcode in (b"\x0f\x20", b"\x0f\x22"):
        return "VEX lifts mov to/from a control register through a 32-bit truncation"
    if insn.opcode in (b"\x0f\x21", b"\x0f\x23"):
        return "VEX does not model debug registers"
    return None


"""A kernel candidate's user-space twin, so that this CPU can judge its values.

The CPU judge (``selftest.judgement``) runs code in a user process; a candidate at a kernel site (CPL 0,
``operators.KERNEL``) cannot run there.  Its operators build it at the user site moved by
``operators.KERNEL_SHIFT``, so every rel32 and RIP-relative field means the same at both sites; ``twin``
moves it back: the same bytes at ``AT``/``TRAMP``, and every qword or sign-extended imm32 of the
relocation that holds one of the kernel addresses it may carry as data (A+len, the original's branch
target, an address in the trampoline: an absolute jump's target, ``push $A+len``) and the tracer memory
moved by the shift.  Other immediates are left alone: an imm32 of the original that looks like a kernel
address is the same on both sides.  What the twin
cannot show is what CPL 0 itself changes (sti, popf of IF, interrupt frames, IBT): the unicorn-based
machine judges run the candidate where it is.
"""

from __future__ import annotations

import dataclasses
import struct

from .machine_states import kernel
from .machine_trace import exits
from .operators import AT, KERNEL_SHIFT, TRAMP, Candidate



def _addresses(c: Candidate) -> set[int]:
    """The kernel-site addresses a relocation may hold as data: where the original can go (A+len, its
    branch target) and the trampoline's own bytes."""
    return {e for e in exits(c.orig, c.at) if kernel(e)} | {c.tramp + k for k in range(len(c.reloc) + 1)}


def twin(c: Candidate) -> Candidate | None:
    """``c`` itself at a user site; its twin when it is at the kernel site; None for a kernel candidate
    placed otherwise (its rel32 fields would mean something else at the user site)."""
    if not kernel(c.at):
        return c
    if c.at - AT != KERNEL_SHIFT or c.tramp - TRAMP != KERNEL_SHIFT:
        return None
    addresses = _addresses(c)
    reloc = bytearray(c.reloc)
    for k in range(len(reloc) - 7):
        v = struct.unpack_from("<Q", reloc, k)[0]
        if v in addresses:
            struct.pack_into("<Q", reloc, k, v - KERNEL_SHIFT)
    for k in range(len(reloc) - 3):  # a sign-extended imm32 (push $A+len): kernel text addresses fit one
        v = struct.unpack_from("<i", reloc, k)[0] & ((1 << 64) - 1)
        if v in addresses:
            struct.pack_into("<i", reloc, k, v - KERNEL_SHIFT)
    memory = tuple((lo - KERNEL_SHIFT if kernel(lo) else lo, n) for lo, n in c.tracer_memory)
    return dataclasses.replace(c, at=AT, tramp=TRAMP, reloc=bytes(reloc), tracer_memory=memory)

"""The machine judges' states: placed random states (``concrete.states``) and the edges of the machine
dimensions made from them.

* ``placed``: states where every access of the original lands in the arena; at CPL 0 (a kernel site)
  RFLAGS.IF is set in half of them, the other half run with interrupts off.
* ``non_canonical``: one state per register that forms an address of the original (base, index, rsp
  for an implicit stack access), with that register moved by 2**62 (divided by its scale): the address is
  non-canonical, and which register made it decides #SS or #GP.
* ``with_ac`` and ``misaligned``: RFLAGS.AC set (a user process may set it; Linux sets CR0.AM), the
  original's first access moved 1 to 7 bytes off its alignment.
* ``popped_tf``: TF set in the qword at RSP, which a popf there pops.
* ``other_residue``: RSP (and RBP, which leave moves into it) moved by 8, so that the 16-byte alignment an
  interrupt frame starts at is the other one (a frame leaves the 8 bytes between RSP and the aligned
  boundary alone).
"""

from __future__ import annotations

import random

import iced_x86 as iced

from ..concrete import states as ST
from ..concrete.outcome import MachineState
from ..x86.registers import GPR64, MASK64
from .machine_trace import AC, IF

KERNEL_HALF = 0xFFFF_8000_0000_0000
_INFO = iced.InstructionInfoFactory()
_GPR_OF = {getattr(iced.Register, n.upper()): n for n in GPR64}


def kernel(at: int) -> bool:
    """Code at ``at`` runs at CPL 0 (an upper-half canonical address)."""
    return at >= KERNEL_HALF


def placed(orig: bytes, at: int, n: int, rng: random.Random) -> list[MachineState]:
    out: list[MachineState] = []
    for _ in range(n * 4):
        if len(out) == n:
            break
        s = ST.place(orig, at, ST.random_registers(rng, vector_state=False), rng)
        if s is None:
            continue
        if kernel(at) and len(out) % 2 == 0:
            s = MachineState(s.registers | {"rflags": s.registers.get("rflags", 2) | IF}, s.memory)
        out.append(_loadable_ss(orig, at, s))
    return out


def _loadable_ss(orig: bytes, at: int, state: MachineState) -> MachineState:
    """A mov to SS loads a null selector (CPL 0 may, in 64-bit mode): any other would need descriptors."""
    ins = iced.Decoder(64, orig, ip=at).decode()
    if ins.mnemonic == iced.Mnemonic.MOV and ins.op0_kind == iced.OpKind.REGISTER and ins.op0_register == \
            iced.Register.SS and ins.op1_kind == iced.OpKind.REGISTER:
        name = _GPR_OF.get(iced.RegisterExt.full_register(ins.op1_register))
        if name:
            return MachineState(state.registers | {name: 0}, state.memory)
    return state


def _registers_of(orig: bytes, at: int) -> list[tuple[str, int]]:
    """(register, scale) of each register that forms an address of ``orig``'s accesses."""
    ins = iced.Decoder(64, orig, ip=at).decode()
    out = []
    for m in _INFO.info(ins).used_memory():
        if m.access == iced.OpAccess.NO_MEM_ACCESS or m.base == iced.Register.RIP:
            continue
        for reg, scale in ((m.base, 1), (m.index, m.scale)):
            name = _GPR_OF.get(iced.RegisterExt.full_register(reg))
            if name and iced.RegisterExt.size(reg) == 8 and (name, scale) not in out:
                out.append((name, scale))
    return out


def non_canonical(orig: bytes, at: int, state: MachineState) -> list[MachineState]:
    out = []
    for name, scale in _registers_of(orig, at):
        regs = dict(state.registers)
        regs[name] = (regs.get(name, 0) + (1 << 62) // scale) & MASK64
        out.append(MachineState(regs, state.memory))
    return out


def with_ac(state: MachineState) -> MachineState:
    """RFLAGS.AC set, and RSP 8-aligned as the ABI keeps it (a random RSP the original never uses would
    make a relocation's push raise #AC only because the state is one no process has)."""
    regs = state.registers
    return MachineState(regs | {"rflags": regs.get("rflags", 2) | AC, "rsp": regs.get("rsp", 0) & ~7}, state.memory)


def misaligned(orig: bytes, at: int, state: MachineState, rng: random.Random) -> MachineState | None:
    """``state`` with the base of the original's first access moved 1 to 7 bytes (the placed bytes around
    it, ``concrete.states.MARGIN``, keep the access inside them)."""
    regs = _registers_of(orig, at)
    if not regs:
        return None
    name = regs[0][0]
    moved = dict(state.registers)
    moved[name] = (moved.get(name, 0) + rng.randrange(1, 8)) & MASK64
    return MachineState(moved, state.memory)


def popped_tf(state: MachineState) -> MachineState:
    rsp = state.registers.get("rsp", 0)
    memory = dict(state.memory)
    memory[(rsp + 1) & MASK64] = memory.get((rsp + 1) & MASK64, 0) | 0x01  # bit 8 of the popped qword
    return MachineState(state.registers, memory)


def other_residue(state: MachineState) -> MachineState:
    regs = state.registers
    return MachineState(regs | {"rsp": regs.get("rsp", 0) ^ 8, "rbp": regs.get("rbp", 0) ^ 8}, state.memory)

"""A checker's counterexample replayed on this machine's CPU, where unicorn could not decide it.

``replay_on_cpu(orig, at, tramp, state, reloc=..., effects=..., tracer_memory=...)`` runs the original
instruction on the CPU (``concrete.cpu``, the judge: the whole user-visible state in and out, ymm
included) from the counterexample's inputs, and the tracer's side either on the CPU too (``reloc``:
bytes that run from T, with the original's first byte an int3 as under a probe) or through the
effects interpreter (``effects``: an emulation, ``concrete.effect_machine``), and compares what the
CPU can see (``CpuReplay``).  Used by the tracer audit (``tracers.judge.replay_unconfirmed``) for
the counterexamples unicorn cannot run (VEX.256 ``vpcmpeqb``: "unicorn did not confirm").

What a replay here assumes, beyond ``concrete.cpu``'s model:

* **User mode.**  An instruction is replayed only when user mode runs its semantics
  (``unsafe``: the rows of ``native.REFUSED`` that are about the instruction, not about the old
  harness: privileged, kernel entry, far transfers, segment registers, system reads, nondeterministic
  results, indirect transfers (no pad at a data-dependent target)); the others need the guest.
* **Moved into user space.**  Kernel addresses cannot be mapped here.  The code moves by one shift
  ``K`` (A and T keep their distance and page offsets, so rel32 and RIP-relative displacements
  stay right); each base register of the original's memory accesses moves by its own shift, with
  the counterexample's bytes around the access moved alike (page offsets kept, so alignment is
  kept).  A replay is refused when a shift could change the result: an original whose outputs
  are its own address (a call's pushed return address, a RIP-relative ``lea``), a base register
  that is also an input to the computation besides addressing, an access with no base register
  (absolute, or index only), or tracer code holding absolute addresses (a ``movabs`` of A+len).
  The note says every shift made.
* **z3's state first.**  When it shows no difference (z3's model can rest on a detail the CPU does not
  share, such as a zmm upper half this CPU does not have), ``OWN_STATES`` states of the judge's own
  (``concrete.states``: random and edge registers and vectors, every access placed in its arena,
  seed 0) are tried, for an original without a RIP-relative operand; a difference there is
  reported with its state.  Only a difference is a conclusion: no difference is not a proof.
* **What is compared**: the exit (moved back by ``K``), a fault (one side only, or another signal),
  the 16 GPRs, RFLAGS (CF PF AF ZF SF OF DF), MXCSR, the vector registers this CPU has
  (``cpu.state_names``: zmm0-15 at ``vector_bits``, more with AVX-512), the x87 words, and the
  bytes written outside tracer memory.  An emulation leaves vector, x87 and MXCSR state as it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import iced_x86 as iced

from ..plan import effects as fx
from ..x86.decode import decode
from ..x86.instruction import Instruction
from ..x86.registers import GPR64, MASK64
from . import cpu, native
from . import states as ST
from .effect_machine import run_effects
from .outcome import RFLAGS_COMPARED, Difference, MachineState, Outcome

CODE_BASE = 0x1000_0000_0000  # where the code's lower page goes (16 TiB: nothing of the host's there)
DATA_BASE = 0x2000_0000_0000  # where the accesses of each moved base register go, 1 MiB apart
DATA_STRIDE = 0x10_0000
USER_END = 0x7FFF_FFFF_0000
OWN_STATES = 8  # states of the judge's own (``concrete.states``, seed 0) tried when z3's shows no difference
MOVED_BYTES = 0x800  # the counterexample's bytes this far either side of an access move with it
#: native.REFUSED rows about the instruction itself (the rest are about its old xmm-only harness and arena).
UNSAFE_ROWS = ("privileged", "control register", "kernel entry", "far transfer", "indirect transfer",
               "fs/gs override", "segment register", "system read", "nondeterministic")
_COMPARED = GPR64 + ("mxcsr", "fcw", "fsw", "ftw") + tuple(f"st{i}" for i in range(8)) + \
    tuple(f"zmm{i}" for i in range(32)) + tuple(f"k{i}" for i in range(8))
_INFO = iced.InstructionInfoFactory()


@dataclass(frozen=True)
class CpuReplay:
    """One replay: ``status`` 'differs' (the CPU confirms), 'same' (the CPU saw no difference), 'guest'
    (user mode cannot run the instruction: it needs the confirm guest) or 'not-run' (why, in ``note``)."""

    status: str
    note: str
    differences: tuple[Difference, ...] = ()
    cpu: str = ""  # the judge's identity (``cpu.identity().describe()``)
    state: MachineState | None = None  # the differing state when it is not z3's (the judge's own, placed)

    @property
    def confirmed(self) -> bool:
        return self.status == "differs"


def unsafe(decoded: Instruction) -> str | None:
    """Why user mode cannot run ``decoded``'s semantics here ('<class>: <reason>'), or None."""
    facts = native.Facts(decoded, iced.Decoder(64, decoded.raw, ip=native.NATIVE_AT).decode())
    row = next((r for r in native.REFUSED if r.name in UNSAFE_ROWS and r.matches(facts)), None)
    return None if row is None else f"{row.name}: {row.reason}"


def replay_on_cpu(orig: bytes, at: int, tramp: int, state: MachineState, reloc: bytes | None = None,
                  effects: tuple[fx.Effect, ...] | None = None,
                  tracer_memory: tuple[tuple[int, int], ...] = ()) -> CpuReplay:
    """See the module doc.  Exactly one of ``reloc`` and ``effects``."""
    if (reloc is None) == (effects is None):
        raise ValueError("replay_on_cpu needs exactly one of reloc and effects")
    decoded = decode(orig, at)
    if not isinstance(decoded, Instruction):
        return CpuReplay("not-run", f"the original does not decode: {decoded.reason}")
    why = unsafe(decoded)
    if why is not None:
        return CpuReplay("guest", f"not user-mode safe ({why}): needs the guest")
    moved = _move(decoded, at, tramp, state, reloc, tracer_memory)
    if isinstance(moved, str):
        return CpuReplay("not-run", moved)
    k, regs, memory, data, rip_pages, note = moved
    judge = cpu.identity().describe()
    try:
        diffs = _judge(orig, at, tramp, k, MachineState(regs, memory), data, rip_pages, reloc, effects, tracer_memory)
        if isinstance(diffs, str):
            return CpuReplay("not-run", f"not runnable on this CPU: {diffs}")
        if diffs:
            return CpuReplay("differs", f"z3's state, {note}", tuple(diffs), judge)
        if decoded.rip_relative:
            return CpuReplay("same", f"z3's state, {note}", (), judge)
        rng = random.Random(0)
        for n in range(OWN_STATES):
            placed = ST.place(orig, (at - k) & MASK64, ST.random_registers(rng), rng)
            if placed is None:
                continue
            placed = cpu.trim_state(placed)
            own = _judge(orig, at, tramp, k, placed, ((ST.ARENA, ST.ARENA_SIZE),) + _tracer_data(tracer_memory, k),
                         frozenset(), reloc, effects, tracer_memory)
            if own and not isinstance(own, str):
                return CpuReplay("differs", f"not on z3's state ({note}), but on the judge's own state {n + 1} "
                                 f"of {OWN_STATES} (seed 0)", tuple(own), judge, placed)
    except (RuntimeError, OSError) as exc:
        return CpuReplay("not-run", f"the CPU judge could not run it: {exc}")
    return CpuReplay("same", f"z3's state ({note}) and {OWN_STATES} states of the judge's own", (), judge)


def _judge(orig: bytes, at: int, tramp: int, k: int, state: MachineState, data, rip_pages, reloc, effects,
           tracer_memory) -> list[Difference] | str:
    """Both sides on ``state`` (at A - K, T - K): their differences, or why the programs cannot run here."""
    decoded = decode(orig, at)
    exits = _exits(decoded, at - k)
    orig_p = cpu.Program(((at - k, orig),), at - k, exits, data)
    reloc_p = None
    if reloc is not None:
        t = tramp - k
        reloc_p = cpu.Program(((t, reloc), (at - k, b"\xcc" + orig[1:])), t,
                              tuple(e for e in exits if not t <= e < t + len(reloc)), data)
    try:
        for p in (orig_p, reloc_p):
            if p is not None:
                p.check()
    except ValueError as exc:
        return str(exc)
    o = cpu.run_on_cpu(orig_p, [state])[0]
    if reloc_p is not None:
        r = cpu.run_on_cpu(reloc_p, [state])[0]
        moved_tracer = tuple(((a - k) & MASK64, n) for a, n in tracer_memory) + ((tramp - k, len(reloc)),)
        return compare(o, r, moved_tracer, k)
    return compare(o, _emulated(effects, at, state, k, rip_pages), tuple(tracer_memory), k)


# ---------------------------------------------------------------------------
# Moving a counterexample into user space
# ---------------------------------------------------------------------------


def _user(a: int) -> bool:
    return 0x10000 <= a < USER_END


def _move(decoded: Instruction, at: int, tramp: int, state: MachineState, reloc: bytes | None, tracer_memory):
    """(K, registers, memory, data ranges, the RIP-relative data pages, note) or why the state cannot move."""
    lo, hi = min(at, tramp), max(at, tramp) + 64
    k = (lo & ~0xFFF) - CODE_BASE if not (_user(lo) and _user(hi)) else 0
    if hi - lo >= 1 << 40:
        return f"A and T are {hi - lo:#x} apart: too far to move together into user space"
    ins = iced.Decoder(64, decoded.raw, ip=(at - k) & MASK64).decode()
    if k and (ins.flow_control in (iced.FlowControl.CALL,) or
              ins.mnemonic == iced.Mnemonic.LEA and ins.is_ip_rel_memory_operand):
        return "its output is its own address (a call's return address, a RIP-relative lea): it cannot move"
    if reloc is not None and k and _absolute(reloc, lo, hi):
        return "the tracer's code holds an absolute address of A or T: it cannot move into user space"
    regs = _registers(state)
    memory = {a & MASK64: b & 0xFF for a, b in state.memory.items()}
    info = _INFO.info(ins)
    accesses = [m for m in info.used_memory() if m.access != iced.OpAccess.NO_MEM_ACCESS]
    shifts: dict[str, int] = {}
    spans: list[tuple[int, int]] = []
    rip_pages: set[int] = set()
    moved_memory = dict(memory)
    values = _value_inputs(ins)
    for m in accesses:
        size = max(iced.MemorySizeExt.size(m.memory_size), 1)
        if m.base == iced.Register.RIP or (ins.is_ip_rel_memory_operand and m.base == iced.Register.NONE
                                           and m.index == iced.Register.NONE
                                           and m.displacement == ins.ip_rel_memory_address):
            a = m.displacement & MASK64  # iced gives the RIP-relative target, here already at A - K
            spans.append((a, size))
            rip_pages.update(range(a & ~0xFFF, a + size, 0x1000))
            for off in range(-MOVED_BYTES, size + MOVED_BYTES):
                old = (a + k + off) & MASK64
                if old in memory:
                    moved_memory[(a + off) & MASK64] = memory[old]
            continue
        base = _family(m.base)
        if base is None:
            return "a memory access without a base register (absolute or index only): it cannot move"
        if base in values:
            return f"%{base} is an address and a value: moving it would change the result"
        old = _address(m, regs)
        if base not in shifts:
            target = DATA_BASE + DATA_STRIDE * len(shifts) + (old & 0xFFF)
            shifts[base] = (old - target) & MASK64
        new = (old - shifts[base]) & MASK64
        spans.append((new, size))
        for off in range(-MOVED_BYTES, size + MOVED_BYTES):
            if (old + off) & MASK64 in memory:
                moved_memory[(new + off) & MASK64] = memory[(old + off) & MASK64]
    for base, d in shifts.items():
        regs[base] = (regs[base] - d) & MASK64
    data = [(a & ~0xFFF, ((a + n + 0xFFF) & ~0xFFF) - (a & ~0xFFF)) for a, n in spans]
    data += list(_tracer_data(tracer_memory, k))
    if any(not _user(a) for a, _ in data):
        return "a memory access stays outside user space after the move"
    note = ", ".join([f"code moved by {-k & MASK64:#x} (A at {(at - k) & MASK64:#x})"] if k else []) or "code in place"
    if shifts:
        note += "; " + ", ".join(f"%{b} moved by {-d & MASK64:#x}" for b, d in shifts.items())
    return k, regs, moved_memory, tuple(sorted(set(data))), frozenset(rip_pages), note


def _tracer_data(tracer_memory, k: int) -> tuple[tuple[int, int], ...]:
    """The pages of the tracer's own memory (save slots), moved by ``K`` with the code."""
    out = []
    for a, n in tracer_memory:
        if n <= 0x10000:
            lo = ((a - k) & MASK64) & ~0xFFF
            out.append((lo, ((((a - k) & MASK64) + n + 0xFFF) & ~0xFFF) - lo))
    return tuple(out)


def _absolute(code: bytes, lo: int, hi: int) -> bool:
    """Does ``code`` hold an immediate, or an absolute address, within 4 GiB of [lo, hi)?"""
    for ins in iced.Decoder(64, code, ip=0):
        if ins.code == iced.Code.INVALID:
            return False
        for i in range(ins.op_count):
            kind = ins.op_kind(i)
            if kind in (iced.OpKind.IMMEDIATE64, iced.OpKind.IMMEDIATE32TO64, iced.OpKind.IMMEDIATE32):
                v = ins.immediate(i) & MASK64
                if lo - (1 << 32) <= v < hi + (1 << 32) or lo - (1 << 32) <= (v | ~MASK64) < hi:
                    return True
            if kind == iced.OpKind.MEMORY and ins.memory_base == iced.Register.NONE \
                    and ins.memory_index == iced.Register.NONE:
                return True
    return False


def _value_inputs(ins: iced.Instruction) -> set[str]:
    """The GPR families ``ins`` reads as register operands (not as addresses)."""
    out = set()
    for i in range(ins.op_count):
        if ins.op_kind(i) == iced.OpKind.REGISTER:
            f = _family(ins.op_register(i))
            if f:
                out.add(f)
    if ins.mnemonic in (iced.Mnemonic.PUSH,) and ins.op_count and ins.op0_kind == iced.OpKind.REGISTER:
        out.add(_family(ins.op0_register))
    return out - {None}


_GPR_INDEX = {getattr(iced.Register, n.upper()): n for n in GPR64}


def _family(reg: int) -> str | None:
    if reg == iced.Register.NONE or not iced.RegisterExt.is_gpr(reg):
        return None
    return _GPR_INDEX.get(iced.RegisterExt.full_register(reg))


def _address(m, regs: dict[str, int]) -> int:
    base, index = _family(m.base), _family(m.index)
    value = m.displacement + (regs.get(base, 0) if base else 0) + (regs.get(index, 0) * m.scale if index else 0)
    return value & (MASK64 if m.address_size != iced.CodeSize.CODE32 else 0xFFFFFFFF)


def _registers(state: MachineState) -> dict[str, int]:
    """The counterexample's registers under the judge's names: ymmN/xmmN as zmmN (the widest name wins),
    the rest as they are; cut to what this CPU loads (``cpu.trim_state``)."""
    regs: dict[str, int] = {n: 0 for n in GPR64}
    regs["rflags"] = 0x2
    for name, value in state.registers.items():
        if name in GPR64 or name in ("rflags", "mxcsr", "fcw", "fsw", "ftw", "fs_base", "gs_base") \
                or name.startswith(("st", "k")) and name[1:].isdigit():
            regs[name] = value
    for i in range(32):
        if any(f"{p}mm{i}" in state.registers for p in "xyz"):
            regs[f"zmm{i}"] = cpu.vector(state.registers, i)
    return cpu.trim_state(MachineState(regs, {})).registers


def _exits(decoded: Instruction, at: int) -> tuple[int, ...]:
    ins = iced.Decoder(64, decoded.raw, ip=at).decode()
    exits = {at + ins.len}
    if ins.op_count and ins.op0_kind in (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32,
                                         iced.OpKind.NEAR_BRANCH64):
        exits.add(ins.near_branch_target)
    return tuple(sorted(exits))


def _emulated(effects, at: int, state: MachineState, k: int, rip_pages) -> Outcome:
    """The emulation's outcome on the moved state.  Its constants are A's (a RIP-relative operand is
    resolved to an absolute address at A): the bytes of the moved RIP-relative pages are also given at
    A's addresses, its writes there and its exit are moved by ``K`` like the CPU's; every vector, x87
    and MXCSR register is as it came in."""
    memory = dict(state.memory)
    for page in rip_pages:
        for a in range(page, page + 0x1000):
            if a in state.memory:
                memory[(a + k) & MASK64] = state.memory[a]
    out = run_effects(tuple(effects), at, MachineState(state.registers, memory))
    regs = dict(state.registers)
    regs.update({n: out.registers[n] for n in GPR64 + ("rflags",)})
    writes = {}
    for a, v in out.writes.items():
        back = (a - k) & MASK64
        writes[back if back & ~0xFFF in rip_pages else a] = v
    return Outcome(regs, (out.next_rip - k) & MASK64, writes, out.fault)


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------


def compare(o: Outcome, r: Outcome, tracer_memory, k: int = 0) -> list[Difference]:
    """What the CPU's run of the original (``o``) and the tracer's side (``r``) show differently; exits are
    reported at A's addresses (``K`` added back)."""
    if o.fault or r.fault:
        return [] if o.fault == r.fault else [Difference("fault", o.fault or "none", r.fault or "none")]
    out = []
    if o.next_rip != r.next_rip:
        out.append(Difference("rip", f"{(o.next_rip + k) & MASK64:#x}", f"{(r.next_rip + k) & MASK64:#x}"))
    fo, fr = o.registers.get("rflags", 0) & RFLAGS_COMPARED, r.registers.get("rflags", 0) & RFLAGS_COMPARED
    if fo != fr:
        out.append(Difference("rflags", f"{fo:#x}", f"{fr:#x}"))
    for name in _COMPARED:
        a, b = o.registers.get(name), r.registers.get(name)
        if a is not None and b is not None and a != b:
            out.append(Difference(name, f"{a:#x}", f"{b:#x}"))
    inside = lambda a: any(lo <= a < lo + n for lo, n in tracer_memory)  # noqa: E731
    wo = {a: v for a, v in o.writes.items() if not inside(a)}
    wr = {a: v for a, v in r.writes.items() if not inside(a)}
    for a in sorted(set(wo) | set(wr)):
        if wo.get(a) != wr.get(a):
            show = lambda w: f"{w[a]:02x}" if a in w else "not written"  # noqa: E731
            out.append(Difference(f"mem[{a:#x}]", show(wo), show(wr)))
            break
    return out

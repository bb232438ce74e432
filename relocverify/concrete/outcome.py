"""Concrete machine states, outcomes, and the differences between two outcomes."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..inputs import memory_range, parse_int
from ..x86.registers import GPR64, MASK64

GPRS = GPR64
XMMS = tuple(f"xmm{i}" for i in range(16))
REGISTERS = GPRS + ("rflags", "fs_base", "gs_base", "mxcsr") + XMMS
REGISTER_BITS = {**{r: 64 for r in GPRS + ("rflags", "fs_base", "gs_base")}, "mxcsr": 32, **{x: 128 for x in XMMS}}
MXCSR_DEFAULT = 0x1F80  # all exceptions masked, round to nearest (the value at reset)
# Other names a counterexample may use (VEX calls the vector registers ymm0..): the low 128 bits of ymmN are xmmN.
REGISTER_ALIASES = {**{f"ymm{i}": f"xmm{i}" for i in range(16)}, "fs": "fs_base", "gs": "gs_base"}

CF, PF, AF, ZF, SF, DF, OF = 1 << 0, 1 << 2, 1 << 4, 1 << 6, 1 << 7, 1 << 10, 1 << 11
RFLAGS_COMPARED = CF | PF | AF | ZF | SF | OF | DF
RFLAGS_FIXED = 1 << 1  # reads as 1 on every x86


@dataclass(frozen=True)
class Difference:
    """One output that differs: its name ('rax', 'rflags', 'rip', 'mem[0x...]', 'fault', ...) and both values."""

    what: str
    original: str
    relocated: str


@dataclass(frozen=True)
class MachineState:
    """Concrete inputs.  Registers not named are 0 (rflags: only bit 1 set).

    ``registers`` may also hold names the replay does not model (see
    ``initial_registers``): a counterexample names every register of its model.
    """

    registers: dict[str, int]
    memory: dict[int, int]  # byte address -> byte; every other byte reads as 0


@dataclass(frozen=True)
class Outcome:
    """Concrete outputs of one side."""

    registers: dict[str, int]
    next_rip: int
    writes: dict[int, int]  # byte address -> final value, tracer memory excluded
    fault: str | None = None



def unmodelled_registers(state: MachineState) -> tuple[str, ...]:
    """The input registers a replay ignores (x87 state, VEX guest offsets, ...), by name."""
    return tuple(sorted(n for n in state.registers if n not in REGISTER_BITS and n not in REGISTER_ALIASES))


def initial_registers(state: MachineState) -> dict[str, int]:
    """The modelled input registers; unnamed ones are 0, rflags has bit 1 set.

    ymmN gives its low 128 bits to xmmN (an explicit xmmN wins).  Names in
    ``unmodelled_registers`` are ignored.  That is safe for confirming a
    counterexample: any difference the replay shows is still a difference on
    a concrete state; a counterexample that depends on an ignored register
    just may not replay.
    """
    regs = {r: 0 for r in REGISTERS}
    regs["rflags"] = RFLAGS_FIXED
    regs["mxcsr"] = MXCSR_DEFAULT
    named = sorted(state.registers.items(), key=lambda kv: kv[0] in REGISTER_BITS)  # aliases first
    for name, value in named:
        name = REGISTER_ALIASES.get(name, name)
        if name in REGISTER_BITS:
            regs[name] = value & ((1 << REGISTER_BITS[name]) - 1)
    return regs


def with_code(state: MachineState, at: int, code: bytes) -> MachineState:
    """``state`` with ``code`` laid over its memory at ``at``."""
    memory = dict(state.memory)
    memory.update({(at + i) & MASK64: b for i, b in enumerate(code)})
    return MachineState(dict(state.registers), memory)



def register_bits(name: str) -> int | None:
    """The width of a register a state may name: the ones the replay models, their aliases, and the
    VEX guest registers a checker's counterexample names (kept, and reported as not modelled);
    None for a name that is none of these."""
    if name in REGISTER_BITS:
        return REGISTER_BITS[name]
    if name in REGISTER_ALIASES:
        return 256 if name.startswith("ymm") else 64
    from archinfo import ArchAMD64  # the VEX guest state's register names (no angr import)

    for reg in ArchAMD64().register_list:
        if reg.name == name:
            return reg.size * 8
    if name.startswith("guest_") and name[6:].isdigit():
        return 8
    return None


def state_from_json(doc: object) -> MachineState:
    """{"registers": {"rax": "0x..", ...}, "memory": {"0xaddr": "ab", ...}} -> MachineState.

    A memory value of several bytes ("abcd") fills consecutive addresses.
    Register names the replay does not model are kept (a counterexample
    names every register of its model) and listed by ``unmodelled_registers``.
    """
    if not isinstance(doc, dict) or not set(doc) <= {"registers", "memory"} \
            or not all(isinstance(doc.get(k) or {}, dict) for k in ("registers", "memory")):
        raise InputError('the state must be a JSON object {"registers": {...}, "memory": {...}}')
    registers = {}
    for name, value in (doc.get("registers") or {}).items():
        bits = register_bits(name)
        if bits is None:
            raise InputError(f"{name!r} is not a register name; the replay models rax..r15, rflags, fs_base, "
                             f"gs_base, xmm0..xmm15 (ymmN: its low half)")
        v = parse_int(value, f"register {name}")
        if not 0 <= v < 1 << bits:
            raise InputError(f"register {name} is {bits} bits wide; {value!r} does not fit")
        registers[name] = v
    memory = {}
    for addr, data in (doc.get("memory") or {}).items():
        base = parse_int(addr, "a memory address")
        try:
            raw = bytes.fromhex(data) if isinstance(data, str) else bytes([data])
        except (ValueError, TypeError):
            raise InputError(f"memory at {addr} must be hex bytes like 'ab', not {data!r}") from None
        if not raw:
            continue
        memory_range((base, len(raw)), f"the memory block at {addr}")  # canonical, not wrapping past 2^64
        memory.update({base + i: b for i, b in enumerate(raw)})
    return MachineState(registers, memory)

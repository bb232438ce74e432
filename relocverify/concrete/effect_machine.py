"""The effect language (``plan.effects``), concretely: an emulate plan run on a
register file and a byte map, in plain Python, as a probe handler would."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..plan import effects as fx
from ..x86.registers import MASK64
from .outcome import CF, GPRS, OF, PF, SF, ZF, MachineState, Outcome, initial_registers



class _EffectFault(Exception):
    """Internal: an effect program that cannot run; becomes ``Outcome.fault``."""


@dataclass
class EffectMachine:
    """The one interpreter of the effects language: registers and a byte map in, the writes and the
    next rip out.  Replay (``run_effects``) and the probe runtime's emulation both run it."""
    regs: dict[str, int]
    memory: dict[int, int]
    writes: dict[int, int] = field(default_factory=dict)
    temps: dict[str, int] = field(default_factory=dict)

    def read(self, addr: int, size: int) -> int:
        data = [self.writes.get(a, self.memory.get(a, 0)) for a in ((addr + i) & MASK64 for i in range(size))]
        return int.from_bytes(bytes(data), "little")

    def write(self, addr: int, value: int, size: int) -> None:
        for i, b in enumerate((value & ((1 << 8 * size) - 1)).to_bytes(size, "little")):
            self.writes[(addr + i) & MASK64] = b

    def register(self, name: str) -> int:
        if name not in GPRS:
            raise _EffectFault(f"effect reads %{name}, which is not a 64-bit GPR")
        return self.regs[name]

    def address(self, a: fx.Address) -> int:
        ea = (self.register(a.base) if a.base else 0) + (self.register(a.index) * a.scale if a.index else 0)
        ea = (ea + a.disp) & (MASK64 if a.address_size == 64 else 0xFFFFFFFF)
        seg = self.regs[f"{a.segment}_base"] if a.segment in ("fs", "gs") else 0
        return (ea + seg) & MASK64

    def value(self, v: fx.Value) -> int:
        if isinstance(v, fx.Const):
            return v.value & MASK64
        if isinstance(v, fx.Reg):
            return self.register(v.name)
        if isinstance(v, fx.Temp):
            if v.name not in self.temps:
                raise _EffectFault(f"effect reads {v.name} before it is set")
            return self.temps[v.name]
        return self.read(self.address(v.address), v.size)

    def flag_bits(self) -> tuple[int, int, int, int, int]:
        f = self.regs["rflags"]
        return tuple(int(bool(f & bit)) for bit in (CF, PF, ZF, SF, OF))

    def step(self, e: fx.Effect) -> int | None:
        """Perform one effect; the next rip if it was the final Jump or Branch."""
        if isinstance(e, fx.Let):
            self.temps[e.name] = self.value(e.value)
        elif isinstance(e, fx.Push):
            value = self.value(e.value)  # read before rsp moves: push (%rsp) pushes the old top
            self.regs["rsp"] = (self.regs["rsp"] - 8) & MASK64
            self.write(self.regs["rsp"], value, 8)
        elif isinstance(e, fx.AddRsp):
            self.regs["rsp"] = (self.regs["rsp"] + e.delta) & MASK64
        elif isinstance(e, fx.Jump):
            return self.value(e.to)
        elif isinstance(e, fx.Branch):
            if e.cond not in fx.CONDITIONS:
                raise _EffectFault(f"unknown condition {e.cond!r}")
            return (e.taken if fx.CONDITIONS[e.cond].test(*self.flag_bits()) else e.fallthrough) & MASK64
        else:
            raise _EffectFault(f"not an effect: {e!r}")
        return None


def run_effects(effects: tuple[fx.Effect, ...], at: int, state: MachineState) -> Outcome:
    """Interpret an emulate plan's effect program on ``state``.

    The program must end in its only Jump or Branch; otherwise the outcome
    is a fault.  ``at`` is the probed address: a program that ends without
    a jump leaves rip there.
    """
    m = EffectMachine(initial_registers(state), {a & MASK64: b & 0xFF for a, b in state.memory.items()})
    next_rip, fault = at & MASK64, None
    try:
        ends = [i for i, e in enumerate(effects) if isinstance(e, (fx.Jump, fx.Branch))]
        if ends != [len(effects) - 1]:
            raise _EffectFault("the effect program does not end in exactly one jump or branch")
        for e in effects:
            result = m.step(e)
            next_rip = next_rip if result is None else result
    except _EffectFault as e:
        fault = str(e)
    return Outcome(m.regs, next_rip, dict(sorted(m.writes.items())), fault)

"""Symbolic semantics: VEX IR (pyvex) interpreted over claripy bit-vectors.

This is the checker's trust base.  What it models, and what it does not:

* Instruction semantics are VEX's: pyvex 9.2 lifts the bytes, and each IR
  operation is evaluated with angr's claripy implementation of that operation
  (``angr.engines.vex.claripy.irop``); the VEX clean helpers that compute
  RFLAGS from the lazy flags thunk are angr's (``...claripy.ccall``).
  A clean helper angr does not implement is modelled as an uninterpreted
  (but functional) function: equal arguments give equal results.
* Registers: every guest register byte starts as a fresh symbol, shared by
  the two executions being compared, except rip (the start address of each
  side) and the flags thunk, which starts as CC_OP_COPY of a symbolic RFLAGS
  (every hardware RFLAGS value has exactly this representation).  DF, ID
  and AC start as symbolic bits.
* Memory: all 2^64 bytes are symbolic.  No address is ever concretised.
  Initial memory is a function from address to byte, encoded without
  arrays by Ackermann's reduction: each distinct address expression read
  gets a fresh byte, with ``a_i == a_j -> m_i == m_j`` for every pair.  A
  store appends (address, byte) to a write log; a read walks the log
  newest-first as an if-then-else chain.  The tracer's own code bytes
  (the trampoline) are known constants when read at a concrete address;
  a read at a symbolic address sees an unconstrained byte even there,
  which only adds behaviours, so it cannot make a false proof.
* Not modelled: faults and exceptions (an instruction is assumed to
  complete), other CPUs (atomicity is a separate obligation in proof.py),
  dirty helpers and unliftable instructions (these end the analysis as a
  ``Gap`` value, which proof.py turns into ``opaque`` or ``unknown``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import claripy
import pyvex
from angr.engines.vex.claripy import ccall as _ccall
from angr.engines.vex.claripy.irop import vexop_to_simop

from ..plan.effects import AddRsp, Branch, Const, Jump, Let, Load, Push, Reg, Temp, condition_test
from ..x86.registers import MASK64
from .forms import InsnFacts, facts
from .lift import (ARCH, FAULT_CODES, FAULT_JUMPKINDS, FLAG_THUNK, G_CC_OP_COPY, NORMAL_JUMPKINDS,
                   OSZACP, REG_BY_NAME, ZMM_HI, REG_OF_BYTE, Gap, lift)

# angr's IR operations log a warning when a rounding mode is symbolic ("using default"): the
# checker already treats every floating-point result as loose (``lifter_checks``), so the line
# says nothing the verdict does not, and it would land in the middle of a command's output.
logging.getLogger("angr.engines.vex.claripy.irop").setLevel(logging.ERROR)

@dataclass(frozen=True)
class Read:
    guard: object  # claripy Bool
    address: object  # BV64
    size: int


@dataclass(frozen=True)
class Event:
    """One memory event, in program order: a read ('R') or a write ('W') of ``size`` bytes at
    ``address`` (a write with its ``value``), or a fence ('F', ``kind`` mfence/lfence/sfence/...).
    A write keeps the width of the store that made it: two 4-byte stores are not one 8-byte store."""

    kind: str
    guard: object  # claripy Bool: the event happens (a guarded store's or load's own condition)
    address: object = None
    size: int = 0
    value: object = None
    fence: str = ""


@dataclass(frozen=True)
class Boundary:
    """The instruction boundary before the instruction at ``address``: the stack pointer there, and how
    many memory events came before it (``events[:before]``).  An interrupt at CPL 0 can arrive at any
    boundary and push its frame below ``rsp`` (``machine_model``, row interrupt-frame)."""

    address: int
    rsp: object  # BV64
    before: int


@dataclass(frozen=True)
class WayOut:
    """One way out of a piece of code: the state when control left it."""

    guard: object  # claripy Bool: the inputs that take this way out
    regs: dict  # byte offset -> BV8 written
    writes: tuple  # ((address BV64, byte BV8), ...) oldest first
    reads: tuple[Read, ...]
    target: object  # BV64: where control goes (already mapped T -> A for the relocated side)
    jumpkind: str
    events: tuple = ()  # Event, in program order
    fault: object = None  # BV8: FAULT_CODES of the first fault on the way, 0 for none
    insns: tuple = ()  # addresses of the instructions executed on the way, in order
    boundaries: tuple = ()  # Boundary before each instruction executed, in order

    @property
    def fences(self) -> tuple[str, ...]:
        return tuple(e.fence for e in self.events if e.kind == "F")


@dataclass
class IRPath:
    guard: object
    regs: dict = field(default_factory=dict)
    writes: list = field(default_factory=list)
    reads: list = field(default_factory=list)
    temps: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    faults: list = field(default_factory=list)  # (condition, code), in program order
    insns: list = field(default_factory=list)
    facts: InsnFacts | None = None  # the instruction being interpreted
    boundaries: list = field(default_factory=list)  # Boundary, one per instruction started

    def fork(self, guard) -> "IRPath":
        return IRPath(guard, dict(self.regs), list(self.writes), list(self.reads), dict(self.temps),
                     list(self.events), list(self.faults), list(self.insns), self.facts, list(self.boundaries))


class _CCallState:
    """What angr's ccall functions read from their ``state`` argument: only its options."""

    options = frozenset()
    arch = ARCH


class World:
    """The shared initial state of both executions, and its constraints."""

    def __init__(self, tracer_bytes: dict[int, int] | None = None, tracer_ranges=()):
        self.tracer_bytes = tracer_bytes or {}
        self.tracer_ranges = tuple(tracer_ranges)
        self.reg_syms: dict[str, object] = {}
        self.mem_syms: dict[object, tuple[object, object]] = {}  # address AST -> (address, byte symbol)
        self.uf_results: list[tuple[str, tuple, object]] = []
        self.rflags = claripy.BVS("rflags", 64, explicit_name=True)
        # MXCSR.MM, AMD's misaligned-SSE mode: on, a legacy-SSE 16-byte access may be misaligned;
        # Intel has no such bit (it reads as 0).  Symbolic, so a proof covers both vendors.
        self.mm = claripy.BVS("mxcsr_mm", 1, explicit_name=True)
        self.df = claripy.BVS("df", 1, explicit_name=True)
        self.ac = claripy.BVS("ac", 1, explicit_name=True)
        self.idf = claripy.BVS("id", 1, explicit_name=True)
        self._serial = 0

    # -- registers -------------------------------------------------------
    def initial_register(self, name: str, start_pc: int):
        off, size = REG_BY_NAME[name]
        if name == "rip":
            return claripy.BVV(start_pc, 64)
        if name == "cc_op":
            return claripy.BVV(G_CC_OP_COPY, 64)
        if name == "cc_dep1":
            return self.rflags & OSZACP
        if name in ("cc_dep2", "cc_ndep"):
            return claripy.BVV(0, 64)
        if name == "d":
            return claripy.If(self.df == 1, claripy.BVV(MASK64, 64), claripy.BVV(1, 64))
        if name == "ac":
            return self.ac.zero_extend(63)
        if name == "id":
            return self.idf.zero_extend(63)
        sym = self.reg_syms.get(name)
        if sym is None:
            sym = self.reg_syms[name] = claripy.BVS(name, size * 8, explicit_name=True)
        return sym

    def initial_register_byte(self, offset: int, start_pc: int):
        info = REG_OF_BYTE.get(offset)
        if info is None:
            key = f"guest_{offset}"
            sym = self.reg_syms.get(key)
            if sym is None:
                sym = self.reg_syms[key] = claripy.BVS(key, 8, explicit_name=True)
            return sym
        name, base, size = info
        whole = self.initial_register(name, start_pc)
        k = offset - base
        return whole[k * 8 + 7:k * 8]

    # -- memory ----------------------------------------------------------
    def in_tracer(self, addr: int) -> bool:
        return any(lo <= addr < lo + n for lo, n in self.tracer_ranges)

    def initial_memory_byte(self, addr):
        if addr.op == "BVV":
            v = addr.args[0]
            if v in self.tracer_bytes:
                return claripy.BVV(self.tracer_bytes[v], 8)
        key = addr.hash()
        hit = self.mem_syms.get(key)
        if hit is None:
            self._serial += 1
            name = f"mem_{addr.args[0]:x}" if addr.op == "BVV" else f"mem_sym{self._serial}"
            hit = self.mem_syms[key] = (addr, claripy.BVS(name, 8, explicit_name=True))
        return hit[1]

    def constraints(self) -> list:
        """Ackermann constraints: initial memory and unknown helpers are functions."""
        cs = []
        items = list(self.mem_syms.values())
        for i in range(len(items)):
            ai, mi = items[i]
            for j in range(i + 1, len(items)):
                aj, mj = items[j]
                if ai.op == "BVV" and aj.op == "BVV":
                    continue  # distinct concrete addresses: nothing to say
                cs.append(claripy.Or(ai != aj, mi == mj))
        ufs = self.uf_results
        for i in range(len(ufs)):
            for j in range(i + 1, len(ufs)):
                if ufs[i][0] == ufs[j][0] and len(ufs[i][1]) == len(ufs[j][1]):
                    same = claripy.And(*[a == b for a, b in zip(ufs[i][1], ufs[j][1])]) if ufs[i][1] else claripy.true()
                    cs.append(claripy.Or(claripy.Not(same), ufs[i][2] == ufs[j][2]))
        return cs

    def uninterpreted(self, name: str, args: tuple, bits: int):
        self._serial += 1
        r = claripy.BVS(f"{name}_{self._serial}", bits, explicit_name=True)
        self.uf_results.append((name, args, r))
        return r


# ---------------------------------------------------------------------------
# Reading and writing through a path
# ---------------------------------------------------------------------------


def read_memory_byte(world: World, writes, addr):
    value = world.initial_memory_byte(addr)
    for waddr, wbyte in writes:
        if waddr.op == "BVV" and addr.op == "BVV":
            if waddr.args[0] == addr.args[0]:
                value = wbyte
            continue
        value = claripy.If(addr == waddr, wbyte, value)
    return value


def read_memory(world: World, writes, addr, size: int):
    parts = [read_memory_byte(world, writes, addr + k if k else addr) for k in range(size)]
    return claripy.Concat(*reversed(parts)) if size > 1 else parts[0]


def _store(path: IRPath, addr, value, guard=None):
    value = _to_bv(value)
    n = value.size() // 8
    for k in range(n):
        path.writes.append((addr + k if k else addr, value[k * 8 + 7:k * 8]))
    path.events.append(Event("W", guard if guard is not None else claripy.true(), addr, n, value))


def _read_event(path: IRPath, addr, size: int, guard=None):
    path.reads.append(Read(path.guard if guard is None else claripy.And(path.guard, guard), addr, size))
    path.events.append(Event("R", guard if guard is not None else claripy.true(), addr, size))


_DIVMOD = re.compile(r"Iop_DivMod([US])(\d+)to(\d+)")


def _divide_fault(op: str, args) -> object | None:
    """#DE of a VEX DivMod (x86 div/idiv): a zero divisor, or a quotient that does not fit."""
    m = _DIVMOD.match(op)
    if m is None:
        return None
    signed, wide, narrow = m.group(1) == "S", int(m.group(2)), int(m.group(3))
    a, b = args
    b = b.sign_extend(wide - narrow) if signed else b.zero_extend(wide - narrow)
    zero = b == 0
    safe_b = claripy.If(zero, claripy.BVV(1, wide), b)
    if signed:
        q = a.SDiv(safe_b)  # two's complement: MIN / -1 wraps, and overflows below as it should
        lo, hi = -(1 << (narrow - 1)), (1 << (narrow - 1)) - 1
        bad = claripy.Or(claripy.SLT(q, claripy.BVV(lo & ((1 << wide) - 1), wide)), claripy.SGT(q, claripy.BVV(hi, wide)))
    else:
        bad = claripy.UGE(a.LShR(narrow), safe_b)  # the quotient fits in ``narrow`` bits iff hi(a) < b
    return claripy.Or(zero, bad)


def _to_bv(v):
    return v.raw_to_bv() if isinstance(v, claripy.ast.FP) else v


def _get_reg(world: World, path: IRPath, offset: int, nbytes: int, start_pc: int):
    parts = []
    for k in range(nbytes):
        b = path.regs.get(offset + k)
        parts.append(b if b is not None else world.initial_register_byte(offset + k, start_pc))
    return claripy.Concat(*reversed(parts)) if nbytes > 1 else parts[0]


def _put_reg(path: IRPath, offset: int, value):
    value = _to_bv(value)
    for k in range(value.size() // 8):
        path.regs[offset + k] = value[k * 8 + 7:k * 8]


def register_value(world: World, regs: dict, name: str, start_pc: int):
    off, size = REG_BY_NAME[name]
    parts = [regs.get(off + k) for k in range(size)]
    if all(p is None for p in parts):
        return world.initial_register(name, start_pc)
    parts = [p if p is not None else world.initial_register_byte(off + k, start_pc) for k, p in enumerate(parts)]
    return claripy.Concat(*reversed(parts))


# ---------------------------------------------------------------------------
# The IR interpreter
# ---------------------------------------------------------------------------

_TY_BITS = {"Ity_I1": 1, "Ity_I8": 8, "Ity_I16": 16, "Ity_I32": 32, "Ity_I64": 64, "Ity_I128": 128,
            "Ity_F32": 32, "Ity_F64": 64, "Ity_V128": 128, "Ity_V256": 256, "Ity_F128": 128, "Ity_D64": 64}


def _ty_bits(ty: str) -> int:
    try:
        return _TY_BITS[ty]
    except KeyError:
        raise Gap(f"VEX type {ty} is not modelled") from None


def _as_type(v, ty: str):
    if ty == "Ity_F32":
        return _to_bv(v).raw_to_fp() if not isinstance(v, claripy.ast.FP) else v
    if ty == "Ity_F64":
        return _to_bv(v).raw_to_fp() if not isinstance(v, claripy.ast.FP) else v
    return v



def rflags_all(*thunk):
    """RFLAGS from a flags thunk (operation, dep1, dep2, ndep), by angr's own helper (``amd64g_calculate_rflags_all``)."""
    return _ccall.amd64g_calculate_rflags_all(_CCallState(), *thunk)


_RSP = REG_BY_NAME["rsp"][0]


class Interpreter:
    """The IR interpreter.  ``code`` placed at ``base`` is what VEX lifts: at each instruction
    boundary (IMark) the interpreter decodes those bytes as the CPU does (``forms.facts``) and
    refuses a lift whose instruction boundaries are not the CPU's; the facts give what VEX's IR
    leaves out (the fence kind, the alignment a memory operand needs, zmm upper bits zeroed)."""

    def __init__(self, world: World, start_pc: int, code: bytes = b"", base: int = 0):
        self.world = world
        self.start_pc = start_pc
        self.code = code
        self.base = base

    def mark(self, path: IRPath, address: int, length: int) -> None:
        """Entering the instruction at ``address``: its facts, and the zmm upper bits it zeroes."""
        off = (address - self.base) & MASK64
        raw = self.code[off:off + length] if off + length <= len(self.code) else b""
        f = facts(raw) if raw else None
        if f is None:
            raise Gap(f"VEX lifts {length} bytes at {address:#x} that the CPU does not decode as one instruction")
        path.facts = f
        path.insns.append(address)
        path.boundaries.append(Boundary(address, _get_reg(self.world, path, _RSP, 8, self.start_pc),
                                        len(path.events)))
        for i in f.zeroes_upper:
            _put_reg(path, REG_BY_NAME[ZMM_HI[i]][0], claripy.BVV(0, 256))

    def fault(self, path: IRPath, condition, name: str) -> None:
        if not claripy.is_false(condition):
            path.faults.append((condition, FAULT_CODES[name]))

    def access(self, path: IRPath, addr, guard=None) -> None:
        """The alignment fault of a memory access by the current instruction (#GP when misaligned;
        a legacy-SSE one not under AMD's MXCSR.MM)."""
        f = path.facts
        if f is None or not f.align:
            return
        bad = (addr & (f.align - 1)) != 0
        if f.align_legacy:
            bad = claripy.And(bad, self.world.mm == 0)
        if guard is not None:
            bad = claripy.And(guard, bad)
        self.fault(path, bad, "#GP")

    def expr(self, path: IRPath, e):
        t = type(e)
        if t is pyvex.expr.RdTmp:
            return path.temps[e.tmp]
        if t is pyvex.expr.Const:
            return self.const(e.con)
        if t is pyvex.expr.Get:
            bits = _ty_bits(e.ty)
            return _as_type(_get_reg(self.world, path, e.offset, bits // 8, self.start_pc), e.ty)
        if t in (pyvex.expr.Unop, pyvex.expr.Binop, pyvex.expr.Triop, pyvex.expr.Qop):
            args = [self.expr(path, a) for a in e.args]
            if t is pyvex.expr.Binop and e.op.startswith("Iop_DivMod"):
                bad = _divide_fault(e.op, args)
                if bad is not None:
                    self.fault(path, bad, "#DE")
            try:
                return vexop_to_simop(e.op).calculate(*args)
            except Exception as exc:  # angr raises several unrelated types here
                raise Gap(f"VEX operation {e.op} is not modelled ({type(exc).__name__})") from None
        if t is pyvex.expr.Load:
            addr = self.expr(path, e.addr)
            size = _ty_bits(e.ty) // 8
            _read_event(path, addr, size)
            self.access(path, addr)
            v = read_memory(self.world, path.writes, addr, size)
            return _as_type(v, e.ty)
        if t is pyvex.expr.ITE:
            c = self.expr(path, e.cond)
            a, b = self.expr(path, e.iftrue), self.expr(path, e.iffalse)
            return claripy.If(c == 1, a, b)
        if t is pyvex.expr.CCall:
            return self.ccall(path, e)
        raise Gap(f"VEX expression {t.__name__} is not modelled")

    @staticmethod
    def const(con):
        ty = con.type
        bits = _ty_bits(ty)
        if ty == "Ity_F32":
            return claripy.FPV(con.value, claripy.FSORT_FLOAT)
        if ty == "Ity_F64":
            return claripy.FPV(con.value, claripy.FSORT_DOUBLE)
        return claripy.BVV(con.value & ((1 << bits) - 1), bits)

    def ccall(self, path: IRPath, e):
        args = [self.expr(path, a) for a in e.args]
        name = e.cee.name
        bits = _ty_bits(e.retty)
        fn = getattr(_ccall, name, None)
        if fn is not None:
            try:
                r = fn(_CCallState(), *args)
            except Exception:
                r = None
            if r is not None and hasattr(r, "size"):
                if r.size() < bits:
                    r = r.zero_extend(bits - r.size())
                elif r.size() > bits:
                    r = r[bits - 1:0]
                return r
        return self.world.uninterpreted(name, tuple(args), bits)

    # -- statements -------------------------------------------------------
    def run_block(self, irsb, path: IRPath) -> list[tuple[IRPath, object, str]]:
        """Run one IRSB.  Returns the ways out: (path, target, jumpkind)."""
        exits = []
        for st in irsb.statements:
            t = type(st)
            if t is pyvex.stmt.IMark:
                self.mark(path, st.addr, st.len)
                continue
            if t in (pyvex.stmt.NoOp, pyvex.stmt.AbiHint):
                continue
            if t is pyvex.stmt.MBE:  # a memory event the obligation compares, with its kind (VEX has one)
                kind = path.facts.hazards.fence if path.facts is not None and path.facts.hazards.fence else "fence"
                path.events.append(Event("F", claripy.true(), fence=kind))
                continue
            if t is pyvex.stmt.WrTmp:
                path.temps[st.tmp] = self.expr(path, st.data)
            elif t is pyvex.stmt.Put:
                _put_reg(path, st.offset, self.expr(path, st.data))
            elif t is pyvex.stmt.Store:
                addr = self.expr(path, st.addr)
                self.access(path, addr)
                _store(path, addr, self.expr(path, st.data))
            elif t is pyvex.stmt.StoreG:
                g = self.expr(path, st.guard) == 1
                addr = self.expr(path, st.addr)
                data = _to_bv(self.expr(path, st.data))
                old = read_memory(self.world, path.writes, addr, data.size() // 8)
                self.access(path, addr, g)
                _store(path, addr, claripy.If(g, data, old), g)
            elif t is pyvex.stmt.LoadG:
                g = self.expr(path, st.guard) == 1
                addr = self.expr(path, st.addr)
                size = _ty_bits(st.cvt_types[0]) // 8
                _read_event(path, addr, size, g)
                self.access(path, addr, g)
                loaded = read_memory(self.world, path.writes, addr, size)
                conv = _loadg_convert(st.cvt, loaded)
                path.temps[st.dst] = claripy.If(g, conv, self.expr(path, st.alt))
            elif t is pyvex.stmt.CAS:
                addr = self.expr(path, st.addr)
                expd = self.expr(path, st.expdLo)
                data = self.expr(path, st.dataLo)
                half = expd.size() // 8
                if st.dataHi is not None:  # cmpxchg8b/16b: one access of both halves, high half above
                    expd = claripy.Concat(self.expr(path, st.expdHi), expd)
                    data = claripy.Concat(self.expr(path, st.dataHi), data)
                size = expd.size() // 8
                _read_event(path, addr, size)
                self.access(path, addr)
                old = read_memory(self.world, path.writes, addr, size)
                _store(path, addr, claripy.If(old == expd, data, old))
                path.temps[st.oldLo] = old[half * 8 - 1:0]
                if st.dataHi is not None:
                    path.temps[st.oldHi] = old[size * 8 - 1:half * 8]
            elif t is pyvex.stmt.Exit:
                g = self.expr(path, st.guard) == 1
                taken = path.fork(claripy.And(path.guard, g))
                exits.append((taken, self.const(st.dst), st.jumpkind))
                path.guard = claripy.And(path.guard, claripy.Not(g))
            elif t is pyvex.stmt.Dirty:
                raise Gap(f"VEX models this instruction as the dirty helper {st.cee.name}, outside the IR")
            else:
                raise Gap(f"VEX statement {t.__name__} is not modelled")
        exits.append((path, self.expr(path, irsb.next), irsb.jumpkind))
        return exits


def _loadg_convert(cvt: str, v):
    table = {"ILGop_Ident64": lambda x: x, "ILGop_Ident32": lambda x: x,
             "ILGop_16Uto32": lambda x: x.zero_extend(16), "ILGop_16Sto32": lambda x: x.sign_extend(16),
             "ILGop_8Uto32": lambda x: x.zero_extend(24), "ILGop_8Sto32": lambda x: x.sign_extend(24)}
    if cvt not in table:
        raise Gap(f"guarded load conversion {cvt} is not modelled")
    return table[cvt](v)


# ---------------------------------------------------------------------------
# Running code
# ---------------------------------------------------------------------------


def execute_original(world: World, raw: bytes, at: int) -> list[WayOut]:
    """One instruction at ``at``.  Every way out is final, including a jump back to ``at`` (rep loops)."""
    irsb = lift(raw, at, max_inst=1)
    if irsb.size != len(raw):
        raise Gap(f"VEX decoded {irsb.size} bytes where the decoders decoded {len(raw)}")
    interp = Interpreter(world, at, raw, at)
    outs = interp.run_block(irsb, IRPath(claripy.true()))
    return [way_out(p, tgt, jk) for p, tgt, jk in outs]


def execute_relocated(world: World, code: bytes, tramp: int, at: int, max_blocks: int = 32) -> list[WayOut]:
    """The relocated code from ``tramp`` until control leaves ``[tramp, tramp+len)``.

    A concrete jump to ``tramp`` itself is the relocated instruction starting
    again, the image of the original jumping to ``at``: its target is
    reported as ``at`` (the A <-> T correspondence of proof.py).
    """
    end = tramp + len(code)
    interp = Interpreter(world, tramp, code, tramp)
    work = [(tramp, IRPath(claripy.true()))]
    finals: list[WayOut] = []
    blocks = 0
    while work:
        pc, path = work.pop()
        blocks += 1
        if blocks > max_blocks:
            raise Gap(f"the relocated code ran more than {max_blocks} blocks without leaving the trampoline")
        irsb = lift(code[pc - tramp:], pc)
        for p, tgt, jk in interp.run_block(irsb, path):
            if claripy.is_false(p.guard):
                continue
            if tgt.op == "BVV":
                v = tgt.args[0]
                if v == tramp:
                    finals.append(way_out(p, claripy.BVV(at, 64), jk))
                    continue
                if tramp < v < end:
                    if jk not in NORMAL_JUMPKINDS:
                        finals.append(way_out(p, tgt, jk))
                        continue
                    p.temps = {}
                    work.append((v, p))
                    continue
            finals.append(way_out(p, tgt, jk))
    return finals


def way_out(p: IRPath, target, jk: str) -> WayOut:
    code = claripy.BVV(FAULT_CODES[FAULT_JUMPKINDS[jk]] if jk in FAULT_JUMPKINDS else 0, 8)
    for condition, fault in reversed(p.faults):
        code = claripy.If(condition, claripy.BVV(fault, 8), code)
    return WayOut(p.guard, dict(p.regs), tuple(p.writes), tuple(p.reads), target, jk, tuple(p.events), code,
                  tuple(p.insns), tuple(p.boundaries))


# ---------------------------------------------------------------------------
# The semantics of emulation effects (effects.py)
# ---------------------------------------------------------------------------


def _address(world: World, path: IRPath, a, start_pc: int):
    """The value of an effects.Address: base + index*scale + disp (+ fs/gs base), wrapped to its size."""
    v = claripy.BVV(a.disp & MASK64, 64)
    if a.base:
        v = v + register_value(world, path.regs, a.base, start_pc)
    if a.index:
        v = v + register_value(world, path.regs, a.index, start_pc) * a.scale
    if a.address_size == 32:
        v = v[31:0].zero_extend(32)
    if a.segment:
        v = v + register_value(world, path.regs, {"fs": "fs", "gs": "gs"}[a.segment], start_pc)
    return v


def _value(world: World, path: IRPath, v, start_pc: int):
    if isinstance(v, Const):
        return claripy.BVV(v.value & MASK64, 64)
    if isinstance(v, Reg):
        return register_value(world, path.regs, v.name, start_pc)
    if isinstance(v, Temp):
        if v.name not in path.temps:
            raise Gap(f"effect program reads {v.name} before setting it")
        return path.temps[v.name]
    if isinstance(v, Load):
        addr = _address(world, path, v.address, start_pc)
        _read_event(path, addr, v.size)
        val = read_memory(world, path.writes, addr, v.size)
        return val.zero_extend(64 - v.size * 8) if v.size < 8 else val
    raise Gap(f"unknown effect value {v!r}")


def _current_flags(world: World, path: IRPath, start_pc: int):
    vals = [register_value(world, path.regs, n, start_pc) for n in FLAG_THUNK]
    if vals[0].op != "BVV":
        raise Gap("symbolic flags-thunk operation")
    r = rflags_all(*vals)
    return tuple(r[k:k] for k in (0, 2, 6, 7, 11))  # CF PF ZF SF OF


def execute_effects(world: World, effects, at: int, tramp: int) -> list[WayOut]:
    """Run an emulate plan's effect program (see effects.py for its meaning)."""
    path = IRPath(claripy.true())
    rsp_off = REG_BY_NAME["rsp"][0]
    for k, e in enumerate(effects):
        last = k == len(effects) - 1
        if isinstance(e, Let):
            path.temps[e.name] = _value(world, path, e.value, tramp)
        elif isinstance(e, Push):
            val = _value(world, path, e.value, tramp)
            rsp = register_value(world, path.regs, "rsp", tramp) - 8
            _put_reg(path, rsp_off, rsp)
            _store(path, rsp, val)
        elif isinstance(e, AddRsp):
            _put_reg(path, rsp_off, register_value(world, path.regs, "rsp", tramp) + (e.delta & MASK64))
        elif isinstance(e, Jump) and last:
            return [way_out(path, _value(world, path, e.to, tramp), "Ijk_Boring")]
        elif isinstance(e, Branch) and last:
            try:
                test = condition_test(e.cond)
            except ValueError as exc:
                raise Gap(str(exc)) from None
            bit = test(*_current_flags(world, path, tramp))
            taken = path.fork(claripy.And(path.guard, bit == 1))
            path.guard = claripy.And(path.guard, bit == 0)
            return [way_out(taken, claripy.BVV(e.taken & MASK64, 64), "Ijk_Boring"),
                    way_out(path, claripy.BVV(e.fallthrough & MASK64, 64), "Ijk_Boring")]
        else:
            raise Gap("an effect program must end in exactly one jump or branch")
    raise Gap("an effect program must end in a jump or branch")

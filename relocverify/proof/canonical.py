"""The canonical form of a lifted block, which the IR-identity proofs compare (``fast_path``,
``block``), and the facts of a block the lifter checks read (``lifter_checks``).

This module is the reference: it reads pyvex's objects.  ``proof.lifted`` makes the same values
natively from libVEX's C block (``irsb_walk.c``) for blocks libVEX lifts whole, and
``tests/test_lifted.py`` holds the two to each other."""

from __future__ import annotations

import pyvex

from . import lift as L


class NotApplicable(Exception):
    pass


def _canon_expr(e, temps: dict):
    t = type(e)
    if t is pyvex.expr.RdTmp:
        return ("t", temps[e.tmp])
    if t is pyvex.expr.Const:
        return ("c", e.con.type, e.con.value)
    if t is pyvex.expr.Get:
        if e.offset == L.REG_BY_NAME["rip"][0]:
            raise NotApplicable("reads rip")
        return ("get", e.offset, e.ty)
    if t in (pyvex.expr.Unop, pyvex.expr.Binop, pyvex.expr.Triop, pyvex.expr.Qop):
        return (e.op,) + tuple(_canon_expr(a, temps) for a in e.args)
    if t is pyvex.expr.Load:
        return ("ld", e.end, e.ty, _canon_expr(e.addr, temps))
    if t is pyvex.expr.ITE:
        return ("ite", _canon_expr(e.cond, temps), _canon_expr(e.iftrue, temps), _canon_expr(e.iffalse, temps))
    if t is pyvex.expr.CCall:
        return ("ccall", e.cee.name, e.retty) + tuple(_canon_expr(a, temps) for a in e.args)
    raise NotApplicable(f"expression {t.__name__}")


def _define(temps: dict, tmp: int) -> int:
    temps[tmp] = len(temps)
    return temps[tmp]


def canon_block(irsb, resolve, constant=None) -> tuple:
    """A canonical form of an IRSB: temps renamed by definition order, IMarks
    and writes of rip dropped (every exit and the block's end overwrite rip,
    and no statement reads it: checked), exit targets passed through ``resolve``.
    ``constant(address)`` may give the value of an 8-byte load from a constant
    address (the qword of the trampoline's own ``jmp *0(%rip)``): the load is
    then the constant, and a block ending in a jump through it ends at that
    constant, resolved like any other exit."""
    temps: dict = {}
    out = []
    folded: dict = {}
    rip = L.REG_BY_NAME["rip"][0]
    for st in irsb.statements:
        t = type(st)
        if t in (pyvex.stmt.IMark, pyvex.stmt.NoOp, pyvex.stmt.AbiHint):
            continue
        if t is pyvex.stmt.WrTmp and constant is not None and type(st.data) is pyvex.expr.Load \
                and st.data.ty == "Ity_I64" and type(st.data.addr) is pyvex.expr.Const:
            value = constant(st.data.addr.con.value)
            if value is not None:
                folded[st.tmp] = value
                continue
        if t is pyvex.stmt.WrTmp:
            if any(type(e) is pyvex.expr.RdTmp and e.tmp in folded for e in st.data.child_expressions) \
                    or (type(st.data) is pyvex.expr.RdTmp and st.data.tmp in folded):
                raise NotApplicable("a folded jump qword used as data")
            data = _canon_expr(st.data, temps)
            out.append(("wr", _define(temps, st.tmp), data))
        elif t is pyvex.stmt.Put:
            if st.offset == rip:
                _canon_expr(st.data, temps)  # still must not read rip
                continue
            out.append(("put", st.offset, _canon_expr(st.data, temps)))
        elif t is pyvex.stmt.Store:
            out.append(("st", st.end, _canon_expr(st.addr, temps), _canon_expr(st.data, temps)))
        elif t is pyvex.stmt.StoreG:
            out.append(("stg", st.end, _canon_expr(st.addr, temps), _canon_expr(st.data, temps),
                        _canon_expr(st.guard, temps)))
        elif t is pyvex.stmt.LoadG:
            args = (_canon_expr(st.addr, temps), _canon_expr(st.alt, temps), _canon_expr(st.guard, temps))
            out.append(("ldg", st.end, st.cvt, _define(temps, st.dst)) + args)
        elif t is pyvex.stmt.CAS:
            args = (_canon_expr(st.addr, temps), _canon_expr(st.expdLo, temps), _canon_expr(st.dataLo, temps))
            if st.dataHi is not None:
                args += (_canon_expr(st.expdHi, temps), _canon_expr(st.dataHi, temps))
                out.append(("cas2", st.end, _define(temps, st.oldLo), _define(temps, st.oldHi)) + args)
            else:
                out.append(("cas", st.end, _define(temps, st.oldLo)) + args)
        elif t is pyvex.stmt.MBE:
            out.append(("mbe", st.event))
        elif t is pyvex.stmt.Exit:
            out.append(("exit", _canon_expr(st.guard, temps), resolve(st.dst.value), _jk(st.jumpkind)))
        elif t is pyvex.stmt.Dirty:
            raise L.Gap(f"VEX models this instruction as the dirty helper {st.cee.name}, outside the IR")
        else:
            raise NotApplicable(f"statement {t.__name__}")
    nxt = irsb.next
    if type(nxt) is pyvex.expr.Const:
        end = ("exit", resolve(nxt.con.value), _jk(irsb.jumpkind))
    elif type(nxt) is pyvex.expr.RdTmp and nxt.tmp in folded:
        end = ("exit", resolve(folded[nxt.tmp]), _jk(irsb.jumpkind))
    else:
        end = ("next", _canon_expr(nxt, temps), _jk(irsb.jumpkind))
    return drop_dead(tuple(out) + (end,))


def _jk(jumpkind: str) -> str:
    """Call and Ret are hints to VEX's clients; as state transitions they are Boring."""
    return "Ijk_Boring" if jumpkind in L.NORMAL_JUMPKINDS else jumpkind


def _uses(node, acc: set) -> set:
    if isinstance(node, tuple):
        if len(node) == 2 and node[0] == "t" and isinstance(node[1], int):
            acc.add(node[1])
        else:
            for n in node:
                _uses(n, acc)
    return acc


def _pure(node) -> bool:
    """No load inside: evaluating it has no effect (VEX operations and clean helpers are pure)."""
    if isinstance(node, tuple):
        if node and node[0] == "ld":
            return False
        return all(_pure(n) for n in node)
    return True


def drop_dead(stmts: tuple) -> tuple:
    """Drop writes of temps nobody reads whose expression is pure (AbiHint's red-zone arithmetic)."""
    used = set()
    for st in stmts:
        if st[0] == "wr":
            _uses(st[2], used)
        else:
            _uses(st[1:], used)
    return tuple(st for st in stmts if not (st[0] == "wr" and st[1] not in used and _pure(st[2])))


def ir_facts(irsb) -> tuple[set[str], bool, list[tuple[int, str]]]:
    """What the lifter checks read of a block (``lifter_checks``): the names of the operations
    anywhere in its statements' expressions, whether it touches memory (a Store, StoreG, CAS or
    LoadG statement, or a Load expression), and each Put's (guest offset, type of the value),
    all as pyvex's ``IRStmt.expressions`` yields them."""
    ops: set[str] = set()
    memory = False
    puts: list[tuple[int, str]] = []
    for st in irsb.statements:
        t = type(st)
        if t in (pyvex.stmt.Store, pyvex.stmt.StoreG, pyvex.stmt.CAS, pyvex.stmt.LoadG):
            memory = True
        if t is pyvex.stmt.Put:
            puts.append((st.offset, st.data.result_type(irsb.tyenv)))
        for e in st.expressions:
            if type(e) is pyvex.expr.Load:
                memory = True
            op = getattr(e, "op", None)
            if op:
                ops.add(op)
    return ops, memory, puts

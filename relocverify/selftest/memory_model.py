"""The memory-model table: what another CPU can tell apart that a sequential run cannot.

The judge for the concurrency classes (memory ordering; store width and
tearing).  It reads both sides with iced-x86 (following control flow from
each entry, as the CPU would), lists their memory-ordering events, and
applies the x86 memory model as the manuals state it, one row per rule:

========================  =========================================================================
rule                      source and what it means here
========================  =========================================================================
fence kinds               SDM Vol. 3 §9.2.2, §9.2.5: MFENCE orders every load and store; LFENCE
                          orders loads (and is dispatch-serializing, the kernel's speculation
                          barrier); SFENCE orders stores, including non-temporal ones.  A fence of
                          another kind, a missing one or an extra one changes what another CPU or a
                          speculating one can observe.
locked operations         SDM Vol. 3 §9.1.2.2, §9.2.2: a LOCKed instruction (or XCHG with memory) is
                          atomic and a full barrier for write-back memory, but it neither orders
                          non-temporal stores as SFENCE does nor replaces MFENCE for WC memory; an
                          unlocked read-modify-write is not atomic.
non-temporal stores       SDM Vol. 1 §10.4.6.2, Vol. 3 §9.2.2: MOVNTI/MOVNT* are weakly ordered with
                          other stores (write-combining): a normal store made non-temporal can become
                          visible after a later store.
single-copy atomicity     SDM Vol. 3 §9.1.1: an aligned access of 1, 2, 4 or 8 bytes is atomic; the
                          same bytes written by narrower stores, or in another order, can be seen torn
                          by a concurrent reader; a second store of the same value can overwrite
                          another CPU's store made in between (a lost update).
========================  =========================================================================

``compare`` returns '' when both sides have the same sequence of ordering
events (fences by kind, locked operations, non-temporal accesses, and each
store's width in program order, tracer memory excepted), else the rule that
tells them apart.  It does not use the checker's code: it is the judge.
"""

from __future__ import annotations

import struct

import iced_x86 as iced

_MNEMONIC = {v: k.lower() for k, v in vars(iced.Mnemonic).items() if k.isupper()}
_INFO = iced.InstructionInfoFactory()
_FENCES = {"mfence", "lfence", "sfence", "serialize"}
_NT = {"movnti", "movntdq", "movntdqa", "movntps", "movntpd", "movntq", "maskmovq", "maskmovdqu", "vmovntdq",
       "vmovntdqa", "vmovntps", "vmovntpd", "vmaskmovdqu"}
_STOP = {iced.FlowControl.UNCONDITIONAL_BRANCH, iced.FlowControl.INDIRECT_BRANCH, iced.FlowControl.RETURN}


def _walk(code: bytes, base: int) -> list[iced.Instruction]:
    seen: dict[int, iced.Instruction] = {}
    work = [base]
    while work:
        pc = work.pop()
        if pc in seen or not base <= pc < base + len(code):
            continue
        ins = iced.Decoder(64, code[pc - base:], ip=pc).decode()
        if ins.is_invalid:
            continue
        seen[pc] = ins
        if ins.flow_control not in _STOP:
            work.append(pc + ins.len)
        if ins.op_count and ins.op0_kind in (iced.OpKind.NEAR_BRANCH32, iced.OpKind.NEAR_BRANCH64,
                                             iced.OpKind.NEAR_BRANCH16):
            work.append(ins.near_branch_target)
        raw = code[pc - base:pc - base + ins.len]
        if raw == b"\xff\x25\x00\x00\x00\x00" and pc - base + 14 <= len(code):
            work.append(struct.unpack_from("<Q", code, pc - base + 6)[0])
    return [seen[k] for k in sorted(seen)]


def events(code: bytes, base: int, tracer_memory=()) -> list[tuple]:
    """The ordering events of code at ``base``, in address order: ('fence', kind), ('locked', mnemonic),
    ('nt', mnemonic), ('store', width)."""
    out = []
    for ins in _walk(code, base):
        m = _MNEMONIC[ins.mnemonic]
        if m in _FENCES:
            out.append(("fence", m))
        mems = [u for u in _INFO.info(ins).used_memory()
                if u.access in (iced.OpAccess.WRITE, iced.OpAccess.READ_WRITE, iced.OpAccess.COND_WRITE,
                                iced.OpAccess.READ_COND_WRITE)]
        if ins.is_ip_rel_memory_operand and any(lo <= ins.ip_rel_memory_address < lo + n for lo, n in tracer_memory):
            continue  # the tracer's own slot: private, no other CPU sees it
        locked = ins.has_lock_prefix or (m == "xchg" and any(ins.op_kind(k) == iced.OpKind.MEMORY
                                                               for k in range(ins.op_count)))
        if locked:
            out.append(("locked", m))
        if m in _NT:
            out.append(("nt", m))
        for u in mems:
            out.append(("store", iced.MemorySizeExt.size(u.memory_size)))
    return out


def compare(orig: bytes, at: int, reloc: bytes, tramp: int, tracer_memory=()) -> str:
    """'' if another CPU cannot tell the two apart by the table's rules, else the rule and the events."""
    ranges = ((tramp, len(reloc)),) + tuple(tracer_memory)
    eo, er = events(orig, at), events(reloc, tramp, ranges)
    for rule, kinds in (("fence kinds", ("fence",)), ("locked operations", ("locked",)),
                        ("non-temporal stores", ("nt",)), ("single-copy atomicity", ("store",))):
        so = [e for e in eo if e[0] in kinds]
        sr = [e for e in er if e[0] in kinds]
        if so != sr:
            return f"{rule}: original {so}, relocation {sr}"
    return ""

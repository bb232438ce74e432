"""Relocation policy: one row per instruction class, its strategy, and why.

``classify(insn)`` returns the first row whose predicate holds.  The
planner (``plan.py``) turns the row's strategy into bytes or effects; it
never decides policy itself.  Rows are data: the closing note and the
``relocverify policy`` command print this table as it is.

Strategies:
  reject            not relocated; the reason says why no correct relocation exists
  copy              the bytes verbatim at T, then a jump back to A+len
  rip-rewrite       a RIP-relative operand re-targeted (new disp32, or via a scratch register)
  branch-rewrite    a relative jmp/jcc re-encoded as rel32 from T (emulated when out of range)
  loop-rewrite      loop/loopcc/jrcxz/jecxz kept, with a local rel8 target and jumps out
  xbegin-rewrite    xbegin re-targeted to its abort path
  emulate-call      push A+len, jump to the target (read before the push)
  emulate-jmp       jump to the target
  emulate-ret       pop the return address (and imm16 more bytes), jump to it
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..x86.instruction import Instruction

BRANCH_FLOWS = ("unconditional_branch", "conditional_branch", "call", "indirect_branch", "indirect_call", "return")


@dataclass(frozen=True)
class Rule:
    name: str
    matches: Callable[[Instruction], bool]
    strategy: str
    reason: str


def _op(*names: str) -> Callable[[Instruction], bool]:
    s = frozenset(names)
    return lambda i: i.opname in s


def _is_mov_ss(i: Instruction) -> bool:
    # 8e /r with reg field 2 is "mov r/m16, %ss"; it opens an interrupt shadow.
    return i.opcode == b"\x8e" and i.modrm is not None and (i.modrm >> 3) & 7 == 2


def _branch_with_66(i: Instruction) -> bool:
    return i.opsize and (i.flow in BRANCH_FLOWS or i.opname == "xbegin")


def _lock_on_branch(i: Instruction) -> bool:
    return i.lock and i.flow in BRANCH_FLOWS


def _loop(i: Instruction) -> bool:
    return i.opname in ("loop", "loope", "loopne", "jrcxz", "jecxz")


def _rel_branch(i: Instruction) -> bool:
    return i.flow in ("unconditional_branch", "conditional_branch") and i.branch_target is not None


def _rel_call(i: Instruction) -> bool:
    return i.flow == "call" and i.opname == "call" and i.branch_target is not None


RULES: tuple[Rule, ...] = (
    Rule("sti", _op("sti"), "reject",
         "sti enables interrupts inside the probe handler and breaks its synchronisation barrier "
         "(kinst refuses it; kprobes emulates it only because it single-steps)"),
    Rule("popf", _op("popf", "popfq", "popfd"), "reject",
         "popf can set IF (and TF) inside the probe handler, breaking the same barrier as sti (kinst refuses it)"),
    Rule("int3", _op("int3"), "reject",
         "int3 at T traps into the probe handler at an address no probe owns (kprobes refuses it)"),
    Rule("endbr", _op("endbr64", "endbr32"), "reject",
         "endbr64 is an IBT landing pad: on a kernel built with IBT (Debian 6.12: CONFIG_X86_KERNEL_IBT) an "
         "indirect call or jump to A finds the probe's int3 instead and raises #CP before the int3 runs (SDM "
         "Vol. 1 §18.3); kprobes moves such probes past it (arch_adjust_kprobe_addr): probe A+4"),
    Rule("int", _op("int", "int1", "into"), "reject",
         "a software interrupt saves T+len as the return RIP: its handler sees the trampoline, not A+len"),
    Rule("iret", _op("iret", "iretd", "iretq"), "reject",
         "iret restores CS/RFLAGS/SS from an interrupt frame; kprobes refuses it inside a probe"),
    Rule("syscall", _op("syscall", "sysenter"), "reject",
         "syscall saves the next RIP in rcx (sysenter loads RIP from an MSR): the copy would save T+len"),
    Rule("sysret", _op("sysret", "sysretq", "sysexit", "sysexitq"), "reject",
         "a return to user mode leaves the probe's context for good; kprobes refuses it"),
    Rule("swapgs", _op("swapgs"), "reject",
         "swapgs switches the kernel gs base; the int3 handler's own swapgs decision (paranoid entry) "
         "would be wrong at T, and VEX lifts it as a no-op"),
    Rule("hlt", _op("hlt"), "reject",
         "hlt stops the CPU until an interrupt, inside the probe's relocation window"),
    Rule("mov-ss", _is_mov_ss, "reject",
         "mov to %ss opens an interrupt shadow: the next instruction, the jump back, runs with interrupts "
         "and debug traps held off (kprobes refuses mov ss / pop ss)"),
    Rule("far-transfer", lambda i: i.far, "reject",
         "a far call/jmp/ret loads CS from memory; kprobes refuses far transfers"),
    Rule("ud", _op("ud0", "ud1", "ud2"), "reject",
         "ud0/ud1/ud2 are BUG/WARN sites: the #UD handler looks the faulting address up in __bug_table, "
         "and finds nothing at T"),
    Rule("rsm", _op("rsm"), "reject", "rsm is only valid in system-management mode"),
    Rule("lock-branch", _lock_on_branch, "reject",
         "a LOCK prefix on a branch raises #UD (uprobes refuses it)"),
    Rule("66-branch", _branch_with_66, "reject",
         "an operand-size prefix on a near branch truncates RIP to 16 bits on Intel and is ignored on AMD: "
         "vendor-dependent, so no single relocation is correct"),
    Rule("call-rel", _rel_call, "emulate-call",
         "a copied call would push T+len, a return address inside the trampoline (kinst bug, 2022 review): "
         "emulated as push A+len; jump target"),
    Rule("call-indirect", lambda i: i.flow == "indirect_call" and i.opname == "call", "emulate-call",
         "the target is read first (call *(%rsp) reads the old rsp), then A+len is pushed, whatever the length "
         "(kprobes pushed ip+5 for the 3-byte call *%r11)"),
    Rule("ret", _op("ret"), "emulate-ret",
         "ret and ret imm16 pop the return address and then imm16 more bytes (kprobes treated ret imm16 as ret)"),
    Rule("jmp-indirect", lambda i: i.flow == "indirect_branch" and i.opname == "jmp", "emulate-jmp",
         "an indirect jmp only sets RIP: the handler reads the target (RIP-relative memory resolved from A)"),
    Rule("loop", _loop, "loop-rewrite",
         "loop/loopcc/jrcxz/jecxz have only a rel8 form: the instruction is kept (it decrements and tests "
         "rcx itself, in that order), with a local target and jumps out"),
    Rule("branch-rel", _rel_branch, "branch-rewrite",
         "a relative jmp/jcc is re-encoded as rel32 from T to the sign-extended original target; "
         "emulated when T is out of rel32 range"),
    Rule("xbegin", _op("xbegin"), "xbegin-rewrite",
         "xbegin's abort target is relative: re-targeted so that an abort still lands on the original handler"),
    Rule("hypercall", _op("vmcall", "vmmcall", "vmgexit"), "reject",
         "a hypercall exits to the hypervisor, which reads the guest RIP (KVM skips the instruction by its "
         "length, Xen checks that hypercalls come from its hypercall page): at T it sees the trampoline"),
    Rule("unclassified-flow", lambda i: i.flow not in ("next", "exception") and i.opname not in ("xend", "xabort"),
         "reject", "a control transfer with no relocation rule (far, interrupt or privilege change)"),
    Rule("rip-relative", lambda i: i.rip_relative, "rip-rewrite",
         "a RIP-relative operand is re-targeted: new disp = A + disp - T, counted from the end of the whole "
         "instruction (immediates after the displacement included); through a scratch register if that "
         "does not fit in s32, never truncated"),
    Rule("position-independent", lambda i: True, "copy",
         "the instruction does not depend on its address: copied verbatim, then a jump back to A+len"),
)


def _user_rows() -> tuple[Rule, ...]:
    """The user-space table (fasttrap, uprobes): the kernel's, with the rows user mode changes (sti and
    endbr go: Linux enables no user-mode IBT, ``proof.machine_model`` row ibt-user)."""
    changed = {
        "popf": Rule("popf", _op("popf", "popfq", "popfd"), "reject",
                     "in user mode popf cannot change IF or IOPL, but it can set TF: the single-step trap then "
                     "follows the copy's jump back instead of A+len's instruction (SDM Vol. 3 §17.3.1.4; "
                     "proof.machine_model, row single-step-set); uprobes single-steps it and sets TF again "
                     "(UPROBE_FIX_SETF)"),
        "syscall": Rule("syscall", _op("syscall", "sysenter"), "reject",
                        "syscall saves the next RIP in rcx: the kernel would return to T+len and the process "
                        "would see a trampoline address in rcx (uprobes single-steps it instead)"),
        "ud": Rule("ud", _op("ud0", "ud1", "ud2"), "reject",
                   "ud0/ud1/ud2 raise #UD: the SIGILL the process gets would report the trampoline's address"),
        "int3": Rule("int3", _op("int3"), "reject",
                     "int3 at T raises a SIGTRAP at an address no probe owns"),
    }
    privileged = Rule("privileged", lambda i: i.privileged, "reject",
                      "a privileged instruction raises #GP in user mode; the SIGSEGV would report the trampoline's "
                      "address instead of A")
    return (privileged,) + tuple(changed.get(r.name, r) for r in RULES if r.name not in ("sti", "endbr"))


USER_RULES: tuple[Rule, ...] = _user_rows()

#: The tables by name: the kernel's (kinst, kprobes) and user space's (fasttrap, uprobes).
POLICIES: dict[str, tuple[Rule, ...]] = {"kernel": RULES, "user": USER_RULES}

#: Bytes the decoders read differently that no relocation needs to agree on: each row names the row
#: of the table whose reason applies whatever the length, since that row rejects the instruction.
#: (predicate over the decoders' answers, row name, what the decoders disagree on)
DISAGREEMENTS: tuple[tuple[Callable[[tuple], bool], str, str], ...] = (
    (lambda answers: any(a.length for a in answers) and all(a.text.split()[:1] == ["ud0"] for a in answers if a.length),
     "ud", "the decoders that read it read ud0, and differ only on its length, which is the vendor's: Intel's "
     "ud0 takes a ModRM byte, AMD's does not (SDM Vol. 2B, UD; AMD APM Vol. 3, UD0)"),
)


def classify_disagreement(answers: tuple, rules: tuple[Rule, ...] = RULES) -> tuple[Rule, str] | None:
    """The rejecting row (and why the disagreement does not matter) for bytes the decoders read
    differently, or None when it matters (see ``DISAGREEMENTS``)."""
    for matches, name, why in DISAGREEMENTS:
        if matches(answers):
            rule = next(r for r in rules if r.name == name)
            assert rule.strategy == "reject", "a disagreement is only ever rejected"
            return rule, why
    return None


_CLASSIFIED: dict[tuple[int, bytes], Rule] = {}


def classify(insn: Instruction, rules: tuple[Rule, ...] = RULES) -> Rule:
    """The first row of ``rules`` that matches.  No predicate looks at the
    address, so the answer is memoised by the table and the instruction's bytes."""
    key = (id(rules), insn.raw)
    rule = _CLASSIFIED.get(key)
    if rule is None:
        rule = next(r for r in rules if r.matches(insn))
        if len(_CLASSIFIED) >= 200_000:
            _CLASSIFIED.clear()
        _CLASSIFIED[key] = rule
    return rule

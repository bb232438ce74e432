"""Validate instruction forms on this machine's CPU: the table ``proof.form_table`` reads.

For each form (``proof.forms``) the caller gives real instances (kernel or
corpus bytes).  Each instance is made runnable at ``CODE_AT`` in user space
without changing its form (``instance_variants``): a RIP-relative or absolute
displacement re-aimed into the data arena (with aligned and misaligned
targets), a branch offset pointed at a landing pad, and for the integer
immediates a form leaves out (``forms.IMMEDIATE_BLIND``) the edge values 0, 1,
2, the width minus one, the width and a random one.  States come from
``concrete.states`` (random and edge registers, vectors and a floating-point form's memory operands with NaNs, MXCSR and
x87 variations, every access placed in the arena).  Each state runs on the
CPU (``concrete.cpu``) and through the proof's semantics
(``proof.evaluation``); ``compare`` names what differs.

A form is ``exact`` when nothing differed, ``loose`` when only outputs
differed (the categories are kept: e.g. ``undefined flags``, ``floating
point``, ``mxcsr status``, ``memory``, ``fault``), ``failed`` when the control
flow differed, the semantics has no answer, the form cannot run in user mode
(privileged, x87/MMX, segment registers, nondeterministic), or no state could
be placed.

Only the state this CPU has is compared (``concrete.cpu``: under a feature
mask, the state it hides): without AVX-512, zmm16-31, k0-7 and zmm0-15 above
bit 255 are neither loaded (``cpu.trim_state``) nor compared, and a result
says so in ``unseen``.  A form needing a CPUID feature this CPU lacks (or the
mask hides) is not run: its result is ``failed`` with ``lacks`` set, and is
no reading of the form (``selftest.form_merge`` keeps the table's row as it
was).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

import iced_x86 as iced

from ..concrete import cpu, states as ST
from ..concrete import edge_operands as EO  # issue 41: every validation runs its class's edge operands
from ..concrete.cpu_identity import FEATURE_MASK_ENV, current_mask
from ..concrete.native import missing_features
from ..concrete.outcome import MachineState, Outcome
from ..processes import fork_map
from ..proof import evaluation as EV
from ..proof import semantics as S
from ..proof.forms import IMMEDIATE_BLIND, InsnFacts, facts
from ..proof.lifter_checks import loose_reasons
from ..x86.decode import decode
from ..x86.instruction import Instruction
from ..x86.registers import GPR64, MASK64

CODE_AT = 0x30000100  # within rel32 reach of the arena, so a RIP-relative operand can be aimed into it
RFLAG_BITS = {"CF": 0, "PF": 2, "AF": 4, "ZF": 6, "SF": 7, "OF": 11}
ICED_FLAG = {"CF": iced.RflagsBits.CF, "PF": iced.RflagsBits.PF, "AF": iced.RflagsBits.AF,
             "ZF": iced.RflagsBits.ZF, "SF": iced.RflagsBits.SF, "OF": iced.RflagsBits.OF}
SIGNAL_FAULTS = {"SIGSEGV": {"#GP", "#PF", "#SS"}, "SIGBUS": {"#AC", "#GP"}, "SIGILL": {"#UD"},
                 "SIGFPE": {"#DE", "#XM", "#MF"}, "SIGTRAP": {"#BP", "#DB"}}
VEX_FAULTS = {"Ijk_SigSEGV": "#GP", "Ijk_SigILL": "#UD", "Ijk_SigFPE_IntDiv": "#DE", "Ijk_SigTRAP": "#BP"}

#: Forms the CPU judge does not run, by what they touch, with why.
NOT_RUN = (
    (lambda f: f.x87, "x87/MMX state: VEX keeps the stack as 64-bit doubles and has no FSW exception flags, ES or B; "
                      "its model of these is not compared"),
)
_PRIVILEGED = frozenset("cli sti hlt in out insb insw insd outsb outsw outsd lgdt lidt lldt ltr wrmsr rdmsr swapgs "
                        "sysret sysexit iret iretd iretq invlpg wbinvd invd clts lmsw rdpmc xsetbv monitor mwait stac "
                        "clac invpcid wrpkru syscall sysenter int int1 int3 into hlt ud0 ud1 ud2 vmcall vmmcall "
                        "vmlaunch vmresume vmxoff vmfunc vmrun vmload vmsave stgi clgi skinit invlpga vmptrld "
                        "vmptrst vmclear vmread vmwrite invept invvpid rdtsc rdtscp rdrand rdseed rdpid cpuid "
                        "sgdt sidt sldt str smsw lar lsl verr verw xgetbv rdfsbase rdgsbase wrfsbase wrgsbase rdpkru "
                        "lfs lgs lss xsave xsave64 xsaveopt xsaveopt64 xsavec xsavec64 xsaves xsaves64 xrstor "
                        "xrstor64 xrstors xrstors64 fxsave fxsave64 fxrstor fxrstor64 enclu encls enclv tpause "
                        "umwait umonitor xbegin xend xabort xtest serialize clui stui senduipi uiret testui "
                        "hreset incsspq rdsspq saveprevssp rstorssp wrssq wrussq setssbsy clrssbsy endbr64".split())
_RUN_AS_IS = frozenset({"endbr64"})  # a hint in user mode without CET: runs as a NOP


def not_run(f: InsnFacts) -> str | None:
    """Why the judge does not run instances of this form in user mode (None: it does)."""
    for test, why in NOT_RUN:
        if test(f):
            return why
    if f.mnemonic in _PRIVILEGED and f.mnemonic not in _RUN_AS_IS:
        return (f"{f.mnemonic}: privileged, system state, or not a function of the registers and memory the judge "
                f"sets (CPL 0 only, descriptor tables, time stamp, random numbers, TSX, CPUID)")
    if "sreg" in f.code.lower() or any(s in f.form for s in ("es:", "cs:", "ss:", "ds:", "fs:", "gs:")) \
            and " m" not in f.form.split("|")[0]:
        return "reads or loads a segment register: selectors and descriptors are host state"
    if f.flow in ("interrupt", "exception"):
        return "raises an exception or interrupt by design"
    if any(k in f.form.split("|")[0] for k in ("k:", "zmm", "xmmh", "ymmh")) or f.code.startswith("EVEX_"):
        return "AVX-512 (EVEX, mask registers): pyvex has no zmm or k registers"
    if f.code.startswith(("XOP_", "D3NOW_")) or "FMA4" in {x for x in f.features}:
        return "an AMD-only encoding (XOP, FMA4, 3DNow!) that pyvex does not lift"
    if f.flow == "call" and "far" in f.code.lower() or "FAR" in f.code:
        return "far transfer: loads CS"
    return None


# ---------------------------------------------------------------------------
# Instances made runnable
# ---------------------------------------------------------------------------


def _patch(raw: bytes, offset: int, size: int, value: int) -> bytes:
    return raw[:offset] + (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little") + raw[offset + size:]


def instance_variants(raw: bytes, rng: random.Random) -> list[bytes]:
    """Copies of ``raw`` of the same form that can run at ``CODE_AT`` (see the module doc)."""
    dec = iced.Decoder(64, raw, ip=CODE_AT)
    ins = dec.decode()
    co = dec.get_constant_offsets(ins)
    out = [raw]
    if co.has_displacement:
        if ins.is_ip_rel_memory_operand:
            targets = [ST.ARENA + ST.ARENA_SIZE // 2, ST.ARENA + ST.ARENA_SIZE // 2 + rng.choice((1, 4, 8, 12))]
            out = [_patch(raw, co.displacement_offset, co.displacement_size, t - (CODE_AT + len(raw)))
                   for t in targets]
        elif ins.memory_base == iced.Register.NONE and ins.memory_index == iced.Register.NONE \
                and ins.segment_prefix not in (iced.Register.FS, iced.Register.GS):
            targets = [ST.ARENA + ST.ARENA_SIZE // 2, ST.ARENA + ST.ARENA_SIZE // 2 + rng.choice((1, 4, 8, 12))]
            out = [_patch(raw, co.displacement_offset, co.displacement_size, t) for t in targets]
    if co.has_immediate and ins.op_count and ins.op0_kind in (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32,
                                                               iced.OpKind.NEAR_BRANCH64):
        out = [_patch(r, co.immediate_offset, co.immediate_size, 0x40 if co.immediate_size == 1 else 0x1000)
               for r in out]
    elif co.has_immediate and not co.has_immediate2:
        mnemonic = {v: k.lower() for k, v in vars(iced.Mnemonic).items() if k.isupper()}[ins.mnemonic]
        if mnemonic in IMMEDIATE_BLIND:
            width = 8 * max(iced.MemorySizeExt.size(ins.memory_size), 1) if ins.op_count and \
                ins.op0_kind == iced.OpKind.MEMORY else 64
            values = {0, 1, 2, width - 1, width, rng.getrandbits(8 * co.immediate_size)}
            out = [_patch(r, co.immediate_offset, co.immediate_size, v) for r in out for v in sorted(values)]
    return list(dict.fromkeys(out))


def program_for(raw: bytes) -> cpu.Program:
    """The CPU judge's program for one instruction at ``CODE_AT``: pads at its fall-through, its
    direct target and ``states.PAD`` (indirect transfers)."""
    ins = iced.Decoder(64, raw, ip=CODE_AT).decode()
    exits = {CODE_AT + len(raw), ST.PAD}
    if ins.op_count and ins.op0_kind in (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32,
                                         iced.OpKind.NEAR_BRANCH64):
        exits.add(ins.near_branch_target)
    return cpu.Program(((CODE_AT, raw),), CODE_AT, tuple(sorted(exits)), ((ST.ARENA, ST.ARENA_SIZE),))


# ---------------------------------------------------------------------------
# Comparing one state
# ---------------------------------------------------------------------------


def fault_class(fault: str | None) -> frozenset[str] | None:
    if fault is None:
        return None
    if fault.startswith("signal "):
        return frozenset(SIGNAL_FAULTS.get(fault.split()[1], {fault}))
    return frozenset({VEX_FAULTS.get(fault, fault)})


def is_floating_point(raw: bytes) -> bool:
    """VEX computes floating point for this instruction (its IR has an F32/F64 operation)."""
    d = decode(raw, CODE_AT)
    return isinstance(d, Instruction) and any("floating point" in r for r in loose_reasons(d))


def compare(cpu_out: Outcome, sem: Outcome, state: MachineState, raw: bytes, f: InsnFacts, fp: bool) -> set[str]:
    """What differs between the CPU's outcome and the semantics', as categories."""
    fc, fs = fault_class(cpu_out.fault), fault_class(sem.fault)
    if fc or fs:
        if fc is None or fs is None or not fc & fs:
            return {"fault"}
        return set()
    diffs = set()
    if cpu_out.next_rip != sem.next_rip:
        return {"control flow"}
    cregs, sregs, inputs = cpu_out.registers, sem.registers, state.registers
    undefined = iced.Decoder(64, raw).decode().rflags_undefined
    for r in GPR64:
        if sregs[r] is None:
            diffs.add("unspecified")
        elif cregs[r] != sregs[r]:
            diffs.add("register")
    if sregs["rflags"] is None:
        diffs.add("unspecified")
    else:
        for name, bit in RFLAG_BITS.items():
            if (cregs["rflags"] ^ sregs["rflags"]) >> bit & 1:
                diffs.add("undefined flags" if undefined & ICED_FLAG[name] else "flags")
        if (cregs["rflags"] ^ sregs["rflags"]) & (0x400 | 1 << 18):
            diffs.add("flags")
    for base in ("fs_base", "gs_base"):
        if sregs[base] is not None and cregs.get(base, sregs[base]) != sregs[base]:
            diffs.add("segment base")
    if sregs["mxcsr"] is None:
        diffs.add("unspecified")
    else:
        changed = cregs["mxcsr"] ^ sregs["mxcsr"]
        if changed & 0x3F:
            diffs.add("mxcsr status")
        if changed & ~0x3F:
            diffs.add("mxcsr control")
    layout = cpu.xsave_layout()  # the state this CPU has (under the feature mask): nothing else is compared
    seen = (1 << layout.vector_bits) - 1
    for i in range(16):
        s = sregs[f"zmm{i}"]
        c = cregs[f"zmm{i}"]
        if s is None:
            diffs.add("unspecified" if not fp else "floating point")
            continue
        if (c ^ s) & seen & ((1 << 256) - 1):
            diffs.add("floating point" if fp else "vector")
        if ((c ^ s) & seen) >> 256:
            diffs.add("zmm upper")
    if layout.avx512:
        for i in range(16, 32):
            if cregs.get(f"zmm{i}") != cpu.vector(inputs, i):
                diffs.add("avx-512 state")
        for i in range(8):
            if cregs.get(f"k{i}") != inputs.get(f"k{i}", 0):
                diffs.add("avx-512 state")
    for name in ("fcw", "fsw", "ftw") + tuple(f"st{i}" for i in range(8)):
        if cregs.get(name) != inputs.get(name, cpu.FCW_DEFAULT if name == "fcw" else 0):
            diffs.add("x87 state")
    swrites = {a: v for a, v in sem.writes.items() if state.memory.get(a, 0) != v}
    if any(v is None for v in swrites.values()):
        diffs.add("unspecified")
    elif cpu_out.writes != swrites:
        diffs.add("memory")
    return diffs


# ---------------------------------------------------------------------------
# One form
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FormResult:
    form: str
    status: str  # exact | loose | failed
    loose: tuple[str, ...]
    states: int
    instances: tuple[str, ...]
    example: str = ""  # one differing state, for the record
    lacks: tuple[str, ...] = ()  # CPUID features the form needs that this CPU lacks: not run, no reading
    unseen: tuple[str, ...] = ()  # the state this CPU has not, so not compared (``cpu.unseen``)

    def as_json(self) -> dict:
        row = {"status": self.status, "states": self.states, "instances": list(self.instances)}
        if self.loose:
            row["loose"] = list(self.loose)
        if self.example:
            row["example"] = self.example
        return row


def validate_form(form: str, instances: list[bytes], states_per_variant: int = 8, seed: int = 0,
                  max_variants: int = 12, edge_operands: bool = True) -> FormResult:
    """Run instances of ``form`` on the CPU and through the semantics; see the module doc.  ``edge_operands``
    (always, but in a test that shows what random states alone miss): the form's class's edge operands
    too (``concrete.edge_operands``: its edge immediates as more variants, its edge states once per immediate)."""
    rng = random.Random(f"{seed}:{form}")
    f = facts(instances[0])
    shown = tuple(r.hex() for r in instances[:4])
    if f is None:
        return FormResult(form, "failed", ("the CPU does not decode it as one instruction",), 0, shown)
    why = not_run(f)
    if why is not None:
        return FormResult(form, "failed", (why,), 0, shown)
    lacking = missing_features(sorted(f.features))
    if lacking:
        mask = current_mask()
        hidden = f" (hidden by {FEATURE_MASK_ENV}={mask.describe()})" if mask.hidden else ""
        return FormResult(form, "failed", (f"not run: needs {', '.join(lacking)}, which this CPU lacks{hidden}",),
                          0, shown, lacks=tuple(lacking))
    unseen = cpu.unseen()
    fp = is_floating_point(instances[0])
    variants = [v for raw in instances[:4] for v in instance_variants(raw, rng)][:max_variants]
    if edge_operands and variants:  # edge operands (concrete.edge_operands), beyond max_variants: exact needs them
        variants += [v for v in EO.edge_immediates(variants[0]) if v not in variants]
    edged: set[int | None] = set()  # the immediates whose variant has run the edge states: each once
    categories: set[str] = set()
    total = edges = 0  # edges: the states placed so far (``states.place``'s ``fp_edge``)
    example = ""
    for raw in variants:
        placed = []
        for _ in range(states_per_variant * 4):
            if len(placed) == states_per_variant:
                break
            regs = ST.random_registers(rng)
            s = ST.place(raw, CODE_AT, ST.edge_vectors(regs, edges) if fp else regs, rng,
                         fp_edge=edges if fp else None)
            if s is not None:
                placed.append(s)
                edges += 1
        if edge_operands and EO.immediate_of(raw) not in edged:  # issue 41: the class's edge operands
            edged.add(EO.immediate_of(raw))
            placed += EO.edge_states(raw, CODE_AT, rng)
        if not placed:
            continue
        placed = [cpu.trim_state(s) for s in placed]  # the state this CPU loads, for both sides
        try:
            first = EV.evaluate(raw, CODE_AT, placed)
            sem = [_iterate(raw, s, o) if o.next_rip == CODE_AT and not o.fault else o for s, o in zip(placed, first)]
        except S.Gap as gap:
            return FormResult(form, "failed", (f"semantics: {gap.reason}",), total, shown)
        except EV.Unevaluable as exc:
            return FormResult(form, "failed", (f"semantics not evaluable here: {exc}",), total, shown)
        outs = cpu.run_on_cpu(program_for(raw), placed)
        for state, c, s in zip(placed, outs, sem):
            total += 1
            d = compare(c, s, state, raw, f, fp)
            if d - categories and not example:
                example = f"{raw.hex()}: {', '.join(sorted(d))}"
            categories |= d
    if total == 0:
        return FormResult(form, "failed", ("no state places every memory access in the arena",), 0, shown,
                          unseen=unseen)
    if "control flow" in categories:
        return FormResult(form, "failed", ("the control flow differs from the CPU's",), total, shown, example,
                          unseen=unseen)
    if categories:
        return FormResult(form, "loose", tuple(sorted(categories)), total, shown, example, unseen=unseen)
    return FormResult(form, "exact", (), total, shown, unseen=unseen)


def _iterate(raw: bytes, state: MachineState, out: Outcome, limit: int = 64) -> Outcome:
    """``out``, the semantics of one instruction on ``state``, repeated while it jumps back to itself
    (a rep string instruction runs one iteration per VEX block), as the CPU runs it to the end."""
    writes: dict[int, int] = {}
    for _ in range(limit):
        if out.fault or out.next_rip != CODE_AT:
            break
        writes.update(out.writes)
        regs = {**state.registers, **{k: v for k, v in out.registers.items() if v is not None}}
        state = MachineState(regs, {**state.memory, **{a: v for a, v in out.writes.items() if v is not None}})
        out = EV.evaluate(raw, CODE_AT, [state])[0]
    return Outcome(out.registers, out.next_rip, {**writes, **out.writes}, out.fault)


def _worker(args):
    form, instances, n, seed = args
    return validate_form(form, [bytes.fromhex(h) for h in instances], n, seed)


def validate_forms(forms: dict[str, list[bytes]], states_per_variant: int = 8, seed: int = 0, jobs: int = 1,
                   progress=None) -> dict[str, FormResult]:
    """Validate every form (in worker processes when ``jobs`` > 1)."""
    work = [(form, [r.hex() for r in rs], states_per_variant, seed) for form, rs in sorted(forms.items())]
    # A worker is renewed after 200 forms: what angr and z3 keep between calls only grows.
    done = fork_map(_worker, work, jobs, chunksize=4, renew_after=200, progress=progress)
    return {r.form: r for r in done}


def _pack_check() -> None:  # keep struct and MASK64 used for readers of this module's helpers
    struct.pack("<Q", MASK64)

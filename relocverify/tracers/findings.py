"""The tracers with the fixes of ``docs/findings/`` applied: models and the patched kernel code.

Each reproduced ``tracer-wrong`` group of the 6.1 audit that is still in the newest upstream source
has a patch in ``docs/findings/NN-name.patch`` (against upstream).  The same change is written here
twice, and the two are checked against each other:

* as source edits (``EDITS``): each a piece of one function's text and what replaces it, applied
  to the function cut out of the user's kernel source package, as ``tracers.compiled`` cuts the
  unpatched ones, and compiled with the kernel's own decoder (``library``, ``xol_library``);
* as models (``KPROBES_6_1``, ``OPTPROBES_6_1``, ``UPROBES_6_1``, audited as
  ``kprobes@6.1+findings``, ...): the 6.1 models with the decision each patch changes.

``compare`` runs the patched C and the patched model over the same instructions and counts where
they differ (``tests/test_findings.py`` over the groups' real bytes, and a whole kernel by hand).

| patch | file, function | what the patched kernel does |
|---|---|---|
| 01 | core.c ``kprobe_emulate_call`` | pushes A+len, not A+5, for a prefixed ``call rel32`` |
| 02 | core.c ``prepare_emulation`` | single-steps every VEX/EVEX instruction (``insn_is_avx``) |
| 03 | core.c ``prepare_emulation`` | refuses a far return (ca, cb) with -EOPNOTSUPP |
| 04 | core.c ``can_boost`` | never boosts (copies) a far return into an optimized probe |
| 05 | uprobes.c ``branch_setup_xol_ops`` | never emulates a VEX/EVEX instruction as a branch |

GPL-2.0 code is only built on this machine from the user's source package, as in ``compiled``.
"""

from __future__ import annotations

import array
import ctypes
import itertools
import re
import tarfile
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from ..errors import InputError
from ..plan.effects import Const, Push
from ..x86.decoders import linux_insn
from ..x86.registers import MASK64
from . import compiled
from . import linux_facts as lf
from .kprobes import CORE, Kprobes
from .kprobes_6_1 import SOURCE as KPROBES_SOURCE_6_1
from .model import Cite, Emulate, Refuse
from .optprobes import SOURCE_6_1 as OPTPROBES_SOURCE_6_1, Optprobes
from .uprobes import UPROBES, Uprobes, UprobesSource

TEXT_PATCHING = "arch/x86/include/asm/text-patching.h"
FAR_RETURNS = (0xCA, 0xCB)


@dataclass(frozen=True)
class Edit:
    """One change of a finding's patch to one function: ``old`` (the first of the alternatives found in
    the function's text; the versions differ around some anchors) becomes ``new``."""

    patch: str  # the file under docs/findings
    file: str
    function: str
    old: tuple[str, ...]
    new: tuple[str, ...]  # the replacement for the alternative at the same position
    reason: str


_VEX_COMMENT = ("\t/*\n"
                "\t * A VEX/EVEX-encoded instruction has its opcode map in the prefix, so\n"
                "\t * opcode.bytes[0] is not a one-byte opcode: c5 fa 7f 07 (vmovdqu\n"
                "\t * %xmm0,(%rdi)) has bytes[0] == 0x7f, which is not \"jg\".  None of them\n"
                "\t * changes ip or IF: single-step them.\n"
                "\t */\n")

EDITS = (
    Edit("01-kprobes-prefixed-call.patch", CORE, "kprobe_emulate_call",
         ("\tint3_emulate_call(regs, func);\n",),
         ("\t/*\n"
          "\t * int3_emulate_call() pushes the address after a 5-byte call; a\n"
          "\t * prefixed one (2e e8 rel32, -mindirect-branch-cs-prefix) is 6 bytes.\n"
          "\t */\n"
          "\tint3_emulate_push(regs, regs->ip - INT3_INSN_SIZE + p->ainsn.size);\n"
          "\tint3_emulate_jmp(regs, func);\n",),
         "the callee of a 6-byte 'cs call' returned to A+5, the call's last byte"),
    Edit("02-kprobes-vex.patch", CORE, "prepare_emulation",
         ("\tinsn_byte_t opcode = insn->opcode.bytes[0];\n\n\tswitch (opcode) {\n",),
         ("\tinsn_byte_t opcode = insn->opcode.bytes[0];\n\n" + _VEX_COMMENT
          + "\tif (insn_is_avx(insn)) {\n\t\tp->ainsn.size = insn->length;\n\t\treturn 0;\n\t}\n\n"
          "\tswitch (opcode) {\n",),
         "a VEX instruction whose opcode byte is 70-7f (e8, e9, eb, c2, ...) was emulated as that one-byte "
         "opcode"),
    Edit("03-kprobes-far-ret.patch", CORE, "prepare_emulation",
         ("\tcase 0xc2:\t/* ret/lret */\n\tcase 0xc3:\n\tcase 0xca:\n\tcase 0xcb:\n"
          "\t\tp->ainsn.emulate_op = kprobe_emulate_ret;\n\t\tbreak;\n",),
         ("\tcase 0xc2:\t/* ret */\n\tcase 0xc3:\n"
          "\t\tp->ainsn.emulate_op = kprobe_emulate_ret;\n\t\tbreak;\n"
          "\tcase 0xca:\t/* far ret -- segment is not supported */\n\tcase 0xcb:\n",),
         "int3_emulate_ret pops 8 bytes: lret's CS stayed on the stack and became the next return address"),
    Edit("04-optprobes-far-ret.patch", CORE, "can_boost",
         ("\tcase 0x9a:\t\t/* Call far */\n",),
         ("\tcase 0x9a:\t\t/* Call far */\n\tcase 0xca ... 0xcb:\t/* far RET: reloads CS */\n",),
         "an optimized probe copied 'push; lretq' and the far return came back into the jump's bytes"),
    Edit("05-uprobes-vex.patch", UPROBES, "branch_setup_xol_ops",
         ("\tif (insn_is_nop(insn))\n", "\tswitch (opc1) {\n"),
         ("\t/* VEX/EVEX: OPCODE1() is in another opcode map, never a branch or a nop */\n"
          "\tif (insn_is_avx(insn))\n\t\treturn -ENOSYS;\n\n\tif (insn_is_nop(insn))\n",
          "\t/* VEX/EVEX: OPCODE1() is in another opcode map, never a branch or a nop */\n"
          "\tif (insn_is_avx(insn))\n\t\treturn -ENOSYS;\n\n\tswitch (opc1) {\n"),
         "vpcmpeqb (c5 fd 74 0f) was emulated as 'je', a store (c5 f9 7f) as 'jg'"),
)


def patched(text: str, function: str, edits=EDITS) -> str:
    """``text`` (one function, as ``compiled.cut_definition`` gives it) with every edit of ``function`` applied;
    an edit whose anchors are all missing, or found more than once, is an input error (the source
    changed under the patch)."""
    for e in edits:
        if e.function != function:
            continue
        for old, new in zip(e.old, e.new):
            if text.count(old) == 1:
                text = text.replace(old, new)
                break
        else:
            raise InputError(f"{e.patch}: no single place in {function} to apply it: the source changed")
    return text


# -- the models ---------------------------------------------------------------------------------------------

class FindingsKprobes(Kprobes):
    """kprobes with patches 01-04 (their decisions; everything else is the model it extends)."""

    def emulation(self, d, stream: bytes, a: int, tramp: int):
        if d.vex:  # 02: insn_is_avx: single-stepped
            return None
        if d.opcode[0] in FAR_RETURNS:  # 03
            return Refuse("-EOPNOTSUPP: far ret -- segment is not supported (docs/findings/03)",
                          Cite(CORE, "prepare_emulation", "case 0xca, 0xcb: return -EOPNOTSUPP"))
        answer = super().emulation(d, stream, a, tramp)
        if d.opcode[0] == 0xE8 and isinstance(answer, Emulate):  # 01: push A+len
            push, jump = answer.effects
            assert isinstance(push, Push)
            return Emulate((Push(Const((a + d.length) & MASK64)), jump),
                           Cite(CORE, "kprobe_emulate_call", "int3_emulate_push(regs, regs->ip - INT3_INSN_SIZE + "
                                "p->ainsn.size) (docs/findings/01)"))
        return answer

    def can_boost(self, d, stream: bytes) -> bool:
        if len(d.opcode) == 1 and d.opcode[0] in FAR_RETURNS:  # 04
            return False
        return super().can_boost(d, stream)


class FindingsUprobes(Uprobes):
    """uprobes with patch 05."""

    def branch_answer(self, d, stream, a, nxt):
        if d.vex:  # 05: insn_is_avx: -ENOSYS, not a branch
            return None
        return super().branch_answer(d, stream, a, nxt)


_SUFFIX = "+findings"
KPROBES_6_1 = FindingsKprobes(replace(
    KPROBES_SOURCE_6_1, version="6.1" + _SUFFIX,
    source=KPROBES_SOURCE_6_1.source + " with docs/findings 01-04 applied"))
OPTPROBES_6_1 = Optprobes(replace(OPTPROBES_SOURCE_6_1, version="6.1" + _SUFFIX, kprobes=KPROBES_6_1))
UPROBES_6_1 = FindingsUprobes(UprobesSource("6.1" + _SUFFIX, "6.1",
                                            "linux-source-6.1 (6.1.192) arch/x86/kernel/uprobes.c with "
                                            "docs/findings 05 applied"))


# -- the kernel's code, patched and compiled --------------------------------------------------------------

def source_files(spec: str, rels: tuple[str, ...]) -> dict[str, str]:
    """The files ``rels`` of the kernel source ``spec`` (a tree or a tarball, as ``linux_insn`` finds it)."""
    src = linux_insn.locate(spec)
    if src.kind == "tree":
        return {rel: (Path(src.path) / rel).read_text() for rel in rels}
    out = {}
    with tarfile.open(src.path) as tar:
        for member in tar:
            rel = member.name.split("/", 1)[-1]
            if rel in rels:
                out[rel] = tar.extractfile(member).read().decode()
                if len(out) == len(rels):
                    break
    missing = set(rels) - set(out)
    if missing:
        raise InputError(f"not in the kernel source {spec}: {', '.join(sorted(missing))}")
    return out


KPROBES_SHIMS = r"""
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <stdbool.h>
#include <insn.c>
#include <inat.c>
#define fallthrough do { } while (0)
#define CONFIG_X86_64 1
#define INT3_INSN_SIZE 1
#define CALL_INSN_SIZE 5
#define NOKPROBE_SYMBOL(x)
#define test_bit(nr, addr) ((((const uint32_t *)(addr))[(nr) / 32] >> ((nr) % 32)) & 1)
#define search_exception_tables(a) ((void *)0)
typedef int8_t s8;
typedef int16_t s16;
typedef int32_t s32;
typedef uint32_t u32;
typedef uint8_t kprobe_opcode_t;
#define W(row, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, ba, bb, bc, bd, be, bf)\
	(((b0##UL << 0x0)|(b1##UL << 0x1)|(b2##UL << 0x2)|(b3##UL << 0x3) |   \
	  (b4##UL << 0x4)|(b5##UL << 0x5)|(b6##UL << 0x6)|(b7##UL << 0x7) |   \
	  (b8##UL << 0x8)|(b9##UL << 0x9)|(ba##UL << 0xa)|(bb##UL << 0xb) |   \
	  (bc##UL << 0xc)|(bd##UL << 0xd)|(be##UL << 0xe)|(bf##UL << 0xf))    \
	 << (row % 32))
/* the registers the emulators read and write (arch/x86/include/asm/ptrace.h names) */
struct pt_regs { unsigned long ip, sp, flags; };
/* arch/x86/include/asm/kprobes.h struct arch_specific_insn, the fields prepare_emulation sets */
struct arch_specific_insn {
	unsigned char size;
	union {
		unsigned char opcode;
		struct { unsigned char type; } jcc;
		struct { unsigned char type; unsigned char asize; } loop;
		struct { unsigned char reg; } indirect;
	};
	s32 rel32;
	void (*emulate_op)(struct kprobe *p, struct pt_regs *regs);
};
struct kprobe { struct arch_specific_insn ainsn; };
static volatile int tc_which;
/* every emulator but kprobe_emulate_call, which is compiled from the source, as a stub */
static void kprobe_emulate_ifmodifiers(struct kprobe *p, struct pt_regs *r) { tc_which = 1; }
static void kprobe_emulate_ret(struct kprobe *p, struct pt_regs *r) { tc_which = 2; }
static void kprobe_emulate_jmp(struct kprobe *p, struct pt_regs *r) { tc_which = 4; }
static void kprobe_emulate_jcc(struct kprobe *p, struct pt_regs *r) { tc_which = 5; }
static void kprobe_emulate_loop(struct kprobe *p, struct pt_regs *r) { tc_which = 6; }
static void kprobe_emulate_call_indirect(struct kprobe *p, struct pt_regs *r) { tc_which = 7; }
static void kprobe_emulate_jmp_indirect(struct kprobe *p, struct pt_regs *r) { tc_which = 8; }
"""

KPROBES_GLUE = r"""
/* per instruction at addrs[i]: o[0] prepare_emulation's return, o[1] the emulator (compiled.EMULATORS'
 * numbers; 3 is the compiled kprobe_emulate_call, run with regs->ip = A + 1 as after the int3), o[2] rel32,
 * o[3] the opcode/condition byte, o[4] can_boost, o[5] ip after the emulated call, o[6] the address it pushed */
long tc_findings(const unsigned char *blob, const int32_t *offsets, const uint8_t *lengths, const uint64_t *addrs,
		 long n, int64_t *out)
{
	long i;
	for (i = 0; i < n; i++) {
		struct insn insn;
		struct kprobe p;
		u8 buf[16];
		int64_t *o = out + 7 * i;
		memset(&p, 0, sizeof(p));
		memset(buf, 0, 16);
		memcpy(buf, blob + offsets[i], lengths[i]);
		memset(o, 0, 7 * sizeof(*o));
		if (insn_decode(&insn, buf, 16, INSN_MODE_64) < 0) {
			o[0] = -9999;
			continue;
		}
		o[0] = prepare_emulation(&p, &insn);
		o[4] = can_boost(&insn, (void *)(uintptr_t)addrs[i]);
		tc_which = 0;
		if (p.ainsn.emulate_op == kprobe_emulate_call) {
			unsigned long stack[4] = {0, 0, 0, 0};
			struct pt_regs regs = { addrs[i] + 1, (unsigned long)&stack[4], 0 };
			kprobe_emulate_call(&p, &regs);
			tc_which = 3;
			o[5] = regs.ip;
			o[6] = stack[3];
		} else if (p.ainsn.emulate_op) {
			p.ainsn.emulate_op(&p, 0);
		}
		o[1] = tc_which;
		o[2] = p.ainsn.rel32;
		o[3] = p.ainsn.opcode;
	}
	return n;
}
"""

#: what goes into the kprobes unit: (file, name), in order; the functions are cut and patched.
KPROBES_PIECES = ((TEXT_PATCHING, "int3_emulate_jmp"), (TEXT_PATCHING, "int3_emulate_push"),
                  (TEXT_PATCHING, "int3_emulate_call"), (CORE, "twobyte_is_boostable"), (CORE, "can_boost"),
                  (CORE, "kprobe_emulate_call"), (CORE, "prepare_emulation"))


def _unit(spec: str, pieces, head: str, tail: str, apply: bool) -> str:
    files = source_files(spec, tuple(sorted({f for f, _ in pieces})))
    parts = [head]
    for f, name in pieces:
        text = compiled.cut_definition(files[f], name)
        parts.append((patched(text, name) if apply else text) + "\n")
    parts.append(tail)
    return "\n".join(parts)


@lru_cache(maxsize=8)
def library(spec: str, apply: bool = True):
    """kprobes' decisions compiled from the ``spec`` source, with patches 01-04 applied (``apply``) or not."""
    stem = "findings-kprobes" + ("-patched" if apply else "")
    key = KPROBES_SHIMS + KPROBES_GLUE + repr(EDITS if apply else ()) + spec
    lib = compiled.compiled_library(spec, stem, "kprobes' patched decisions",
                             key, lambda: _unit(spec, KPROBES_PIECES, KPROBES_SHIMS, KPROBES_GLUE, apply))
    handle = ctypes.CDLL(lib)
    handle.tc_findings.restype = ctypes.c_long
    handle.tc_findings.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                                   ctypes.c_long, ctypes.c_void_p]
    return handle


@dataclass(frozen=True)
class KprobesDecision:
    """What the compiled kprobes code decided for one instruction."""

    ret: int  # prepare_emulation: 0, -EOPNOTSUPP (-95); -9999 when the decoder fails
    emulator: int  # compiled.EMULATORS' number, 0 single-stepped
    rel32: int
    byte: int
    can_boost: bool
    call_ip: int  # kprobe_emulate_call: the new ip and the pushed return address
    call_pushed: int


def kprobes_decisions(spec: str, items: list[tuple[int, bytes]], apply: bool = True) -> list[KprobesDecision]:
    lib = library(spec, apply)
    n = len(items)
    raws = [r[:15] for _, r in items]
    lengths = bytes(map(len, raws))
    offsets = array.array("i", itertools.accumulate(lengths, initial=0))
    addrs = array.array("Q", [a for a, _ in items])
    out = (ctypes.c_int64 * (7 * n))()
    lib.tc_findings(b"".join(raws), offsets.buffer_info()[0], lengths, addrs.buffer_info()[0], n, out)
    vals = list(out)
    return [KprobesDecision(v[0], v[1], v[2], v[3], bool(v[4]), v[5] & MASK64, v[6] & MASK64)
            for v in (vals[7 * i:7 * i + 7] for i in range(n))]


@lru_cache(maxsize=8)
def xol_library(spec: str, apply: bool = True):
    """uprobes' branch_setup_xol_ops and push_setup_xol_ops from the ``spec`` source, patch 05 applied or
    not, with ``compiled``'s shims and glue (``tc_xol``)."""
    def text() -> str:
        source = source_files(spec, (UPROBES,))[UPROBES]
        m = re.search(r"^#define CASE_COND.*?(?=^static bool is_cond_jmp_opcode)", source, re.S | re.M)
        if m is None:
            raise InputError("uprobes.c's CASE_COND macros not found: the source layout changed")
        branch = compiled.cut_definition(source, "branch_setup_xol_ops")
        return "\n".join([compiled.XOL_SHIMS, m.group(0), compiled.cut_definition(source, "is_cond_jmp_opcode"),
                          compiled.cut_definition(source, "branch_clear_offset"),
                          patched(branch, "branch_setup_xol_ops") if apply else branch,
                          compiled.cut_definition(source, "push_setup_xol_ops"), compiled.XOL_GLUE])

    stem = "findings-uprobes" + ("-patched" if apply else "")
    key = compiled.XOL_SHIMS + compiled.XOL_GLUE + repr(EDITS if apply else ()) + spec
    handle = ctypes.CDLL(compiled.compiled_library(spec, stem, "uprobes' patched decisions", key, text))
    handle.tc_xol.restype = ctypes.c_long
    handle.tc_xol.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_long, ctypes.c_void_p]
    return handle


def uprobes_decisions(spec: str, items: list[bytes], apply: bool = True) -> list[tuple[int, int, int, int, int]]:
    """Per byte string: branch_setup_xol_ops/push_setup_xol_ops' (return, kind: 1 branch, 2 push, 0 neither,
    offs, opc1, ilen), as ``compiled.compare_xol`` reads them."""
    lib = xol_library(spec, apply)
    raws = [r[:15] for r in items]
    lengths = bytes(map(len, raws))
    offsets = array.array("i", itertools.accumulate(lengths, initial=0))
    out = (ctypes.c_int32 * (5 * len(raws)))()
    lib.tc_xol(b"".join(raws), offsets.buffer_info()[0], lengths, len(raws), out)
    vals = list(out)
    return [tuple(vals[5 * i:5 * i + 5]) for i in range(len(raws))]


def compare(spec: str, items: list[tuple[int, bytes]], tramp: int, examples: int = 5) -> dict:
    """The patched models against the patched compiled code over (address, bytes) items: kprobes'
    emulator choice, the pushed return address and new ip of an emulated call, ``can_boost``; uprobes'
    branch/push emulation.  Returns per decision the instructions checked and the disagreements."""
    kp, up = {"6.1": (KPROBES_6_1, UPROBES_6_1)}[spec]
    result = {name: {"checked": 0, "differ": 0, "examples": []}
              for name in ("prepare_emulation", "kprobe_emulate_call", "can_boost", "branch_setup_xol_ops")}

    def differ(name, raw, c, model):
        r = result[name]
        r["differ"] += 1
        if len(r["examples"]) < examples:
            r["examples"].append({"bytes": raw.hex(), "c": c, "model": model})

    todo = list({raw[:15]: (a, raw[:15]) for a, raw in items}.values())
    for k in range(0, len(todo), 50_000):
        chunk = todo[k:k + 50_000]
        for (a, stream), c in zip(chunk, kprobes_decisions(spec, chunk)):
            d = lf.insn_of(kp.src.decoder, stream)
            if c.ret == -9999 or not d.ok:
                continue
            ans = kp.emulation(d, stream, a, tramp)
            got = (0, 0) if ans is None else (-95, 0) if isinstance(ans, Refuse) else \
                (0, compiled.EMULATORS.get(ans.cite.function, -1))
            result["prepare_emulation"]["checked"] += 1
            if got != (c.ret if c.ret < 0 else 0, c.emulator if c.ret == 0 else 0):
                differ("prepare_emulation", stream, [c.ret, c.emulator], type(ans).__name__)
            if c.emulator == 3 and isinstance(ans, Emulate):
                result["kprobe_emulate_call"]["checked"] += 1
                push, jump = ans.effects
                if (push.value.value, jump.to.value) != (c.call_pushed, c.call_ip):
                    differ("kprobe_emulate_call", stream, [hex(c.call_pushed), hex(c.call_ip)],
                           [hex(push.value.value), hex(jump.to.value)])
            result["can_boost"]["checked"] += 1
            if c.can_boost != kp.can_boost(d, stream):
                differ("can_boost", stream, c.can_boost, not c.can_boost)
        streams = [s for _, s in chunk]
        for (a, stream), (ret, kind, offs, opc1, _ilen) in zip(chunk, uprobes_decisions(spec, streams)):
            d = lf.insn_of(up.src.decoder, stream)
            if ret == -9999 or not d.ok or up.init_insn(d, stream) is not None:
                continue
            result["branch_setup_xol_ops"]["checked"] += 1
            nxt = (a + d.length) & MASK64
            branch, push = up.branch_answer(d, stream, a, nxt), up.push_answer(d, stream, nxt)
            mine = 1 if isinstance(branch, Emulate) else 2 if branch is None and isinstance(push, Emulate) else \
                -1 if isinstance(branch, Refuse) else 0
            theirs = kind if kind else (-1 if ret == -524 else 0)
            if mine != theirs:
                differ("branch_setup_xol_ops", stream, [ret, kind, opc1], type(branch).__name__)
    return result

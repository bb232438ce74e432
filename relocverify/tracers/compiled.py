"""The kernels' own decision code, compiled in user space, to check the Python models against.

The decisions of uprobes and kprobes that depend only on the instruction decoder are C functions
that compile on their own with a few shims: ``uprobe_init_insn`` (with ``is_prefix_bad`` and the
``good_insns_64``/``good_2byte_insns`` tables) and ``riprel_analyze`` from
arch/x86/kernel/uprobes.c, ``can_boost`` (with ``twobyte_is_boostable``) and the displacement
fixup of ``__copy_instruction`` (its ``#ifdef CONFIG_X86_64`` block) from
arch/x86/kernel/kprobes/core.c.  They are cut out of the source package by name (``FUNCTIONS``),
never retyped, and compiled in one unit with the kernel's insn.c and inat.c from the build
``x86.decoders.linux_insn`` made of the same source (its ``src`` directory), with:

  test_bit                    a bit test over the u32 tables (little-endian, as the kernel's)
  search_exception_tables     returns NULL: can_boost's exception-table test is a property of
                              the address, not of the bytes (the audit's "extable" site kind)
  pr_err                      ignored
  struct arch_uprobe          the two fields the functions use: insn[] and defparam.fixups

``tc_check`` decodes a batch of instructions and returns, per instruction, what each function
decided (and the bytes they wrote).  GPL-2.0 code built on this machine from the user's source
package, in ``<cache>/tracer-c/<digest>/``; nothing of it is shipped with relocverify.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import itertools
import re
import struct
import subprocess
import tarfile
from functools import lru_cache
from pathlib import Path

from ..environment import default_cache_dir
from ..errors import InputError
from ..x86.decoders import linux_insn
from ..x86.registers import GPR64
from . import linux_facts as lf

UPROBES = "arch/x86/kernel/uprobes.c"
CORE = "arch/x86/kernel/kprobes/core.c"
#: (file, what is cut out): a table or a function, by its name.
FUNCTIONS = ((UPROBES, "good_insns_64"), (UPROBES, "good_2byte_insns"), (UPROBES, "is_prefix_bad"),
             (UPROBES, "uprobe_init_insn"), (UPROBES, "riprel_analyze"),
             (CORE, "twobyte_is_boostable"), (CORE, "can_boost"))

SHIMS = r"""
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <stdbool.h>
#include <insn.c>
#include <inat.c>
#define ENOTSUPP 524
#define EOPNOTSUPP 95
#define UPROBE_FIX_IP 0x01
#define UPROBE_FIX_CALL 0x02
#define UPROBE_FIX_SETF 0x04
#define UPROBE_FIX_RIP_SI 0x08
#define UPROBE_FIX_RIP_DI 0x10
#define UPROBE_FIX_RIP_BX 0x20
#define CONFIG_X86_64 1
#define test_bit(nr, addr) ((((const uint32_t *)(addr))[(nr) / 32] >> ((nr) % 32)) & 1)
#define search_exception_tables(a) ((void *)0)
#define pr_err(...) do { } while (0)
#define fallthrough do { } while (0)
typedef uint8_t u8;
typedef uint32_t u32;
typedef int32_t s32;
typedef int64_t s64;
typedef u8 kprobe_opcode_t;
struct arch_uprobe { u8 insn[16]; struct { u8 fixups; u8 ilen; } defparam; };
#define W(row, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, ba, bb, bc, bd, be, bf)\
	(((b0##UL << 0x0)|(b1##UL << 0x1)|(b2##UL << 0x2)|(b3##UL << 0x3) |   \
	  (b4##UL << 0x4)|(b5##UL << 0x5)|(b6##UL << 0x6)|(b7##UL << 0x7) |   \
	  (b8##UL << 0x8)|(b9##UL << 0x9)|(ba##UL << 0xa)|(bb##UL << 0xb) |   \
	  (bc##UL << 0xc)|(bd##UL << 0xd)|(be##UL << 0xe)|(bf##UL << 0xf))    \
	 << (row % 32))
#define OPCODE1(insn)		((insn)->opcode.bytes[0])
#define OPCODE2(insn)		((insn)->opcode.bytes[1])
#define MODRM_REG(insn)		X86_MODRM_REG((insn)->modrm.value)
#define good_insns_32 NULL  /* as the source defines it without CONFIG_X86_32/IA32_EMULATION: 64-bit only */
"""

GLUE = r"""
/* per instruction: out[0] uprobe_init_insn, out[1] fixups after riprel_analyze, out[2] can_boost,
 * out[3] __copy_instruction's length (0: refused), out[4] insn length; bytes: the instruction
 * after riprel_analyze (16), then after the displacement fixup (16). */
static int tc_copy_disp(u8 *dest, u8 *src, u8 *real, struct insn *insn)
{
COPY_BLOCK
	return insn->length;
}

long tc_check(const unsigned char *blob, const int32_t *offsets, const uint8_t *lengths, const uint64_t *addrs,
	      uint64_t tramp, long n, int32_t *out, unsigned char *bytes)
{
	long i;
	for (i = 0; i < n; i++) {
		struct arch_uprobe au;
		struct insn insn;
		u8 dest[16];
		int32_t *o = out + 5 * i;
		memset(&au, 0, sizeof(au));
		memcpy(au.insn, blob + offsets[i], lengths[i]);
		o[0] = uprobe_init_insn(&au, &insn, true);
		o[1] = -1;
		if (o[0] == 0) {
			riprel_analyze(&au, &insn);
			o[1] = au.defparam.fixups;
		}
		memcpy(bytes + 32 * i, au.insn, 16);
		memset(dest, 0, 16);
		memcpy(dest, blob + offsets[i], lengths[i]);
		o[2] = -1;
		o[3] = 0;
		o[4] = 0;
		if (insn_decode(&insn, dest, 16, INSN_MODE_64) >= 0) {
			o[4] = insn.length;
			o[2] = can_boost(&insn, (void *)(uintptr_t)addrs[i]);
			o[3] = tc_copy_disp(dest, (u8 *)(uintptr_t)addrs[i], (u8 *)(uintptr_t)tramp, &insn);
		}
		memcpy(bytes + 32 * i + 16, dest, 16);
	}
	return n;
}
"""


def cut_definition(text: str, name: str) -> str:
    """A top-level definition of ``name`` (a function or a table), up to its closing brace."""
    m = re.search(r"^[^\n;{}]*\b" + re.escape(name) + r"\s*(\[[^\]]*\])?\s*(\([^;{]*\))?\s*(=\s*)?\{", text, re.M)
    if m is None:
        raise InputError(f"{name} not found in the kernel source: the source layout changed")
    depth, i = 0, m.end() - 1
    while True:
        c = text[i]
        depth += c == "{"
        depth -= c == "}"
        i += 1
        if depth == 0:
            break
    end = i + 1 if text[i:i + 1] == ";" else i
    return text[m.start():end]


def _copy_block(core: str) -> str:
    body = cut_definition(core, "__copy_instruction")
    m = re.search(r"#ifdef CONFIG_X86_64\n(.*?)#endif", body, re.S)
    if m is None:
        raise InputError("__copy_instruction's CONFIG_X86_64 block not found")
    return m.group(1)


def _source_files(spec: str) -> dict[str, str]:
    src = linux_insn.locate(spec)
    if src.kind == "tree":
        root = Path(src.path)
        return {rel: (root / rel).read_text() for rel in (UPROBES, CORE)}
    out = {}
    with tarfile.open(src.path) as tar:
        top = None
        for member in tar:
            if top is None:
                top = member.name.split("/", 1)[0]
            rel = member.name.split("/", 1)[-1]
            if rel in (UPROBES, CORE):
                out[rel] = tar.extractfile(member).read().decode()
                if len(out) == 2:
                    break
    return out


def compiled_library(spec: str, stem: str, what: str, key: str, text) -> str:
    """The shared library ``<cache>/tracer-c/<digest>/<stem>.so``, built once from ``text()`` (the C unit:
    shims, the functions cut out of the source, the glue) with the kernel's insn.c/inat.c from the
    linux-insn build of ``spec``; ``key`` is what the digest covers besides that build."""
    built = linux_insn.build(linux_insn.locate(spec))
    digest = hashlib.sha256((built.sha256 + key).encode()).hexdigest()[:16]
    directory = Path(default_cache_dir()) / "tracer-c" / digest
    lib = directory / f"{stem}.so"
    if not lib.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        c = directory / f"{stem.replace('-', '_')}.c"
        c.write_text(text())
        src = Path(built.directory) / "src"
        proc = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-w", "-I", str(src / "tools/arch/x86/lib"),
                               "-I", str(src / "tools/arch/x86/include"), "-I", str(src / "tools/include"),
                               "-I", str(built.directory), "-o", str(lib), str(c)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise InputError(f"compiling {what} failed: {proc.stderr[:400]}")
    return str(lib)


@lru_cache(maxsize=4)
def library(spec: str) -> "CompiledChecks":
    def text() -> str:
        files = _source_files(spec)
        parts = [SHIMS] + [cut_definition(files[f], name) + "\n" for f, name in FUNCTIONS]
        parts.append(GLUE.replace("COPY_BLOCK", _copy_block(files[CORE])))
        return "\n".join(parts)

    return CompiledChecks(compiled_library(spec, "tracer-checks", "the kernel's tracer decisions", SHIMS + GLUE, text))


class CompiledChecks:
    """``check(items, tramp)``: the compiled functions' decisions per (address, bytes)."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.lib.tc_check.restype = ctypes.c_long
        self.lib.tc_check.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                                      ctypes.c_uint64, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

    def check(self, items: list[tuple[int, bytes]], tramp: int) -> list[tuple]:
        """Per item: (uprobe_init_insn, fixups, can_boost, copy length, insn length, uprobe bytes, copy bytes)."""
        n = len(items)
        if not n:
            return []
        raws = [r[:15] for _, r in items]
        lengths = bytes(map(len, raws))
        offsets = array.array("i", itertools.accumulate(lengths, initial=0))
        addrs = array.array("Q", [a for a, _ in items])
        out = (ctypes.c_int32 * (5 * n))()
        buf = ctypes.create_string_buffer(32 * n)
        self.lib.tc_check(b"".join(raws), offsets.buffer_info()[0], lengths, addrs.buffer_info()[0], tramp, n,
                          out, buf)
        raw = buf.raw
        vals = struct.unpack(f"<{5 * n}i", bytes(out))
        return [tuple(vals[5 * i:5 * i + 5]) + (raw[32 * i:32 * i + 16], raw[32 * i + 16:32 * i + 32])
                for i in range(n)]


_ERRNO = {0: None, -8: "-ENOEXEC", -524: "-ENOTSUPP"}


def compare(spec: str, items: list[tuple[int, bytes]], tramp: int, examples: int = 5) -> dict:
    """Compile the kernel's decisions from the ``spec`` source and compare them with the Python models
    (``uprobes@spec`` and ``kprobes@spec``) over (address, bytes) items.  Returns per decision the
    instructions checked and every disagreement (a few examples each)."""
    from .kprobes_6_1 import MODEL as K61
    from .kprobes_6_12 import MODEL as K612
    from .uprobes_6_1 import MODEL as U61
    from .uprobes_6_12 import MODEL as U612

    kp, up = {"6.1": (K61, U61), "6.12": (K612, U612)}[spec]
    lib = library(spec)
    result = {name: {"checked": 0, "differ": 0, "examples": []} for name in
              ("uprobe_init_insn", "riprel_analyze", "can_boost", "__copy_instruction disp")}

    def differ(name, a, raw, c, model):
        r = result[name]
        r["differ"] += 1
        if len(r["examples"]) < examples:
            r["examples"].append({"address": hex(a), "bytes": raw.hex(), "c": c, "model": model})

    seen: set[bytes] = set()
    for k in range(0, len(items), 50_000):
        chunk = items[k:k + 50_000]
        for (a, raw), (init, fixups, boost, copied, length, ubytes, cbytes) in zip(chunk, lib.check(chunk, tramp)):
            stream = raw[:15]
            d = lf.insn_of(spec, stream)
            if stream not in seen:
                seen.add(stream)
                mine = up.init_insn(d, stream)
                want = _ERRNO.get(init, str(init))
                got = None if mine is None else mine.reason.split(":")[0]
                result["uprobe_init_insn"]["checked"] += 1
                if want != got:
                    differ("uprobe_init_insn", a, raw, want, got)
                if init == 0 and "rip_relative" in d.flags:
                    result["riprel_analyze"]["checked"] += 1
                    b, scratch = up.riprel(d, stream[:d.length])
                    flag = {6: 0x08, 7: 0x10, 3: 0x20}[scratch]
                    if b != ubytes[:d.length] or flag != fixups & 0x38:
                        differ("riprel_analyze", a, raw, [ubytes[:d.length].hex(), fixups],
                               [b.hex(), flag])
                if d.ok:
                    result["can_boost"]["checked"] += 1
                    if bool(boost) != kp.can_boost(d, stream):
                        differ("can_boost", a, raw, bool(boost), kp.can_boost(d, stream))
            if d.ok and "rip_relative" in d.flags:
                result["__copy_instruction disp"]["checked"] += 1
                mine = kp.copy_instruction(d, stream, a, tramp)
                want = cbytes[:length] if copied else None
                if mine != want:
                    differ("__copy_instruction disp", a, raw, want and want.hex(), mine and mine.hex())
    return result


# -- prepare_emulation: which emulator kprobes chooses -------------------------------------------------

EMULATION_SHIMS = r"""
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <stdbool.h>
#include <insn.c>
#include <inat.c>
#define fallthrough do { } while (0)
#define CONFIG_X86_64 1
typedef int8_t s8;
typedef int16_t s16;
typedef int32_t s32;
struct pt_regs;
struct kprobe;
/* the fields of arch/x86/include/asm/kprobes.h struct arch_specific_insn that prepare_emulation sets */
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
/* the emulators, as distinct stubs: which one prepare_emulation picks is the decision compared */
static void kprobe_emulate_ifmodifiers(struct kprobe *p, struct pt_regs *r) { tc_which = 1; }
static void kprobe_emulate_ret(struct kprobe *p, struct pt_regs *r) { tc_which = 2; }
static void kprobe_emulate_call(struct kprobe *p, struct pt_regs *r) { tc_which = 3; }
static void kprobe_emulate_jmp(struct kprobe *p, struct pt_regs *r) { tc_which = 4; }
static void kprobe_emulate_jcc(struct kprobe *p, struct pt_regs *r) { tc_which = 5; }
static void kprobe_emulate_loop(struct kprobe *p, struct pt_regs *r) { tc_which = 6; }
static void kprobe_emulate_call_indirect(struct kprobe *p, struct pt_regs *r) { tc_which = 7; }
static void kprobe_emulate_jmp_indirect(struct kprobe *p, struct pt_regs *r) { tc_which = 8; }
"""

EMULATION_GLUE = r"""
long tc_emulation(const unsigned char *blob, const int32_t *offsets, const uint8_t *lengths, long n, int32_t *out)
{
	long i;
	for (i = 0; i < n; i++) {
		struct insn insn;
		struct kprobe p;
		u8 buf[16];
		int32_t *o = out + 6 * i;
		memset(&p, 0, sizeof(p));
		memset(buf, 0, 16);
		memcpy(buf, blob + offsets[i], lengths[i]);
		memset(o, 0, 6 * sizeof(*o));
		if (insn_decode(&insn, buf, 16, INSN_MODE_64) < 0) {
			o[0] = -9999;
			continue;
		}
		o[0] = prepare_emulation(&p, &insn);
		tc_which = 0;
		if (p.ainsn.emulate_op)
			p.ainsn.emulate_op(&p, 0);
		o[1] = tc_which;
		o[2] = p.ainsn.rel32;
		o[3] = p.ainsn.opcode;
		o[4] = p.ainsn.loop.asize;
		o[5] = p.ainsn.indirect.reg;
	}
	return n;
}
"""

#: the model's emulator (its answer's cited function) -> the stub's number
EMULATORS = {"kprobe_emulate_ifmodifiers": 1, "kprobe_emulate_ret": 2, "kprobe_emulate_call": 3,
             "kprobe_emulate_jmp": 4, "kprobe_emulate_jcc": 5, "kprobe_emulate_loop": 6,
             "kprobe_emulate_call_indirect": 7, "kprobe_emulate_jmp_indirect": 8}


@lru_cache(maxsize=4)
def emulation_library(spec: str):
    def text() -> str:
        return "\n".join([EMULATION_SHIMS, cut_definition(_source_files(spec)[CORE], "prepare_emulation"), EMULATION_GLUE])

    lib = compiled_library(spec, "tracer-emulation", "prepare_emulation", EMULATION_SHIMS + EMULATION_GLUE, text)
    handle = ctypes.CDLL(lib)
    handle.tc_emulation.restype = ctypes.c_long
    handle.tc_emulation.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_long, ctypes.c_void_p]
    return handle


def emulation_decisions(spec: str, items: list[tuple[int, bytes]]) -> list[tuple[int, ...]]:
    """prepare_emulation's (return, emulator, rel32, opcode/type byte, loop asize, indirect reg) per item."""
    lib = emulation_library(spec)
    n = len(items)
    raws = [r[:15] for _, r in items]
    lengths = bytes(map(len, raws))
    offsets = array.array("i", itertools.accumulate(lengths, initial=0))
    out = (ctypes.c_int32 * (6 * n))()
    lib.tc_emulation(b"".join(raws), offsets.buffer_info()[0], lengths, n, out)
    vals = list(out)
    return [tuple(vals[6 * i:6 * i + 6]) for i in range(n)]


def compare_emulation(spec: str, items: list[tuple[int, bytes]], tramp: int, examples: int = 5) -> dict:
    """The kprobes model's ``emulation`` against the compiled prepare_emulation: the same emulator (or
    the same refusal, or none), and the same relative target, register and condition."""
    from .kprobes import JCC
    from .kprobes_6_1 import MODEL as K61
    from .kprobes_6_12 import MODEL as K612
    from .model import Emulate, Refuse

    kp = {"6.1": K61, "6.12": K612}[spec]
    result = {"checked": 0, "differ": 0, "examples": [], "by_emulator": {}}
    seen: set[bytes] = set()
    todo = []
    for a, raw in items:
        if raw[:15] not in seen:
            seen.add(raw[:15])
            todo.append((a, raw[:15]))
    for k in range(0, len(todo), 50_000):
        chunk = todo[k:k + 50_000]
        for (a, stream), (ret, which, rel32, byte, asize, reg) in zip(chunk, emulation_decisions(spec, chunk)):
            d = lf.insn_of(spec, stream)
            if ret == -9999 or not d.ok:
                continue
            result["checked"] += 1
            ans = kp.emulation(d, stream, a, tramp)
            nxt = (a + d.length) & 0xFFFFFFFFFFFFFFFF
            if ans is None:
                got = (0, 0)
            elif isinstance(ans, Refuse):
                got = (-95, 0)
            else:
                got = (0, EMULATORS.get(ans.cite.function, -1))
            same = got == (ret if ret < 0 else 0, which if ret == 0 else 0)
            if same and isinstance(ans, Emulate) and which in (3, 4, 5):
                jump = ans.effects[-1]
                target = jump.taken if which == 5 else jump.to.value
                same = (target - nxt) & 0xFFFFFFFF == rel32 & 0xFFFFFFFF
                if which == 5:
                    same = same and jump.cond == JCC[byte & 0xF]
            if same and isinstance(ans, Emulate) and which in (7, 8):
                value = ans.effects[0].value if which == 7 else ans.effects[0].to
                same = value.name == GPR64[reg]
            if same and which:
                name = next(n for n, v in EMULATORS.items() if v == which)
                result["by_emulator"][name] = result["by_emulator"].get(name, 0) + 1
            if not same:
                result["differ"] += 1
                if len(result["examples"]) < examples:
                    result["examples"].append({"bytes": stream.hex(), "c": [ret, which, rel32, byte],
                                               "model": type(ans).__name__ if ans is not None else None})
    return result


# -- branch_setup_xol_ops and push_setup_xol_ops: what uprobes emulates ------------------------------------

XOL_SHIMS = r"""
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <insn.c>
#include <inat.c>
#define ENOTSUPP 524
#define CONFIG_X86_64 1
#define fallthrough do { } while (0)
typedef uint8_t u8;
typedef int32_t s32;
#define OPCODE1(insn)		((insn)->opcode.bytes[0])
#define OPCODE2(insn)		((insn)->opcode.bytes[1])
struct uprobe_xol_ops { int id; };
static const struct uprobe_xol_ops branch_xol_ops = { 1 };
static const struct uprobe_xol_ops push_xol_ops = { 2 };
/* arch/x86/include/asm/uprobes.h struct arch_uprobe, the fields the setup functions write */
struct arch_uprobe {
	u8 insn[16];
	const struct uprobe_xol_ops *ops;
	union {
		struct { s32 offs; u8 ilen; u8 opc1; } branch;
		struct { u8 fixups; u8 ilen; } defparam;
		struct { u8 reg_offset; u8 ilen; } push;
	};
};
/* struct pt_regs' layout (arch/x86/include/asm/ptrace.h), for push_setup_xol_ops' offsetof */
struct pt_regs { unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs,
		 flags, sp, ss; };
"""

XOL_GLUE = r"""
long tc_xol(const unsigned char *blob, const int32_t *offsets, const uint8_t *lengths, long n, int32_t *out)
{
	long i;
	for (i = 0; i < n; i++) {
		struct arch_uprobe au;
		struct insn insn;
		int32_t *o = out + 5 * i;
		memset(&au, 0, sizeof(au));
		memset(o, 0, 5 * sizeof(*o));
		memcpy(au.insn, blob + offsets[i], lengths[i]);
		if (insn_decode(&insn, au.insn, 16, INSN_MODE_64) < 0) {
			o[0] = -9999;
			continue;
		}
		o[0] = branch_setup_xol_ops(&au, &insn);
		if (o[0] == -ENOSYS) {
			o[0] = push_setup_xol_ops(&au, &insn);
			o[1] = o[0] == 0 ? 2 : 0;
			o[3] = au.push.reg_offset;
			continue;
		}
		o[1] = o[0] == 0 ? 1 : 0;
		o[2] = au.branch.offs;
		o[3] = au.branch.opc1;
		o[4] = au.branch.ilen;
	}
	return n;
}
"""

#: push_setup_xol_ops' pt_regs offsets (the shim's layout above) -> register
_PT_REGS = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
            "orig_ax", "rip", "cs", "rflags", "rsp")


@lru_cache(maxsize=4)
def xol_library(spec: str):
    def text() -> str:
        source = _source_files(spec)[UPROBES]
        m = re.search(r"^#define CASE_COND.*?(?=^static bool is_cond_jmp_opcode)", source, re.S | re.M)
        if m is None:
            raise InputError("uprobes.c's CASE_COND macros not found: the source layout changed")
        return "\n".join([XOL_SHIMS, m.group(0), cut_definition(source, "is_cond_jmp_opcode"), cut_definition(source, "branch_clear_offset"),
                          cut_definition(source, "branch_setup_xol_ops"), cut_definition(source, "push_setup_xol_ops"), XOL_GLUE])

    lib = compiled_library(spec, "tracer-xol", "branch_setup_xol_ops", XOL_SHIMS + XOL_GLUE, text)
    handle = ctypes.CDLL(lib)
    handle.tc_xol.restype = ctypes.c_long
    handle.tc_xol.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_long, ctypes.c_void_p]
    return handle


def compare_xol(spec: str, items: list[tuple[int, bytes]], examples: int = 5) -> dict:
    """The uprobes model's branch and push emulation against the compiled branch_setup_xol_ops and
    push_setup_xol_ops, over the instructions uprobe_init_insn accepts: the same choice (emulated
    branch, emulated push, refused, or single-stepped), offset, condition and register."""
    from .kprobes import JCC
    from .model import Emulate, Refuse
    from .uprobes_6_1 import MODEL as U61
    from .uprobes_6_12 import MODEL as U612

    up = {"6.1": U61, "6.12": U612}[spec]
    lib = xol_library(spec)
    todo = list({raw[:15]: a for a, raw in items}.items())
    result = {"checked": 0, "differ": 0, "examples": [], "emulated": {"branch": 0, "push": 0}}
    for k in range(0, len(todo), 50_000):
        chunk = todo[k:k + 50_000]
        raws = [s for s, _ in chunk]
        lengths = bytes(map(len, raws))
        offsets = array.array("i", itertools.accumulate(lengths, initial=0))
        out = (ctypes.c_int32 * (5 * len(chunk)))()
        lib.tc_xol(b"".join(raws), offsets.buffer_info()[0], lengths, len(chunk), out)
        vals = list(out)
        for j, (stream, a) in enumerate(chunk):
            ret, kind, offs, opc1, ilen = vals[5 * j:5 * j + 5]
            d = lf.insn_of(spec, stream)
            if ret == -9999 or not d.ok or up.init_insn(d, stream) is not None:
                continue
            result["checked"] += 1
            nxt = (a + d.length) & 0xFFFFFFFFFFFFFFFF
            branch, push = up.branch_answer(d, stream, a, nxt), up.push_answer(d, stream, nxt)
            if kind == 1:
                e = branch.effects[-1] if isinstance(branch, Emulate) else None
                target = None if e is None else (e.taken if hasattr(e, "taken") else e.to.value)
                same = e is not None and (target - nxt) & 0xFFFFFFFF == offs & 0xFFFFFFFF and (
                    not hasattr(e, "cond") or e.cond == JCC[opc1 & 0xF])
                result["emulated"]["branch"] += same
            elif kind == 2:
                reg = _PT_REGS[vals[5 * j + 3] // 8]  # o[3]: push.reg_offset
                same = branch is None and isinstance(push, Emulate) and push.effects[0].value.name == reg
                result["emulated"]["push"] += same
            elif ret == -524:
                same = isinstance(branch, Refuse)
            else:
                same = branch is None and push is None
            if not same:
                result["differ"] += 1
                if len(result["examples"]) < examples:
                    result["examples"].append({"bytes": stream.hex(), "c": [ret, kind, offs, opc1],
                                               "model": [type(branch).__name__, type(push).__name__]})
    return result


# -- can_optimize's per-instruction tests: indirect jumps and jumps into a range (opt.c) ----------------

OPT = "arch/x86/kernel/kprobes/opt.c"

OPT_SHIMS = r"""
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <stdbool.h>
#include <insn.c>
#include <inat.c>
"""

OPT_GLUE = r"""
/* per instruction at addrs[i]: out[0] the indirect-jump test; out[1], out[2] insn_jump_into_range over
 * [0, 2^31 - 1] and [2^31, 2^32 - 1] with the instruction moved to end at 2^31 (wherever its rel32
 * target is, it lies in one of them, and no bound wraps); out[3] insn_jump_into_range over [t, t] at
 * its real address, for the model's target t (to[i]). */
long tc_opt(const unsigned char *blob, const int32_t *offsets, const uint8_t *lengths, const uint64_t *addrs,
	    const uint64_t *to, long n, int32_t *out)
{
	long i;
	for (i = 0; i < n; i++) {
		struct insn insn;
		u8 buf[16];
		int32_t *o = out + 4 * i;
		memset(buf, 0, 16);
		memcpy(buf, blob + offsets[i], lengths[i]);
		memset(o, 0, 4 * sizeof(*o));
		if (insn_decode(&insn, buf, 16, INSN_MODE_64) < 0) {
			o[0] = -9999;
			continue;
		}
		/* can_optimize's "Recover address": next_byte is where the target is computed from */
		o[0] = INDIRECT(&insn);
		insn.next_byte = (void *)(uintptr_t)0x80000000UL;
		o[1] = insn_jump_into_range(&insn, 0, 0x7fffffff);
		o[2] = insn_jump_into_range(&insn, 0x80000000UL, 0x7fffffff);
		insn.kaddr = (void *)(uintptr_t)addrs[i];
		insn.next_byte = (void *)(uintptr_t)(addrs[i] + insn.length);
		o[3] = insn_jump_into_range(&insn, to[i], 0);
	}
	return n;
}
"""


def _opt_source(spec: str) -> str:
    src = linux_insn.locate(spec)
    if src.kind == "tree":
        return (Path(src.path) / OPT).read_text()
    with tarfile.open(src.path) as tar:
        for member in tar:
            if member.name.split("/", 1)[-1] == OPT:
                return tar.extractfile(member).read().decode()
    raise InputError(f"{OPT} not in the kernel source")


@lru_cache(maxsize=4)
def opt_library(spec: str):
    """``__insn_is_indirect_jump`` (6.1; ``insn_is_indirect_jump`` in 6.12, where it has no thunk
    wrapper) and ``insn_jump_into_range``, cut out of opt.c and compiled with the kernel's decoder."""
    def text() -> str:
        source = _opt_source(spec)
        indirect = "__insn_is_indirect_jump" if re.search(r"\b__insn_is_indirect_jump\s*\(", source) \
            else "insn_is_indirect_jump"
        return "\n".join([OPT_SHIMS, cut_definition(source, indirect), cut_definition(source, "insn_jump_into_range"),
                          OPT_GLUE.replace("INDIRECT", indirect)])

    lib = compiled_library(spec, "tracer-opt", "opt.c's checks", OPT_SHIMS + OPT_GLUE + spec, text)
    handle = ctypes.CDLL(lib)
    handle.tc_opt.restype = ctypes.c_long
    handle.tc_opt.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_long, ctypes.c_void_p]
    return handle


def compare_optprobes(spec: str, items: list[tuple[int, bytes]], examples: int = 5) -> dict:
    """The optprobes model's per-instruction tests of ``can_optimize`` against opt.c compiled: the
    indirect-jump test (``optprobes.indirect_jump``) and the jump target ``insn_jump_into_range``
    reads (``optprobes.jump_target``: whether there is one, and which)."""
    from .optprobes import indirect_jump, jump_target

    lib = opt_library(spec)
    result = {"checked": 0, "differ": 0, "examples": [], "indirect": 0, "jumps": 0}
    for k in range(0, len(items), 50_000):
        chunk = [(a, raw[:15]) for a, raw in items[k:k + 50_000]]
        facts = [lf.insn_of(spec, raw) for _, raw in chunk]
        targets = [jump_target(d, a) if d.ok else None for (a, _), d in zip(chunk, facts)]
        raws = [r for _, r in chunk]
        lengths = bytes(map(len, raws))
        offsets = array.array("i", itertools.accumulate(lengths, initial=0))
        addrs = array.array("Q", [a for a, _ in chunk])
        to = array.array("Q", [t if t is not None else 0 for t in targets])
        out = (ctypes.c_int32 * (4 * len(chunk)))()
        lib.tc_opt(b"".join(raws), offsets.buffer_info()[0], lengths, addrs.buffer_info()[0], to.buffer_info()[0],
                   len(chunk), out)
        vals = list(out)
        for j, ((a, raw), d, t) in enumerate(zip(chunk, facts, targets)):
            indirect, low, high, exact = vals[4 * j:4 * j + 4]
            if indirect == -9999 or not d.ok:
                continue
            result["checked"] += 1
            mine = indirect_jump(d) is not None
            has = bool(low or high)
            same = bool(indirect) == mine and has == (t is not None) and (t is None or exact == 1)
            result["indirect"] += mine
            result["jumps"] += t is not None
            if not same:
                result["differ"] += 1
                if len(result["examples"]) < examples:
                    result["examples"].append({"address": hex(a), "bytes": raw.hex(), "c": [indirect, low, high, exact],
                                               "model": [mine, None if t is None else hex(t)]})
    return result

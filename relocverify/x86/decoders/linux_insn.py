"""The Linux kernel's own x86 instruction decoder behind ``protocol.Decoder``.

Every Linux tracer that moves an instruction (kprobes, optprobes, uprobes)
trusts ``arch/x86/lib/insn.c``: ``insn_decode()`` walks prefixes, REX/VEX/EVEX,
opcode, ModRM, SIB, displacement and immediates, and looks each opcode up in
attribute tables that ``arch/x86/tools/gen-insn-attr-x86.awk`` generates from
the text file ``arch/x86/lib/x86-opcode-map.txt``.  This module builds that
decoder from a kernel source and asks it, in batches through ``ctypes``, about
the gate's byte strings.

Where it comes from (``linux-insn@SPEC``):

- ``linux-insn@6.1``, ``linux-insn@6.12``: Debian's ``linux-source-<ver>``
  package, whose tarball is ``/usr/src/linux-source-<ver>.tar.xz``
  (``apt-get install linux-source-6.1``); only the files in ``NEEDED`` are read
  out of it;
- ``linux-insn@/path/to/linux``: a kernel tree (or a ``.tar.xz`` of one).

The build is the one the kernel's own ``arch/x86/tools/insn_decoder_test``
uses, from the user-space copies under ``tools/``: the opcode map run through
the kernel's awk script into ``inat-tables.c``, and one translation unit that
includes ``insn.c`` and ``inat.c`` with our batch entry point (``GLUE_C``,
written here and generated into the build directory), compiled with
``cc -O2 -shared -fPIC``.  When the tree also has the kernel-side copies
(``arch/x86/lib/...``), they must equal the ``tools/`` copies apart from the
lines marked ``__ignore_sync_check__`` (the rule the kernel's own header sync
check applies); otherwise the build refuses, since it would test code the
kernel does not run.  The result lives in
``<cache>/linux-insn/<sha256>/`` (the tarball's sha256, or one over the
tree's needed files) and is reused.  It is GPL-2.0 code built on this machine
for this machine: nothing of it is in, or shipped with, relocverify.

What it answers (``Decoded``, one per byte string): ``insn_decode``'s return,
the length, the byte counts of each part (emulate prefix, legacy prefixes,
REX/REX2, VEX/EVEX, opcode, ModRM, SIB, displacement, the two immediates),
their values, ``insn_rip_relative``, operand and address size, and the INAT
attribute predicates tracers branch on (``FLAGS``).  ``facts`` maps it onto
the gate's ``Facts``:

- offsets are sums of the preceding parts' byte counts (the kernel keeps
  counts, not offsets); the legacy prefix count stays in ``Decoded`` (as
  capstone and iced-x86, the adapter reports no ``prefixes`` field: an
  answer equal to iced-x86's must be the same ``Facts``, so that a known
  capstone defect explains a difference with either);
- a ``moffs`` operand (``a0``-``a3``, ``INAT_MOFFSET``), which the kernel
  keeps in its immediate fields, is reported as the displacement, as
  capstone and iced-x86 report it;
- a 64-bit immediate the kernel splits into ``immediate1``/``immediate2``
  is one immediate; the second immediate of ``INAT_SCNDIMM`` forms
  (``enter``) is left out, as iced-x86 leaves it out of ``imm``;
- the kernel computes no branch targets: the target is
  ``length + immediate`` for exactly the opcodes the opcode map gives a
  relative operand (``Jb``/``Jz``, ``RELATIVE_BRANCHES``), as kprobes
  computes it;
- ``insn_decode`` failing with ``-ENODATA`` on a byte string the decoder
  reads past is asked again with the string padded by ``nop`` to 15 bytes
  (as objdump's adapter pads its slots), so a decoder that reads too far
  shows the length it reads instead of an error.

An opcode the map has no line for decodes with ``attr == 0``: no ModRM, no
immediate, and no error (the kernel's tables have no "invalid" attribute).
That is the kernel's answer, and it is reported as such.
"""

from __future__ import annotations

import array
import ctypes
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import NamedTuple

from ...environment import default_cache_dir
from ...errors import InputError
from ..registers import MASK64
from .protocol import Facts, error

PREFIX = "linux-insn@"
MAX_INSN = 15

#: The files the decoder is built from, relative to the tree's top.  Found by
#: compiling (``cc -MD`` lists what is read); a kernel may lack some (the
#: unaligned-access header moved between 6.1 and 6.12).  The ``arch/`` copies
#: are only compared with the ``tools/`` copies.
NEEDED = (
    "Makefile",
    "tools/arch/x86/lib/insn.c",
    "tools/arch/x86/lib/inat.c",
    "tools/arch/x86/lib/x86-opcode-map.txt",
    "tools/arch/x86/tools/gen-insn-attr-x86.awk",
    "tools/arch/x86/include/asm/insn.h",
    "tools/arch/x86/include/asm/inat.h",
    "tools/arch/x86/include/asm/inat_types.h",
    "tools/arch/x86/include/asm/emulate_prefix.h",
    "tools/include/linux/kernel.h",
    "tools/include/linux/build_bug.h",
    "tools/include/linux/compiler.h",
    "tools/include/linux/compiler_types.h",
    "tools/include/linux/compiler-gcc.h",
    "tools/include/linux/types.h",
    "tools/include/linux/math.h",
    "tools/include/linux/panic.h",
    "tools/include/linux/kconfig.h",
    "tools/include/linux/unaligned.h",       # 6.12
    "tools/include/vdso/unaligned.h",        # 6.12
    "tools/include/asm-generic/unaligned.h",  # 6.1
    "arch/x86/lib/insn.c",
    "arch/x86/lib/inat.c",
    "arch/x86/lib/x86-opcode-map.txt",
    "arch/x86/tools/gen-insn-attr-x86.awk",
    "arch/x86/include/asm/insn.h",
    "arch/x86/include/asm/inat.h",
    "arch/x86/include/asm/inat_types.h",
    "arch/x86/include/asm/emulate_prefix.h",
)
_REQUIRED = NEEDED[1:9]
MAP = "tools/arch/x86/lib/x86-opcode-map.txt"
_SYNC_MARK = "__ignore_sync_check__"

#: The opcodes x86-opcode-map.txt gives a relative operand (``Jb``, ``Jz``):
#: jcc rel8 (70-7f), loop/jrcxz (e0-e3), call/jmp rel32 (e8, e9), jmp rel8
#: (eb), jcc rel32 (0f 80-8f), and ``7: XBEGIN Jz (000),(11B)`` in Grp11B
#: (c7 f8).  Their target is the next instruction plus the immediate.
RELATIVE_BRANCHES = frozenset(
    [bytes([b]) for b in range(0x70, 0x80)] + [bytes([b]) for b in (0xE0, 0xE1, 0xE2, 0xE3, 0xE8, 0xE9, 0xEB)]
    + [bytes([0x0F, b]) for b in range(0x80, 0x90)])
_XBEGIN = (b"\xc7", 0xF8)

#: The INAT predicates the glue evaluates (``inat.h``'s ``inat_*`` functions
#: on the final attribute), bit by bit; the last four exist from 6.10 (REX2,
#: APX): absent in an older kernel, they read 0.
FLAGS = ("modrm", "force64", "second_immediate", "moffset", "variant", "accept_vex", "must_vex",
         "must_evex", "group", "immediate", "escape", "rip_relative", "emulate_prefix",
         "evex_scalable", "rex2", "no_rex2", "rex2_variant")
_FLAG_BIT = {name: 1 << i for i, name in enumerate(FLAGS)}

#: Our batch entry point, compiled in one unit with the kernel's insn.c and
#: inat.c (as ``insn_decoder_test`` includes them).  ``li_decode`` decodes
#: ``n`` strings laid end to end in ``blob`` and fills one ``struct li_out``
#: each; ``li_abi`` returns the struct's size, checked against ``_OUT``.
GLUE_C = r"""
/* Generated by relocverify (relocverify/x86/decoders/linux_insn.py): a batch
 * entry point over the kernel's x86 instruction decoder. */
#include <stdint.h>
#include <errno.h>
#include <insn.c>
#include <inat.c>

/* Everything but the three values first: the first 32 bytes are the answer's shape. */
struct li_out {
	int32_t ret;
	uint32_t attr;
	uint32_t flags;
	uint8_t length, emulate, prefixes, rex, vex, opcode_len;
	uint8_t op[3];
	uint8_t modrm_len, sib_len, disp_len, imm1_len, imm2_len;
	uint8_t opnd_bytes, addr_bytes, imm_type, modrm;
	uint8_t pad[2];
	int32_t imm1, imm2, disp;
};

int li_abi(void) { return (int)sizeof(struct li_out); }

#define F(bit, cond) ((cond) ? (1u << (bit)) : 0u)

/* insn_rip_relative() only on a complete decode: on a failed one it would
 * decode again from where the failure left next_byte. */
static uint32_t li_flags(struct insn *insn, int complete)
{
	insn_attr_t a = insn->attr;
	uint32_t f = F(0, inat_has_modrm(a)) | F(1, inat_is_force64(a)) | F(2, inat_has_second_immediate(a))
		| F(3, inat_has_moffset(a)) | F(4, inat_has_variant(a)) | F(5, inat_accept_vex(a))
		| F(6, inat_must_vex(a)) | F(7, inat_must_evex(a)) | F(8, inat_is_group(a))
		| F(9, inat_has_immediate(a)) | F(10, inat_is_escape(a))
		| F(11, complete && insn_rip_relative(insn)) | F(12, insn_has_emulate_prefix(insn));
#ifdef INAT_EVEX_SCALABLE
	f |= F(13, inat_evex_scalable(a));
#endif
#ifdef INAT_PFX_REX2
	f |= F(14, insn->rex_prefix.nbytes == 2);
#endif
#ifdef INAT_NO_REX2
	f |= F(15, a & INAT_NO_REX2);
#endif
#ifdef INAT_REX2_VARIANT
	f |= F(16, a & INAT_REX2_VARIANT);
#endif
	return f;
}

long li_decode(const unsigned char *blob, const int32_t *offsets, const uint8_t *lengths, long n,
	       struct li_out *out)
{
	long i;
	for (i = 0; i < n; i++) {
		struct insn insn;
		struct li_out *o = &out[i];
		memset(o, 0, sizeof(*o));
		o->ret = insn_decode(&insn, blob + offsets[i], lengths[i], INSN_MODE_64);
		o->attr = insn.attr;
		o->length = insn.length;
		o->emulate = (uint8_t)insn.emulate_prefix_size;
		o->prefixes = insn.prefixes.nbytes;
		o->rex = insn.rex_prefix.nbytes;
		o->vex = insn.vex_prefix.nbytes;
		o->opcode_len = insn.opcode.nbytes;
		o->op[0] = insn.opcode.bytes[0];
		o->op[1] = insn.opcode.bytes[1];
		o->op[2] = insn.opcode.bytes[2];
		o->modrm_len = insn.modrm.nbytes;
		o->modrm = insn.modrm.bytes[0];
		o->sib_len = insn.sib.nbytes;
		o->disp_len = insn.displacement.nbytes;
		o->disp = insn.displacement.value;
		o->imm1_len = insn.immediate1.nbytes;
		o->imm1 = insn.immediate1.value;
		o->imm2_len = insn.immediate2.nbytes;
		o->imm2 = insn.immediate2.value;
		o->opnd_bytes = insn.opnd_bytes;
		o->addr_bytes = insn.addr_bytes;
		o->imm_type = (uint8_t)inat_immediate_size(insn.attr);
		o->flags = li_flags(&insn, o->ret == 0);
	}
	return n;
}
"""
_OUT = struct.Struct("<iII6B3B5B4B2xiii")
_SHAPE = 32  # bytes of a row before the values (see struct li_out)
_IMM1 = struct.Struct("<i")
_GLUE_ID = hashlib.sha256(GLUE_C.encode()).hexdigest()[:12]
_ERRNO = {-22: "EINVAL: the opcode map rejects it (VEX/EVEX where not allowed, or VEX-only without VEX)",
          -61: "ENODATA: runs past the end of the bytes"}


class Decoded(NamedTuple):
    """``insn_decode``'s answer for one byte string: every count in bytes, offsets from its first byte."""

    ret: int  # 0, or -EINVAL / -ENODATA
    length: int
    emulate_prefix: int  # Xen/KVM "ud2; .ascii" escape in front of the instruction
    prefixes: int  # legacy prefix bytes
    rex: int  # 1 for REX, 2 for REX2
    vex: int  # 2, 3 (VEX) or 4 (EVEX)
    opcode: bytes
    modrm_offset: int | None
    modrm: int | None  # the ModRM byte
    sib_offset: int | None
    disp: tuple[int, int] | None  # (offset, size) of the ModRM displacement
    imm: tuple[int, int] | None  # (offset, size) of immediate1 (moffset1)
    imm2: tuple[int, int] | None  # immediate2 (moffset2, the upper half of a 64-bit immediate, or a second one)
    disp_value: int
    imm_value: int  # immediate1.value, sign-extended by the decoder
    attr: int
    flags: frozenset[str]  # of FLAGS
    opnd_bytes: int
    addr_bytes: int
    padded: bool  # decoded from the bytes padded with nops (see the module doc)

    @property
    def ok(self) -> bool:
        return self.ret == 0


def _decoded(o: tuple, padded: bool) -> Decoded:
    (ret, attr, flags, length, emulate, prefixes, rex, vex, opcode_len, op0, op1, op2,
     modrm_len, sib_len, disp_len, imm1_len, imm2_len, opnd, addr, _imm_type, modrm_byte, imm1, imm2, disp) = o
    at = emulate + prefixes + rex + vex + opcode_len
    modrm = at if modrm_len else None
    at += modrm_len
    sib = at if sib_len else None
    at += sib_len
    d = (at, disp_len) if disp_len else None
    at += disp_len
    i1 = (at, imm1_len) if imm1_len else None
    at += imm1_len
    i2 = (at, imm2_len) if imm2_len else None
    return Decoded(ret, length, emulate, prefixes, rex, vex, bytes((op0, op1, op2)[:opcode_len]), modrm,
                   modrm_byte if modrm_len else None, sib, d, i1, i2, disp, imm1, attr, _flag_names(flags), opnd,
                   addr, padded)


@functools.lru_cache(maxsize=None)
def _flag_names(bits: int) -> frozenset[str]:
    return frozenset(name for name, bit in _FLAG_BIT.items() if bits & bit)


def facts(d: Decoded) -> Facts:
    """The gate's ``Facts`` for a ``Decoded`` answer (the mapping in the module doc)."""
    shape = _shape(d)
    return shape._replace(target_delta=(d.length + d.imm_value) & MASK64) if _relative_branch(d) else shape


def _shape(d: Decoded) -> Facts:
    """``facts`` without the branch target (which alone depends on the immediate's value)."""
    if not d.ok:
        return error(f"linux-insn: insn_decode {_ERRNO.get(d.ret, d.ret)}")
    disp, imm = d.disp, d.imm
    if "moffset" in d.flags and imm is not None:
        disp, imm = (imm[0], imm[1] + (d.imm2[1] if d.imm2 else 0)), None
    elif imm is not None and d.imm2 is not None and "second_immediate" not in d.flags:
        imm = (imm[0], imm[1] + d.imm2[1])
    return Facts(d.length, None, disp[0] if disp else None, disp[1] if disp else 0,
                 imm[0] if imm else None, imm[1] if imm else 0, None)


def _relative_branch(d: Decoded) -> bool:
    """An opcode the map gives a J operand (``RELATIVE_BRANCHES``, xbegin), decoded with its immediate."""
    return d.ok and d.vex == 0 and d.imm is not None and (
        d.opcode in RELATIVE_BRANCHES or (d.opcode == _XBEGIN[0] and d.modrm == _XBEGIN[1]))


# --- where the source comes from -----------------------------------------------------


class Source(NamedTuple):
    """A kernel source to build from: a Debian package's tarball, another tarball, or a tree."""

    spec: str  # what followed "linux-insn@"
    kind: str  # 'package', 'tarball' or 'tree'
    path: str


PACKAGE_TARBALL = "/usr/src/linux-source-{version}.tar.xz"
_VERSION = re.compile(r"^\d+\.\d+$")


def locate(spec: str) -> Source:
    """The source ``linux-insn@SPEC`` names; ``InputError`` (one line: what to install) when it is missing."""
    if _VERSION.match(spec):
        tarball = PACKAGE_TARBALL.format(version=spec)
        if os.path.isfile(tarball):
            return Source(spec, "package", tarball)
        package = f"linux-source-{spec}"
        if not _apt_knows(package):
            raise InputError(f"linux-insn@{spec}: Debian has no package {package} (apt-cache show finds none; "
                             f"'apt-cache search ^linux-source-' lists them), or give a tree: linux-insn@/path/to/linux")
        raise InputError(f"linux-insn@{spec} needs {tarball}: install Debian's {package} "
                         f"(as root: apt-get update && apt-get install -y {package})")
    if os.sep in spec or spec.startswith((".", "~")):
        path = os.path.abspath(os.path.expanduser(spec))
        if os.path.isdir(path):
            return Source(spec, "tree", path)
        if os.path.isfile(path) and ".tar" in os.path.basename(path):
            return Source(spec, "tarball", path)
        raise InputError(f"linux-insn@{spec}: no kernel tree or source tarball there")
    raise InputError(f"linux-insn@{spec}: give a version with a Debian source package (linux-insn@6.1, "
                     f"linux-insn@6.12) or a kernel tree's path (linux-insn@/path/to/linux)")


def _apt_knows(package: str) -> bool:
    apt_cache = shutil.which("apt-cache")
    if apt_cache is None:
        return True  # cannot tell: say what to install
    proc = subprocess.run([apt_cache, "show", "--no-all-versions", package], capture_output=True, text=True)
    return proc.returncode == 0 and bool(proc.stdout.strip())


def _tarball_files(path: str) -> dict[str, bytes]:
    """``NEEDED`` out of a kernel source tarball (one streamed pass; the top directory stripped)."""
    want = set(NEEDED)
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                rel = member.name.split("/", 1)[-1]
                if rel in want and member.isfile():
                    files[rel] = tar.extractfile(member).read()
                    if len(files) == len(want):
                        break
    except (OSError, tarfile.TarError, EOFError) as e:
        raise InputError(f"{path}: cannot read the kernel source tarball: {e}") from None
    return files


def _tree_files(root: str) -> dict[str, bytes]:
    files = {}
    for rel in NEEDED:
        p = os.path.join(root, rel)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                files[rel] = f.read()
    return files


def _check_files(files: dict[str, bytes], where: str) -> None:
    missing = [r for r in _REQUIRED if r not in files]
    if missing:
        raise InputError(f"{where}: not a kernel tree with the x86 instruction decoder: no {missing[0]}")
    for rel in NEEDED:
        if rel.startswith("arch/") and rel in files:
            theirs = files.get("tools/" + rel)
            if theirs is not None and _unmarked(files[rel]) != _unmarked(theirs):
                raise InputError(f"{where}: {rel} and tools/{rel} differ beyond the lines marked "
                                 f"{_SYNC_MARK}: the gate builds the tools/ copy; copy your change to both")


def _unmarked(data: bytes) -> list[bytes]:
    return [line for line in data.splitlines() if _SYNC_MARK.encode() not in line]


def kernel_version(makefile: bytes) -> str:
    """``VERSION.PATCHLEVEL.SUBLEVEL`` from the top Makefile."""
    fields = dict(re.findall(rb"^(VERSION|PATCHLEVEL|SUBLEVEL|EXTRAVERSION)\s*=[ \t]*(\S*)", makefile, re.M))
    parts = [fields.get(k, b"?").decode() for k in (b"VERSION", b"PATCHLEVEL", b"SUBLEVEL")]
    return ".".join(parts) + fields.get(b"EXTRAVERSION", b"").decode()


# --- the build -----------------------------------------------------------------------


class Build(NamedTuple):
    """A built decoder: its directory in the cache, library, kernel version and source digest."""

    directory: str
    library: str
    kernel_version: str
    sha256: str
    source: Source


def cache_root(cache_dir: str | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / "linux-insn"


def build(source: Source, cache_dir: str | None = None) -> Build:
    """The decoder built from ``source``, from the cache when it is there."""
    if source.kind == "tree":
        files = _tree_files(source.path)
        _check_files(files, source.path)
        digest = _files_digest(files)
    else:
        digest, files = _file_sha256(source.path, cache_dir), None
    directory = cache_root(cache_dir) / digest
    library = directory / f"linux-insn-{_GLUE_ID}.so"
    manifest = directory / "manifest.json"
    if library.is_file() and manifest.is_file():
        return Build(str(directory), str(library), json.loads(manifest.read_text())["kernel_version"], digest,
                     source)
    if files is None:
        files = _read_back(directory) or _tarball_files(source.path)
        _check_files(files, source.path)
    _compile(files, directory, library, source, digest)
    return Build(str(directory), str(library), kernel_version(files["Makefile"]) if "Makefile" in files else "?",
                 digest, source)


def _files_digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    return h.hexdigest()


@functools.lru_cache(maxsize=16)
def _sha256_at(path: str, size: int, mtime_ns: int, cache_dir: str | None) -> str:
    """A tarball's sha256, remembered in ``<cache>/linux-insn/tarballs.json`` by path, size and mtime
    (hashing 140 MB on every run would cost more than decoding a kernel)."""
    index_path = cache_root(cache_dir) / "tarballs.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    key = f"{path} {size} {mtime_ns}"
    if isinstance(index, dict) and isinstance(index.get(key), str):
        return index[key]
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    index = {k: v for k, v in (index.items() if isinstance(index, dict) else ()) if not k.startswith(path + " ")}
    index[key] = digest
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        partial = index_path.with_name(f"tarballs.json.{os.getpid()}")
        partial.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        os.replace(partial, index_path)
    except OSError:
        pass  # a read-only cache: hash again next time
    return digest


def _file_sha256(path: str, cache_dir: str | None = None) -> str:
    st = os.stat(path)
    return _sha256_at(path, st.st_size, st.st_mtime_ns, cache_dir)


def _read_back(directory: Path) -> dict[str, bytes] | None:
    """The source files of an earlier build (a new glue rebuilds without reading the tarball again)."""
    src = directory / "src"
    if not (directory / "manifest.json").is_file() or not src.is_dir():
        return None
    return {rel: (src / rel).read_bytes() for rel in NEEDED if (src / rel).is_file()}


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise InputError(f"linux-insn needs {name} to build the kernel's decoder: apt-get install -y {package}")
    return path


def _compile(files: dict[str, bytes], directory: Path, library: Path, source: Source, digest: str) -> None:
    """Write the sources, generate ``inat-tables.c`` with the kernel's awk script, compile; atomically."""
    cc, awk = _tool("cc", "gcc"), _tool("awk", "mawk")
    directory.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=directory.parent))
    try:
        src = work / "src"
        for rel, data in files.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
        header = (src / "tools/arch/x86/include/asm/insn.h").read_text(errors="replace")
        if "insn_decode(" not in header:
            raise InputError(f"{source.path}: this kernel's insn.h has no insn_decode() (it came in 5.12): "
                             f"not supported")
        tables = subprocess.run([awk, "-f", str(src / "tools/arch/x86/tools/gen-insn-attr-x86.awk"), str(src / MAP)],
                                capture_output=True)
        if tables.returncode != 0 or not tables.stdout:
            raise InputError(f"{source.path}: gen-insn-attr-x86.awk failed on x86-opcode-map.txt: "
                             f"{_first_line(tables.stderr)}")
        (work / "inat-tables.c").write_bytes(tables.stdout)
        (work / "linux_insn_glue.c").write_text(GLUE_C)
        out = work / library.name
        command = [cc, "-O2", "-shared", "-fPIC", "-w", "-MD", "-MF", str(work / "glue.d"),
                   "-I", str(src / "tools/arch/x86/lib"), "-I", str(src / "tools/arch/x86/include"),
                   "-I", str(src / "tools/include"), "-I", str(work),
                   "-o", str(out), str(work / "linux_insn_glue.c")]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise InputError(f"{source.path}: compiling the kernel's decoder failed: {_first_error(proc.stderr)}")
        manifest = {
            "source": source._asdict(), "sha256": digest, "kernel_version": kernel_version(files.get("Makefile", b"")),
            "glue": _GLUE_ID, "compile": " ".join(command).replace(str(work), "."),
            "headers": _headers_read(work / "glue.d", work),
            "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())},
        }
        (work / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        _install(work, directory, library.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _install(work: Path, directory: Path, name: str) -> None:
    """Move a finished build into place; a concurrent build of the same source may have won."""
    if not directory.exists():
        try:
            os.rename(work, directory)
            return
        except OSError:
            if not directory.exists():
                raise
    for entry in ("src", "inat-tables.c", "linux_insn_glue.c", "glue.d", "manifest.json"):
        if entry == "src" and (directory / entry).exists():
            continue
        os.replace(work / entry, directory / entry)
    os.replace(work / name, directory / name)
    for stale in directory.glob("linux-insn-*.so"):
        if stale.name != name:
            stale.unlink(missing_ok=True)


def _headers_read(depfile: Path, work: Path) -> list[str]:
    """The files the compiler read from the tree (``-MD``): the proof that ``NEEDED`` suffices."""
    text = depfile.read_text().replace("\\\n", " ")
    paths = text.split(":", 1)[1].split()
    prefix = str(work / "src") + os.sep
    return sorted({os.path.normpath(p)[len(prefix):] for p in paths if os.path.normpath(p).startswith(prefix)})


def _first_line(text: bytes | str) -> str:
    text = text.decode(errors="replace") if isinstance(text, bytes) else text
    return next((line.strip() for line in text.splitlines() if line.strip()), "no message")[:200]


def _first_error(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if "error" in line), _first_line(text))[:240]


# --- the library -----------------------------------------------------------------------


class _Library:
    """The built shared library, called in batches."""

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise InputError(f"linux-insn: cannot load {path}: {e}") from None
        if self.lib.li_abi() != _OUT.size:
            raise InputError(f"linux-insn: {path} was built from another glue; delete it to rebuild")
        self.lib.li_decode.restype = ctypes.c_long
        self.lib.li_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_long,
                                       ctypes.c_void_p]

    def decode(self, strings: list[bytes]) -> bytes:
        """``struct li_out`` per byte string (each at most ``MAX_INSN`` bytes), end to end."""
        if not strings:
            return b""
        n = len(strings)
        lengths = bytes(map(len, strings))
        offsets = array.array("i", itertools.accumulate(lengths, initial=0))
        out = ctypes.create_string_buffer(_OUT.size * n)
        self.lib.li_decode(b"".join(strings), offsets.buffer_info()[0], lengths, n, out)
        return out.raw

    def rows(self, strings: list[bytes]) -> list[tuple]:
        return list(_OUT.iter_unpack(self.decode(strings)))


# --- the opcode map's lines -------------------------------------------------------------

_GROUP = re.compile(r"\b(Grp\w+)")


class OpcodeMap:
    """x86-opcode-map.txt as entries: (table, opcode) and (group, reg) -> the line's text.

    Tables are named by their ``Table:`` line and found by ``AVXcode`` (0 for the
    one-byte table, 1 for ``0f``, 2 for ``0f 38``, 3 for ``0f 3a``, 4-7 for the
    EVEX/VEX maps), the same lookup ``inat_get_avx_attribute`` and the escape
    chain make; groups by their ``GrpTable:`` name and the ModRM reg field."""

    def __init__(self, text: str) -> None:
        self.entries: dict[tuple[str, str], str] = {}
        self.tables: dict[int, str] = {}
        table = None
        for line in text.splitlines():
            line = line.split("#", 1)[0].rstrip() if not line.startswith("#") else ""
            if line.startswith(("Table:", "GrpTable:")):
                table = line.split(":", 1)[1].strip()
            elif line.startswith("AVXcode:") and table is not None:
                code = line.split(":", 1)[1].strip()
                self.tables[int(code) if code else 0] = table
            elif line.startswith(("EndTable", "Referrer:")):
                table = None if line.startswith("EndTable") else table
            elif table is not None and re.match(r"^[0-9a-f]{1,2}:", line):
                key, text_ = line.split(":", 1)
                self.entries[(table, key)] = text_.strip()

    def diff(self, other: "OpcodeMap") -> dict[tuple[str, str], tuple[str | None, str | None]]:
        """Every entry whose text differs: key -> (this map's line, the other's)."""
        keys = set(self.entries) | set(other.entries)
        return {k: (self.entries.get(k), other.entries.get(k)) for k in sorted(keys)
                if self.entries.get(k) != other.entries.get(k)}

    def keys(self, d: Decoded, raw: bytes) -> tuple[tuple[str, str], ...]:
        """The entries that decided ``d``: the opcode's line, its group's line, and REX2's prefix line."""
        if not d.opcode:
            return ()
        keys = []
        start = d.emulate_prefix + d.prefixes
        if d.vex:
            vex = raw[start + d.rex:]
            code = 1 if d.vex == 2 else vex[1] & (0x07 if d.vex == 4 else 0x1F)
        elif d.rex == 2:
            keys.append((self.tables.get(0, "one byte opcode"), "d5"))
            code = 1 if raw[start + 1] & 0x80 else 0
        else:
            code = {b"\x0f": 1, b"\x0f\x38": 2, b"\x0f\x3a": 3}.get(d.opcode[:-1], 0)
        table = self.tables.get(code, f"AVXcode {code}")
        key = (table, f"{d.opcode[-1]:02x}")
        keys.append(key)
        group = _GROUP.search(self.entries.get(key, ""))
        if group and d.modrm_offset is not None and d.modrm_offset < len(raw):
            keys.append((group.group(1), str((raw[d.modrm_offset] >> 3) & 7)))
        return tuple(keys)


# --- the adapter -----------------------------------------------------------------------


class LinuxInsnAdapter:
    """The kernel's ``insn_decode`` behind ``protocol.Decoder`` (``linux-insn@SPEC``)."""

    fields = frozenset({"length", "disp", "imm", "target"})

    def __init__(self, name: str, built: Build) -> None:
        self.name = name
        self.build = built
        self._lib = _Library(built.library)
        self._shapes: dict[bytes, tuple[Facts, bool, bool]] = {}

    def opcode_map(self) -> OpcodeMap:
        """The opcode map this decoder's tables were generated from."""
        return OpcodeMap((Path(self.build.directory) / "src" / MAP).read_text(errors="replace"))

    def map_keys(self, strings: list[bytes]) -> list[tuple[tuple[str, str], ...]]:
        """Per byte string, the opcode-map entries that decided its answer (``OpcodeMap.keys``)."""
        table = self.opcode_map()
        return [table.keys(d, s[:MAX_INSN].ljust(MAX_INSN, b"\x90") if d.padded else s[:MAX_INSN])
                for d, s in zip(self.decode_detail(strings), strings)]

    def version(self) -> str:
        """The kernel version and the source's digest: answers are cached per source."""
        return f"{self.build.kernel_version} {self.build.sha256[:12]}"

    def _rows(self, strings: list[bytes]) -> tuple[list[tuple], set[int]]:
        """Rows per byte string, and which were decoded again padded with nops (after running out of bytes)."""
        strings = [s[:MAX_INSN] for s in strings]
        rows = self._lib.rows(strings)
        short = [i for i, (row, s) in enumerate(zip(rows, strings)) if row[0] == -61 and len(s) < MAX_INSN]
        padded = set()
        for i, row in zip(short, self._lib.rows([strings[i].ljust(MAX_INSN, b"\x90") for i in short])):
            if row[0] == 0:
                rows[i] = row
                padded.add(i)
        return rows, padded

    def decode_detail(self, strings: list[bytes]) -> list[Decoded]:
        """``Decoded`` per byte string; one that runs out of bytes is decoded again with nop padding."""
        rows, padded = self._rows(strings)
        return [_decoded(row, i in padded) for i, row in enumerate(rows)]

    def decode_many(self, items):
        """``facts`` per ``(address, bytes)``, through a table of answer shapes: strings whose rows differ
        only in the displacement and immediate values share a ``Facts`` (a branch's target is added)."""
        strings = [raw[:MAX_INSN] for _, raw in items]
        buf = self._lib.decode(strings)
        shapes, size, out, short = self._shapes, _OUT.size, [], []
        unpack, imm1, new = _OUT.unpack_from, _IMM1.unpack_from, tuple.__new__
        for i in range(len(strings)):
            at = i * size
            key = buf[at:at + _SHAPE]
            hit = shapes.get(key)
            if hit is None:
                row = unpack(buf, at)
                d = _decoded(row, False)
                f = _shape(d)
                # a branch keeps its Facts' fields before and after target_delta, to build one per target
                hit = shapes[key] = (f, (f[:6], f[7:]) if _relative_branch(d) else None, row[0] == -61)
            f, branch, ran_out = hit
            if branch is not None:  # Facts(*head, target, *tail), without _replace's per-field work
                f = new(Facts, branch[0] + (((buf[at + 12] + imm1(buf, at + _SHAPE)[0]) & MASK64),) + branch[1])
            elif ran_out and len(strings[i]) < MAX_INSN:
                short.append(i)
            out.append(f)
        if short:
            for i, d in zip(short, self.decode_detail([strings[i] for i in short])):
                out[i] = facts(d)
        return out


def adapter(name: str, cache_dir: str | None = None) -> LinuxInsnAdapter:
    """``linux-insn@SPEC`` (the registry's entry point)."""
    return LinuxInsnAdapter(name, build(locate(name[len(PREFIX):]), cache_dir))


def from_cache(name: str, version: str, cache_dir: str | None = None) -> LinuxInsnAdapter | None:
    """The decoder a baseline names (``name``, ``version()``) as it was built then, from the cache.

    The version ends with the source's digest, and the build directory is named
    by it: a tree edited since (the patch under test) still has its earlier
    build there.  None when no build of that digest is cached."""
    prefix = version.rsplit(" ", 1)[-1]
    if not re.fullmatch(r"[0-9a-f]{12,64}", prefix):
        return None
    for directory in sorted(cache_root(cache_dir).glob(prefix + "*")):
        library, manifest = directory / f"linux-insn-{_GLUE_ID}.so", directory / "manifest.json"
        if library.is_file() and manifest.is_file():
            doc = json.loads(manifest.read_text())
            source = Source(**doc["source"])
            return LinuxInsnAdapter(name, Build(str(directory), str(library), doc["kernel_version"], doc["sha256"],
                                                source))
    return None


@functools.lru_cache(maxsize=8)
def cached_adapter(name: str) -> LinuxInsnAdapter:
    """One adapter per name per process (building or loading it costs a tarball hash)."""
    return adapter(name)

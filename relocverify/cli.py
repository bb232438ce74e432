"""The thin command line.  Every command returns one of the fixed exit codes.

  0  clean: a relocatable plan that is proved (``check``), a proof (``prove``), no findings
  1  findings: a rejected plan, a refuted relocation, corpus entries that missed their expectation
  2  usage or input error (bad hex, bad address, unreadable image): a one-line message on stderr
  3  unknown: no proof and no refutation (``unknown`` or ``opaque`` verdicts)

``RelocverifyError`` and argparse errors are converted here and nowhere else.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence, TextIO

from .errors import InputError, RelocverifyError

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 3

DEFAULT_AT = 0xFFFFFFFF81234560  # an address in kernel text
DEFAULT_TRAMP = 0xFFFFFFFFC0001000  # module space, within rel32 reach of kernel text (as kinst places them)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise InputError(f"{self.prog}: {message}")


def parse_hex_bytes(text: str, what: str = "HEX") -> bytes:
    cleaned = "".join(text.split())
    if cleaned.lower().startswith("0x"):
        cleaned = cleaned[2:]
    if not cleaned:
        raise InputError(f"{what} is empty: give the instruction bytes in hex, e.g. 'f0 ff 05 00 00 00 00'")
    if len(cleaned) % 2:
        raise InputError(f"{what} has an odd number of hex digits: {text!r}")
    try:
        raw = bytes.fromhex(cleaned)
    except ValueError:
        raise InputError(f"{what} is not hex: {text!r}") from None
    return raw


def parse_address(text: str) -> int:
    t = text.strip().lower()
    if not t.startswith("0x"):
        raise InputError(f"address {text!r} must be hex with a 0x prefix, e.g. 0xffffffff81000000")
    try:
        v = int(t, 16)
    except ValueError:
        raise InputError(f"address {text!r} is not hex") from None
    if not 0 <= v < 1 << 64:
        raise InputError(f"address {text!r} does not fit in 64 bits")
    return v


def parse_range(text: str) -> tuple[int, int]:
    addr, sep, size = text.partition(":")
    if not sep:
        raise InputError(f"range {text!r} must be ADDR:SIZE, e.g. 0xffffffffc0002000:16")
    try:
        n = int(size, 0)
    except ValueError:
        raise InputError(f"range {text!r}: size is not a number") from None
    return parse_address(addr), n


def _one_instruction(raw: bytes, at: int):
    from .decoders import decode
    from .instruction import Disagreement, Instruction, Undecodable

    if len(raw) > 15:
        raise InputError(f"HEX has {len(raw)} bytes; an x86 instruction has at most 15")
    decoded = decode(raw, at)
    if isinstance(decoded, Instruction) and decoded.length != len(raw):
        raise InputError(f"HEX holds more than one instruction: the first, {decoded.text!r}, is "
                         f"{decoded.length} bytes of {len(raw)}")
    if isinstance(decoded, Undecodable):
        raise InputError(f"HEX {raw.hex(' ')} is undecodable: {decoded.reason}")
    if isinstance(decoded, Disagreement) and decoded.length != len(raw):
        raise InputError(f"HEX: the decoders disagree on its length ({decoded.reason}); give one instruction")
    return decoded


def _disasm(code: bytes, at: int) -> list[str]:
    import capstone

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.syntax = capstone.CS_OPT_SYNTAX_ATT
    out, off = [], 0
    while off < len(code):
        ins = next(md.disasm(code[off:], at + off, 1), None)
        if ins is None:
            out.append(f"  {at + off:#018x}  .byte {code[off]:#04x}")
            off += 1
            continue
        out.append(f"  {ins.address:#018x}  {ins.bytes.hex():<24} {ins.mnemonic} {ins.op_str}")
        off += ins.size
        if ins.mnemonic.startswith("jmp") and ins.bytes[:2] == b"\xff\x25" and ins.bytes[2:6] == b"\0\0\0\0":
            out.append(f"  {at + off:#018x}  .quad {int.from_bytes(code[off:off + 8], 'little'):#x}")
            off += 8
    return out


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------


def cmd_check(args, out: TextIO) -> int:
    from .instruction import Instruction
    from .plan import make_plan
    from .proof import prove_plan
    from .verdict import verdict_exit_code

    raw = parse_hex_bytes(args.hex)
    decoded = _one_instruction(raw, args.at)
    plan = make_plan(decoded, args.tramp)
    result = prove_plan(decoded, plan, timeout_ms=args.timeout * 1000)
    site_doc = None
    if args.image:
        result, site_doc = _check_sites(args, decoded, plan, result)
    if args.json:
        doc = {
            "length": decoded.length,
            "mnemonic": decoded.text if isinstance(decoded, Instruction) else None,
            "decoders": {a.decoder: a.length for a in decoded.answers},
            "decode": decoded.as_json() if isinstance(decoded, Instruction) else
            {"kind": type(decoded).__name__.lower(), "reason": decoded.reason,
             "answers": {a.decoder: a.as_json() for a in decoded.answers}},
            "plan": plan.as_json(),
            **result.as_json(),
        }
        if site_doc is not None:
            doc["sites"] = site_doc
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        if isinstance(decoded, Instruction):
            out.write(f"{decoded.address:#x}: {decoded.raw.hex(' ')}  {decoded.text}\n")
            out.write("decoders: " + ", ".join(f"{a.decoder}={a.length}" for a in decoded.answers) + "\n")
            for n in decoded.notes:
                out.write(f"note: {n}\n")
        else:
            out.write(f"{decoded.address:#x}: {decoded.raw.hex(' ')}  ({decoded.reason})\n")
            out.write("decoders: " + ", ".join(f"{a.decoder}={a.length}" for a in decoded.answers) + "\n")
        out.write(f"plan: {plan.kind.value} ({plan.rule}): {plan.reason}\n")
        if plan.trampoline:
            out.write(f"trampoline at {plan.tramp:#x}:\n")
            out.write("\n".join(_disasm(plan.trampoline, plan.tramp)) + "\n")
        for e in plan.effects:
            out.write(f"  effect: {e.describe()}\n")
        for site in site_doc or ():
            out.write(f"site: {site['kind']} at {site['address']} ({site['consequence']}): {site['reason']}\n")
        out.write(result.render())
    return verdict_exit_code(result.verdict)


def _check_sites(args, decoded, plan, result):
    """The verdict at --at in the kernel image: its sites, and every variant that can run there."""
    from .batch import site_verdict
    from .image import load_image
    from .sites import POLICY_BY_KIND, find_sites
    from .verdict import ProofResult, Verdict

    image = load_image(args.image, args.system_map)
    if not image.is_executable(decoded.address):
        raise InputError(f"--at {decoded.address:#x} is not in an executable section of {args.image}")
    if image.read(decoded.address, decoded.length) != decoded.raw:
        raise InputError(f"HEX is not the bytes of {args.image} at {decoded.address:#x}")
    row = (result.verdict.value, result.reason, result.method, plan.kind.value, plan.rule, "", "")
    new, found = site_verdict(image, find_sites(image), decoded.raw, decoded.address, plan.tramp,
                              args.timeout, row)
    doc = [{"kind": s.kind, "address": hex(s.address), "length": s.length,
            "consequence": POLICY_BY_KIND[s.kind].consequence if s.kind in POLICY_BY_KIND else "mark",
            "reason": POLICY_BY_KIND[s.kind].reason if s.kind in POLICY_BY_KIND else ""} for s in found]
    if new[0] != row[0] or new[1] != row[1]:
        result = ProofResult(Verdict(new[0]), new[1], new[2])
    return result, doc


# ---------------------------------------------------------------------------
# prove
# ---------------------------------------------------------------------------


def cmd_prove(args, out: TextIO) -> int:
    from .proof import prove_relocation
    from .verdict import verdict_exit_code

    orig = parse_hex_bytes(args.orig, "--orig")
    reloc = parse_hex_bytes(args.reloc, "--reloc")
    decoded = _one_instruction(orig, args.at)
    result = prove_relocation(decoded, reloc, args.tramp, timeout_ms=args.timeout * 1000,
                              tracer_memory=tuple(args.tracer_memory or ()))
    if args.json:
        json.dump(result.as_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(result.render())
    return verdict_exit_code(result.verdict)


def cmd_replay(args, out: TextIO) -> int:
    from .replay import replay_command

    return replay_command(args, out)


def cmd_policy(args, out: TextIO) -> int:
    from .policy import RULES

    for r in RULES:
        out.write(f"{r.name:<22} {r.strategy:<15} {r.reason}\n")
    return EXIT_CLEAN


def cmd_corpus(args, out: TextIO) -> int:
    from . import corpus

    return corpus.command(args, out)


def cmd_vmlinux(args, out: TextIO) -> int:
    from . import batch

    return batch.command(args, out)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="relocverify", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="decode, plan and prove one instruction")
    c.add_argument("hex", metavar="HEX", help="one instruction in hex (spaces allowed)")
    c.add_argument("--at", type=parse_address, default=DEFAULT_AT, metavar="ADDR")
    c.add_argument("--tramp", type=parse_address, default=DEFAULT_TRAMP, metavar="ADDR")
    c.add_argument("--json", action="store_true")
    c.add_argument("--timeout", type=float, default=10.0, help="solver timeout in seconds")
    c.add_argument("--image", default=None, metavar="VMLINUX",
                   help="the kernel the bytes come from: also check the kernel sites at --at")
    c.add_argument("--system-map", default=None)
    c.set_defaults(func=cmd_check)

    pr = sub.add_parser("prove", help="check a relocation made by another tool")
    pr.add_argument("--orig", required=True, metavar="HEX")
    pr.add_argument("--at", type=parse_address, required=True, metavar="A")
    pr.add_argument("--reloc", required=True, metavar="HEX")
    pr.add_argument("--tramp", type=parse_address, required=True, metavar="T")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("--timeout", type=float, default=10.0)
    pr.add_argument("--tracer-memory", type=parse_range, action="append", metavar="ADDR:SIZE",
                    help="memory the relocating tool owns (save slots): left out of the comparison")
    pr.set_defaults(func=cmd_prove)

    rp = sub.add_parser("replay", help="replay a counterexample concretely on unicorn")
    rp.add_argument("--orig", required=True, metavar="HEX")
    rp.add_argument("--at", type=parse_address, required=True)
    rp.add_argument("--reloc", metavar="HEX", default=None, help="relocated bytes at T (or give --effects)")
    rp.add_argument("--effects", metavar="JSON", default=None, help="an emulate plan's effects as JSON")
    rp.add_argument("--tramp", type=parse_address, required=True)
    rp.add_argument("--state", required=True, metavar="JSON", help="the counterexample's input state")
    rp.set_defaults(func=cmd_replay)

    po = sub.add_parser("policy", help="print the relocation policy table")
    po.set_defaults(func=cmd_policy)

    co = sub.add_parser("corpus", help="run the bundled corpora, or fetch a real kernel")
    co_sub = co.add_subparsers(dest="corpus_command", required=True, parser_class=_Parser)
    cr = co_sub.add_parser("run", help="check every entry of the corpora against its expected outcome")
    cr.add_argument("paths", nargs="*", help="corpus files (default: the bundled corpora)")
    cr.add_argument("--json", action="store_true")
    cf = co_sub.add_parser("fetch", help="download a named Debian kernel")
    cf.add_argument("name")
    cf.add_argument("--cache", default=None)
    co.set_defaults(func=cmd_corpus)

    v = sub.add_parser("vmlinux", help="verify every instruction of a kernel image")
    v.add_argument("path", nargs="?", default=None,
                   help="vmlinux ELF or bzImage (default: the fetched Debian 6.1 cloud kernel)")
    v.add_argument("--system-map", default=None)
    v.add_argument("--db", default=None)
    v.add_argument("--jobs", type=int, default=None)
    v.add_argument("--trampoline-base", type=parse_address, default=DEFAULT_TRAMP)
    v.add_argument("--summary-json", default=None)
    v.add_argument("--timeout", type=float, default=10.0)
    v.add_argument("--limit", type=int, default=None, help="verify only the first N functions")
    v.add_argument("--no-progress", action="store_true")
    v.set_defaults(func=cmd_vmlinux)
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return args.func(args, out)
    except RelocverifyError as e:
        err.write(f"relocverify: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.write("relocverify: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())

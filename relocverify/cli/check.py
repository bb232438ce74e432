"""``relocverify check``: decode, plan and prove one instruction, given by its bytes or by its address.

    relocverify check 48 8b 05 10 00 00 00 [--at ADDR]     bytes (quoted or not), at ADDR
    relocverify check --image VMLINUX tcp_v4_rcv+0x19      the instruction the image holds there

With ``--image`` the kernel's sites at the address are checked too, and
every variant that can run there; the image's index (functions, sites, code)
is cached on disk (``store.image_index``), and the proof is looked up in the
persistent proof cache first, so a second question about the same kernel
neither reloads the image nor, for a shape proved before, loads the solver.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

import iced_x86

from ..errors import InputError
from ..inputs import parse_hex_bytes
from ..plan.plan import DEFAULT_AT
from ..x86.decode import decode
from ..x86.instruction import Disagreement, Instruction, Undecodable
from . import locate
from .render import disasm, escape, wrap

MAX_INSTRUCTION = 15


def one_instruction(raw: bytes, at: int):
    """``raw`` decoded at ``at``, which must hold exactly one instruction."""
    if len(raw) > MAX_INSTRUCTION:
        raise InputError(f"HEX has {len(raw)} bytes; an x86 instruction has at most {MAX_INSTRUCTION}")
    decoded = decode(raw, at)
    if isinstance(decoded, Instruction) and decoded.length != len(raw):
        raise InputError(f"HEX holds more than one instruction: the first, {decoded.text!r}, is "
                         f"{decoded.length} bytes of {len(raw)}")
    if isinstance(decoded, Undecodable):
        raise InputError(f"HEX {raw.hex(' ')} is undecodable: {decoded.reason}")
    if isinstance(decoded, Disagreement) and decoded.length != len(raw):
        raise InputError(f"HEX: the decoders disagree on its length ({decoded.reason}); give one instruction")
    return decoded


def _bytes_at(index, address: int) -> bytes:
    """The instruction at ``address`` in the indexed image (its length by iced-x86)."""
    if not index.image.is_executable(address):
        raise InputError(f"{address:#x} is not in an executable section of the image")
    section = index.image.section_at(address)
    window = index.image.read(address, min(MAX_INSTRUCTION, section.address + len(section.data) - address))
    ins = iced_x86.Decoder(64, window, ip=address).decode()
    return window[:ins.len] if not ins.is_invalid else window[:1]


def _instruction(args, index):
    """(decoded, location): from an ADDRESS in --image, or from HEX at --at."""

    words = " ".join(args.hex)
    if index is not None and args.at is None:
        if len(args.hex) != 1:
            raise InputError(f"with --image, give one ADDRESS (e.g. tcp_v4_rcv+0x19), not {words!r}; to check "
                             f"bytes against the image, give them with --at")
        at, loc = locate.resolve(locate.location(args.hex[0]), index, DEFAULT_AT, "ADDRESS")
        return one_instruction(_bytes_at(index, at), at), loc
    raw = parse_hex_bytes(words)
    at, loc = locate.resolve(args.at, index, DEFAULT_AT)
    decoded = one_instruction(raw, at)  # bad input is refused before the checker (angr, z3) is imported
    if index is not None:
        if not index.image.is_executable(at):
            raise InputError(f"--at {at:#x} is not in an executable section of {args.image}")
        if index.image.read(at, decoded.length) != decoded.raw:
            raise InputError(f"HEX is not the bytes of {args.image} at {at:#x}")
    return decoded, loc


def _names_a_location(words: list[str]) -> bool:
    """One word that is no hex but is a location (``vfs_read+0x1c``, ``kprobe:vfs_read+28``)."""
    if len(words) != 1:
        return False
    try:
        parse_hex_bytes(words[0])
        return False
    except InputError:
        pass
    try:
        return locate.location(words[0]).symbolic
    except InputError:
        return False


def _default_image(args) -> str:
    """A location with no ``--image`` is read in the default kernel, as ``vmlinux`` and ``audit`` default to it,
    when it is in the cache already (a typo must not start a 300 MB download); else say how to give one."""
    from ..engine.requests import DEFAULT_KERNEL
    from ..image.fetch import cached_vmlinux

    path = cached_vmlinux(DEFAULT_KERNEL)
    if path is None:
        raise InputError(f"{args.hex[0]} is a location, not hex: name the kernel it is in with --image VMLINUX, "
                         f"or fetch the default kernel once (relocverify corpus fetch {DEFAULT_KERNEL}) and it "
                         f"is read there")
    args.image = path
    return f"{args.hex[0]} without --image: read in the default kernel, {DEFAULT_KERNEL} (give --image VMLINUX " \
           f"for another)"


def command(args, out: TextIO) -> int:
    from . import live as live_cli

    live_cli.check_options(args)
    defaulted = None
    if args.running:
        live_cli.note("check", live_cli.running_image(args))
    elif not getattr(args, "image", None) and args.at is None and _names_a_location(args.hex):
        if not args.live_text and live_cli.default_running():  # a captured live text is not this machine's
            args.running = True
            defaulted = f"{args.hex[0]} without --image: read in {live_cli.running_image(args)} (give --image " \
                        f"VMLINUX for another)"
        else:
            defaulted = _default_image(args)
    index = locate.image_index(args)
    if live_cli.wants_live(args) and (index is None or args.at is not None):
        raise InputError("--running and --live-text judge an ADDRESS in a kernel (e.g. kprobe:tcp_v4_rcv+28), "
                         "not HEX at --at")
    try:
        decoded, loc = _instruction(args, index)
    except InputError as exc:
        raise InputError(f"{exc} ({defaulted})" if defaulted else str(exc)) from None
    if defaulted:
        sys.stderr.write(f"check: {defaulted}\n")

    from ..engine.one_instruction import verify_instruction
    from ..environment import default_proof_cache_dir
    from ..proof.prove import plan_assumptions
    from ..proof.verdict import ProofResult, Verdict, verdict_exit_code

    image, sites = (index.image, index.sites) if index is not None else (None, None)
    cache_dir = None if args.no_cache else default_proof_cache_dir()
    live = _live(args, index, loc, decoded, cache_dir) if live_cli.wants_live(args) else None
    if live is not None and not isinstance(live, live_cli.Unread):
        decoded, checked = live.decoded, live.checked.check
    else:
        checked = verify_instruction(decoded, args.tramp, args.timeout, cache_dir, image, sites)
    plan, finding = checked.plan, checked.finding
    assumes = plan_assumptions(decoded, plan) if finding.verdict is Verdict.PROVED else ()
    result = ProofResult(finding.verdict, finding.reason, finding.method, finding.counterexample, assumes=assumes)
    where = locate.describe(loc)
    if args.json:
        doc = {
            "address": hex(decoded.address),
            "location": where or None,
            "length": decoded.length,
            "mnemonic": decoded.text if isinstance(decoded, Instruction) else None,
            "decoders": {a.decoder: a.length for a in decoded.answers},
            "decode": decoded.as_json() if isinstance(decoded, Instruction) else
            {"kind": type(decoded).__name__.lower(), "reason": decoded.reason,
             "answers": {a.decoder: a.as_json() for a in decoded.answers}},
            "plan": plan.as_json(),
            **result.as_json(),
            "cached": not finding.fresh and finding.verdict.value != "rejected",
        }
        if checked.sites is not None:
            doc["sites"] = [site.as_json() for site in checked.sites]
        if live is not None:
            doc["live"] = _live_json(live)
        json.dump(doc, out, indent=2, ensure_ascii=True)
        out.write("\n")
        return verdict_exit_code(result.verdict)
    label = f"{escape(where)} " if where else ""
    if isinstance(decoded, Instruction):
        out.write(f"{label}{decoded.address:#x}: {decoded.raw.hex(' ')}  {decoded.text}\n")
        out.write("decoders: " + ", ".join(f"{a.decoder}={a.length}" for a in decoded.answers) + "\n")
        for n in decoded.notes:
            out.write(f"note: {n}\n")
    else:
        out.write(f"{label}{decoded.address:#x}: {decoded.raw.hex(' ')}  ({decoded.reason})\n")
        out.write("decoders: " + ", ".join(f"{a.decoder}={a.length}" for a in decoded.answers) + "\n")
    out.write(wrap(f"plan: {plan.kind.value} ({plan.rule}): {plan.reason}") + "\n")
    if plan.trampoline:
        out.write(f"the tracer runs, at {plan.tramp:#x}:\n")
        out.write("\n".join(disasm(plan.trampoline, plan.tramp)) + "\n")
    for e in plan.effects:
        out.write(f"  the tracer emulates: {e.describe()}\n")
    for site in checked.sites or ():
        out.write(wrap(f"site: {site.kind} at {site.address:#x} ({site.consequence}): {escape(site.reason)}") + "\n")
    for line in _live_lines(live):
        out.write(wrap(escape(line)) + "\n")
    text = result.render()
    first, _, rest = text.partition("\n")
    out.write(wrap(first) + "\n" + rest)
    return verdict_exit_code(result.verdict)



class _Live:
    """The live instruction at the address and its judgement (``engine.one_instruction.LiveCheck``)."""

    def __init__(self, decoded, checked, source: str, slide: int):
        self.decoded, self.checked, self.source, self.slide = decoded, checked, source, slide


def _live(args, index, loc, file_decoded, cache_dir):
    """The instruction judged on its live bytes (``_Live``), or ``live.Unread`` when they cannot be read."""
    from ..engine.one_instruction import verify_live
    from ..kernel.live import live_instruction
    from . import live as live_cli

    function = loc.function if loc is not None else index.functions.containing(file_decoded.address)
    start = function.start if function is not None else file_decoded.address
    end = function.end if function is not None else file_decoded.address + file_decoded.length
    text = live_cli.live_text(args, index, start, end)
    if isinstance(text, live_cli.Unread):
        return text
    a = file_decoded.address
    found = live_instruction(text, a, function.start if function is not None else None)
    if found is None:
        raise InputError(f"{text.source} holds no live text at {a:#x} (running address {a + text.slide:#x}): "
                         f"capture the function's range")
    if found.boundary is False:
        raise InputError(f"{a:#x} is not an instruction boundary of the live text: walking the live bytes from "
                         f"{function.name} ({function.start:#x}) passes over it, so the kernel refuses a probe "
                         f"there (can_probe); the file has {file_decoded.raw.hex(' ')} there")
    decoded = one_instruction(found.raw, a)
    checked = verify_live(decoded, file_decoded.raw, args.tramp, args.timeout, cache_dir, index.image, index.sites)
    return _Live(decoded, checked, text.source, text.slide)


def _live_lines(live) -> list[str]:
    from . import live as live_cli

    if live is None:
        return []
    if isinstance(live, live_cli.Unread):
        return [f"live: not read ({live.reason}): this is the file's verdict, over every variant the model "
                f"allows, not the live bytes'"]
    c = live.checked
    same = "the file's too" if c.live_raw == c.file_raw else f"the file has {c.file_raw.hex(' ')}"
    lines = [f"live: judged on the bytes that run, from {live.source} (KASLR slide {live.slide:#x}); {same}"]
    lines += [f"site {s.describe(c.live_raw, c.file_raw)}" for s in c.sites]
    return lines


def _live_json(live) -> dict:
    from . import live as live_cli

    if isinstance(live, live_cli.Unread):
        return {"read": False, "reason": live.reason, "judged": "file"}
    c = live.checked
    return {"read": True, "source": live.source, "slide": hex(live.slide), "judged": "live",
            "live_bytes": c.live_raw.hex(), "file_bytes": c.file_raw.hex(), "differs": c.live_raw != c.file_raw,
            "sites": [s.as_json() for s in c.sites]}

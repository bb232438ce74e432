"""``relocverify check``: decode, plan and prove one instruction."""

from __future__ import annotations

import json
from typing import TextIO

from ..errors import InputError
from ..inputs import parse_hex_bytes
from ..x86.decode import decode
from ..x86.instruction import Disagreement, Instruction, Undecodable
from .render import disasm, escape

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


def command(args, out: TextIO) -> int:
    raw = parse_hex_bytes(args.hex)
    decoded = one_instruction(raw, args.at)  # bad input is refused before the checker (angr, z3) is imported

    from ..plan.plan import make_plan
    from ..proof.prove import prove_plan
    from ..proof.verdict import verdict_exit_code

    plan = make_plan(decoded, args.tramp)
    result = prove_plan(decoded, plan, timeout_ms=int(args.timeout * 1000))
    site_doc = None
    if args.image:
        result, site_doc = _with_sites(args, decoded, plan, result)
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
            out.write("\n".join(disasm(plan.trampoline, plan.tramp)) + "\n")
        for e in plan.effects:
            out.write(f"  effect: {e.describe()}\n")
        for site in site_doc or ():
            out.write(f"site: {site['kind']} at {site['address']} ({site['consequence']}): "
                      f"{escape(site['reason'])}\n")
        out.write(result.render())
    return verdict_exit_code(result.verdict)


def _with_sites(args, decoded, plan, result):
    """The verdict at --at in the kernel image: its sites, and every variant that can run there."""
    from ..engine.pipeline import Prover
    from ..image.loader import load_image
    from ..kernel.site_verdicts import site_finding
    from ..kernel.sites import POLICY_BY_KIND, find_sites
    from ..kernel.variants import VariantFinder
    from ..proof.verdict import Finding, ProofResult

    image = load_image(args.image, args.system_map)
    if not image.is_executable(decoded.address):
        raise InputError(f"--at {decoded.address:#x} is not in an executable section of {args.image}")
    if image.read(decoded.address, decoded.length) != decoded.raw:
        raise InputError(f"HEX is not the bytes of {args.image} at {decoded.address:#x}")
    found = tuple(find_sites(image).sites_at(decoded.address, decoded.length))
    finding = Finding(result.verdict, result.reason, result.method, plan.kind.value, plan.rule, "")
    prover = Prover(plan.tramp, args.timeout)
    new, _ = site_finding(finding, found, decoded.address, decoded.raw, VariantFinder(image),
                          lambda other: prover.verify(other, decoded.address).finding)
    doc = [{"kind": s.kind, "address": hex(s.address), "length": s.length,
            "consequence": POLICY_BY_KIND[s.kind].consequence if s.kind in POLICY_BY_KIND else "mark",
            "reason": POLICY_BY_KIND[s.kind].reason if s.kind in POLICY_BY_KIND else ""} for s in found]
    if new.verdict != result.verdict or new.reason != result.reason:
        result = ProofResult(new.verdict, new.reason, new.method)
    return result, doc

"""Benchmark: the trust base against the CPU.  unicorn (and VEX) vs this machine, one kernel's instruction shapes.

    python benchmarks/bench_trust_base.py [--kernel NAME] [--states N] [--limit N] [--jobs N] [--vex]

Walks every function of the kernel (default debian-6.1-cloud), groups its
instructions into shapes (bytes with displacement and immediates zeroed),
and for each shape that ``concrete.native.refusal`` lets run: draws N
states (``sample_states``, MXCSR fixed at 0x1f80 since unicorn does not
take MXCSR from a state), runs the shape's first instance natively and on
unicorn (``machine.run_original`` at the same address), and compares
GPRs, the RFLAGS bits unicorn compares, xmm0-15, changed memory bytes and
faults.  A flag that differs is counted apart when iced says the
instruction leaves it undefined (the SDM allows any value there).

With ``--vex`` the VEX semantics (``proof.semantics``) is also evaluated
on each state with claripy and compared with the CPU the same way.

Prints: shapes total, shapes run, refused by reason, and disagreements
by class (opname) and by what differs, with one example per class
(encoding, differing values, and the input state's relevant registers).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import time
from multiprocessing import Pool

import iced_x86 as iced

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from relocverify.concrete import native  # noqa: E402
from relocverify.concrete.machine import VECTORS, run_original  # noqa: E402
from relocverify.concrete.outcome import AF, CF, DF, OF, PF, SF, ZF  # noqa: E402
from relocverify.x86.decode import decode  # noqa: E402
from relocverify.x86.instruction import Instruction  # noqa: E402

FLAGS = {"CF": CF, "PF": PF, "AF": AF, "ZF": ZF, "SF": SF, "OF": OF, "DF": DF}
ICED_FLAGS = {"CF": iced.RflagsBits.CF, "PF": iced.RflagsBits.PF, "AF": iced.RflagsBits.AF,
              "ZF": iced.RflagsBits.ZF, "SF": iced.RflagsBits.SF, "OF": iced.RflagsBits.OF,
              "DF": iced.RflagsBits.DF}
COMPARED_REGISTERS = native.GPR64 + tuple(f"xmm{i}" for i in range(16))


def shape_of(raw: bytes, ins: iced.Instruction, co: iced.ConstantOffsets) -> bytes:
    b = bytearray(raw)
    for off, size in ((co.displacement_offset, co.displacement_size), (co.immediate_offset, co.immediate_size),
                      (co.immediate_offset2, co.immediate_size2)):
        b[off:off + size] = bytes(size)
    return bytes(b)


def collect_shapes(kernel: str) -> tuple[dict[bytes, bytes], int]:
    """shape -> the raw bytes of its first instance, and the number of instructions walked."""
    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions, iter_instruction_spans
    from relocverify.image.loader import load_image

    image = load_image(fetch(kernel).vmlinux)
    shapes: dict[bytes, bytes] = {}
    decoder = iced.Decoder(64, b"")
    count = 0
    for function in find_functions(image):
        for address, raw in iter_instruction_spans(image, function):
            count += 1
            decoder = iced.Decoder(64, raw, ip=address)
            ins = decoder.decode()
            if ins.is_invalid:
                continue
            shapes.setdefault(shape_of(raw, ins, decoder.get_constant_offsets(ins)), raw)
    return shapes, count


def fault_class(fault: str | None) -> str | None:
    """A fault as a class both oracles name alike: None, or the vector names it stands for."""
    if fault is None:
        return None
    if fault == "invalid instruction":  # unicorn's UC_ERR_INSN_INVALID
        return "#UD"
    if fault.startswith("signal "):
        return "/".join(native.FAULT_VECTORS.get(fault.split()[1], (fault,)))
    for name in VECTORS.values():
        if name in fault:
            return next((f"/".join(v) for v in native.FAULT_VECTORS.values() if name in v), name)
    return fault


def differences(cpu, other, state, undefined: int) -> list[str]:
    """What differs between the CPU's outcome and another oracle's, as short labels."""
    if cpu.fault or other.fault:
        a, b = fault_class(cpu.fault), fault_class(other.fault)
        return [] if a == b else [f"fault (cpu {cpu.fault}, other {other.fault})"]
    diffs = [r for r in COMPARED_REGISTERS if cpu.registers.get(r) != other.registers.get(r)]
    for name, bit in FLAGS.items():
        if (cpu.registers["rflags"] ^ other.registers["rflags"]) & bit:
            diffs.append(f"flag {name}" + (" (undefined)" if undefined & ICED_FLAGS[name] else ""))
    if cpu.writes != native.changed_writes(other, state):
        diffs.append("memory")
    if cpu.next_rip != other.next_rip:
        diffs.append("next_rip")
    return diffs


def check_shape(args: tuple[bytes, int, int, bool]) -> dict:
    raw, nstates, seed, vex = args
    d = decode(raw, native.NATIVE_AT)
    if not isinstance(d, Instruction):
        return {"refused": "decode: " + type(d).__name__}
    reason = native.refusal(d)
    if reason is not None:
        return {"refused": reason.split(":", 1)[0]}
    states = native.sample_states(d, random.Random(seed), nstates, vary_mxcsr=False)
    if not states:
        return {"refused": "no state places every access in the arena"}
    undefined = native._iced(d.raw).rflags_undefined
    result = {"opname": d.opname, "raw": raw.hex(), "unicorn": [], "vex": [], "states": len(states)}
    for state, cpu in zip(states, native.run_native(d.raw, states)):
        try:
            uni = run_original(d.raw, native.NATIVE_AT, state)
        except Exception as e:  # noqa: BLE001 - a crash of the replay is a finding too
            result["unicorn"].append((["unicorn crashed: " + type(e).__name__], _example(d, state, cpu, None)))
            continue
        diffs = differences(cpu, uni, state, undefined)
        if diffs:
            result["unicorn"].append((diffs, _example(d, state, cpu, uni, diffs)))
        if vex:
            vdiffs, vout = vex_differences(d, state, cpu, undefined)
            if vdiffs:
                result["vex"].append((vdiffs, _example(d, state, cpu, vout, vdiffs)))
    return result


def _example(d, state, cpu, other, diffs=()) -> str:
    regs = [r.split()[0] for r in diffs if r in COMPARED_REGISTERS]
    shown = sorted(set(regs) | set(d.regs_read) & set(COMPARED_REGISTERS))
    ins = " ".join(f"{r}={state.registers.get(r, 0):#x}" for r in shown)
    ins += f" rflags={state.registers['rflags']:#x}"
    outs = ""
    if other is not None:
        outs = "; " + " ".join(f"{r}: cpu {cpu.registers.get(r, 0):#x} other {other.registers.get(r, 0):#x}"
                               for r in regs + ["rflags"])
    return f"{d.raw.hex()} ({d.mnemonic} {d.op_str}) inputs {ins}{outs}"


# --- VEX, evaluated concretely -------------------------------------------------------


def vex_differences(d, state, cpu, undefined) -> tuple[list[str], object]:
    try:
        out = vex_outcome(d, state)
    except Exception as e:  # noqa: BLE001 - a gap of the semantics is counted, not fatal
        return [f"vex: {type(e).__name__}"], None
    if out is None:
        return ["vex: no single outcome"], None
    return differences(cpu, out, state, undefined), out


def vex_outcome(d, state):
    from relocverify.bench_vex import concrete_outcome  # pragma: no cover - optional
    return concrete_outcome(d, state)


# --- the report ---------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="debian-6.1-cloud")
    ap.add_argument("--states", type=int, default=4)
    ap.add_argument("--limit", type=int, default=0, help="check only the first N shapes (0: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--vex", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    shapes, count = collect_shapes(args.kernel)
    print(f"instructions walked: {count}  distinct shapes: {len(shapes)}  ({time.perf_counter() - t0:.0f} s)")
    todo = list(shapes.values())[:args.limit or None]
    work = [(raw, args.states, i, args.vex) for i, raw in enumerate(todo)]
    refused: collections.Counter = collections.Counter()
    by_class = {"unicorn": collections.Counter(), "vex": collections.Counter()}
    by_what = {"unicorn": collections.Counter(), "vex": collections.Counter()}
    examples: dict[tuple[str, str], str] = {}
    run = states = 0
    with Pool(args.jobs) as pool:
        for result in pool.imap_unordered(check_shape, work, chunksize=16):
            if "refused" in result:
                refused[result["refused"]] += 1
                continue
            run += 1
            states += result["states"]
            for oracle in ("unicorn", "vex"):
                seen = set()
                for diffs, example in result[oracle]:
                    for what in diffs:
                        key = (result["opname"], what)
                        if key not in seen:
                            seen.add(key)
                            by_class[oracle][key] += 1
                            by_what[oracle][what.split(" (cpu")[0]] += 1
                        examples.setdefault((oracle,) + key, example)
    elapsed = time.perf_counter() - t0
    print(f"shapes total: {len(todo)}  shapes run: {run}  states run: {states}  ({elapsed:.0f} s)")
    print("refused by reason:")
    for reason, n in refused.most_common():
        print(f"  {n:7d}  {reason}")
    for oracle in ("unicorn",) + (("vex",) if args.vex else ()):
        agree = run - len({op for (op, _w) in by_class[oracle]})
        print(f"\n{oracle} vs cpu: shapes with a disagreement by what differs (shape counted once per label):")
        for what, n in by_what[oracle].most_common():
            print(f"  {n:7d}  {what}")
        print(f"{oracle} vs cpu: disagreements by class (opname, what), with an example:")
        for (op, what), n in sorted(by_class[oracle].items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {n:5d}  {op:12s} {what}")
            print(f"         e.g. {examples[(oracle, op, what)]}")
        print(f"({oracle}: opnames with no disagreement among those run, lower bound: {max(agree, 0)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

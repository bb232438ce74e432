"""Benchmark: the trust base against the CPU.  unicorn (and VEX) vs this machine, one kernel's instruction shapes.

    python benchmarks/bench_trust_base.py [--kernel NAME] [--states N] [--limit N] [--jobs N] [--vex]

Walks every function of the kernel (default debian-6.1-cloud), groups its
instructions into shapes (bytes with displacement and immediates zeroed),
and for each shape that ``concrete.native.refusal`` lets run: draws N
states (``sample_states``; MXCSR random when ``machine`` takes MXCSR from
a state, else fixed at 0x1f80), runs the shape's first instance natively and on
unicorn (``machine.run_original`` at the same address), and compares
GPRs, the RFLAGS bits unicorn compares, xmm0-15, MXCSR (if unicorn
reports it), changed memory bytes and faults.  A flag that differs is counted apart when iced says the
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
from relocverify.concrete.outcome import AF, CF, DF, OF, PF, REGISTER_BITS, SF, ZF  # noqa: E402
from relocverify.x86.decode import decode  # noqa: E402
from relocverify.x86.instruction import Instruction  # noqa: E402

FLAGS = {"CF": CF, "PF": PF, "AF": AF, "ZF": ZF, "SF": SF, "OF": OF, "DF": DF}
ICED_FLAGS = {"CF": iced.RflagsBits.CF, "PF": iced.RflagsBits.PF, "AF": iced.RflagsBits.AF,
              "ZF": iced.RflagsBits.ZF, "SF": iced.RflagsBits.SF, "OF": iced.RflagsBits.OF,
              "DF": iced.RflagsBits.DF}
UNICORN_TAKES_MXCSR = "mxcsr" in REGISTER_BITS  # then unicorn runs with the state's MXCSR, and it is compared
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
            return next(("/".join(v) for v in native.FAULT_VECTORS.values() if name in v), name)
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
    if "mxcsr" in other.registers:  # unicorn, once it models MXCSR; VEX does not
        changed = cpu.registers["mxcsr"] ^ other.registers["mxcsr"]
        if changed & 0x3F:
            diffs.append("mxcsr status flags")
        if changed & ~0x3F:
            diffs.append("mxcsr control")
    if cpu.writes != native.changed_writes(other, state):
        diffs.append("memory")
    if cpu.next_rip != other.next_rip:
        diffs.append("next_rip")
    return diffs


def check_shape(args: tuple[bytes, int, int, bool, bool]) -> dict:
    raw, nstates, seed, vex, vex_mxcsr = args
    d = decode(raw, native.NATIVE_AT)
    if not isinstance(d, Instruction):
        return {"refused": "decode: " + type(d).__name__}
    reason = native.refusal(d)
    if reason is not None:
        return {"refused": reason.split(":", 1)[0]}
    states = native.sample_states(d, random.Random(seed), nstates, vary_mxcsr=UNICORN_TAKES_MXCSR)
    if not states:
        return {"refused": "no state places every access in the arena"}
    undefined = native._iced(d.raw).rflags_undefined
    result = {"opname": d.opname, "raw": raw.hex(), "unicorn": [], "vex": [], "states": len(states)}
    for state, cpu in zip(states, native.run_native(d.raw, states)):
        try:
            uni = run_original(d.raw, native.native_address(d.raw), state)
        except Exception as e:  # noqa: BLE001 - a crash of the replay is a finding too
            result["unicorn"].append((["unicorn crashed: " + type(e).__name__], _example(d, state, cpu, None)))
            continue
        diffs = differences(cpu, uni, state, undefined)
        if diffs:
            result["unicorn"].append((diffs, _example(d, state, cpu, uni, diffs)))
    if vex:
        result["vex_run"] = True
        vstates = native.sample_states(d, random.Random(seed), 2, vary_mxcsr=vex_mxcsr)
        for state, cpu in zip(vstates, native.run_native(d.raw, vstates)):
            vdiffs, vout = vex_differences(d, state, cpu, undefined)
            if vdiffs:
                result["vex"].append((vdiffs, _example(d, state, cpu, vout, vdiffs)))
    return result


def _example(d, state, cpu, other, diffs=()) -> str:
    regs = [r.split()[0] for r in diffs if r in COMPARED_REGISTERS]
    shown = sorted(set(regs) | set(d.regs_read) & set(COMPARED_REGISTERS))
    ins = " ".join(f"{r}={state.registers.get(r, 0):#x}" for r in shown)
    ins += f" rflags={state.registers['rflags']:#x}"
    if state.registers.get('mxcsr', native.MXCSR_DEFAULT) != native.MXCSR_DEFAULT:
        ins += f" mxcsr={state.registers['mxcsr']:#x}"
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
        return [f"vex: {getattr(e, 'reason', type(e).__name__)[:60]}"], None
    if out is None:
        return ["vex: no single outcome"], None
    return differences(cpu, out, state, undefined), out


def vex_outcome(d, state):
    """``vex_step`` repeated while a rep string instruction jumps back to itself (at most 64 iterations)."""
    from relocverify.concrete.machine import is_rep_string
    from relocverify.concrete.outcome import MachineState, Outcome

    out, writes = vex_step(d, state), {}
    for _ in range(64):
        if out is None or out.fault or out.next_rip != native.native_address(d.raw) or not is_rep_string(d.raw):
            break
        writes.update(out.writes)
        memory = {**state.memory, **out.writes}
        state = MachineState({**state.registers, **out.registers}, memory)
        out = vex_step(d, state)
    if out is None:
        return None
    return Outcome(out.registers, out.next_rip, {**writes, **out.writes}, out.fault)


def vex_step(d, state):
    """The VEX semantics of ``d`` evaluated on ``state``: a concrete ``Outcome``, or None if no path is taken.

    Symbolic execution (``proof.semantics.execute_original``), then a
    claripy solver with every input symbol pinned to the state: GPRs,
    ymmN = xmmN (upper half 0), rflags, DF, AC = ID = 0, sseround from
    MXCSR, and each initial memory byte to the state's byte at the address
    it evaluates to.  Other guest registers are left free (a difference
    that depends on them shows as one).
    """
    import claripy

    from relocverify.concrete.outcome import Outcome, initial_registers
    from relocverify.proof import semantics as S
    from relocverify.proof.smt import rflags_of

    at = native.native_address(d.raw)
    world = S.World()
    outs = S.execute_original(world, d.raw, at)
    exprs = []
    for o in outs:
        regs = {r: S.register_value(world, o.regs, r, at) for r in native.GPR64}
        regs.update({f"xmm{i}": S.register_value(world, o.regs, f"ymm{i}", at)[127:0] for i in range(16)})
        exprs.append((o, regs, rflags_of(world, o, at), S.register_value(world, o.regs, "d", at)))
    inputs = initial_registers(state)
    mxcsr = state.registers.get("mxcsr", native.MXCSR_DEFAULT)
    solver = claripy.Solver()
    for name, sym in list(world.reg_syms.items()):
        if name in native.GPR64:
            solver.add(sym == inputs[name])
        elif name.startswith("ymm") and int(name[3:]) < 16:
            solver.add(sym == inputs[f"xmm{name[3:]}"])
        elif name == "sseround":
            solver.add(sym == (mxcsr >> 13) & 3)
    solver.add(world.rflags == inputs["rflags"])
    solver.add(world.df == (inputs["rflags"] >> 10) & 1)
    solver.add(world.ac == 0)
    solver.add(world.idf == 0)
    for addr, byte in list(world.mem_syms.values()):
        a = solver.eval(addr, 1)[0]
        solver.add(byte == state.memory.get(a, 0))
    for c in world.constraints():
        solver.add(c)
    for o, regs, flags, df in exprs:
        if not solver.satisfiable(extra_constraints=[o.guard]):
            continue
        solver.add(o.guard)
        value = {name: solver.eval(e, 1)[0] for name, e in regs.items()}
        value["rflags"] = solver.eval(flags, 1)[0] | 2 | (0x400 if solver.eval(df, 1)[0] == native.MASK64 else 0)
        writes = {}
        for waddr, wbyte in o.writes:
            writes[solver.eval(waddr, 1)[0]] = solver.eval(wbyte, 1)[0]
        fault = None if o.jumpkind in S.NORMAL_JUMPKINDS else o.jumpkind
        return Outcome(value, solver.eval(o.target, 1)[0], writes, fault)
    return None


# --- the report ---------------------------------------------------------------------


def main() -> int:
    import logging
    logging.getLogger("angr").setLevel(logging.ERROR)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="debian-6.1-cloud")
    ap.add_argument("--states", type=int, default=4)
    ap.add_argument("--limit", type=int, default=0, help="check only the first N shapes (0: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--vex", type=int, default=0, metavar="N",
                    help="also evaluate VEX on N shapes spread over those run (2 states each; about 0.3 s a state)")
    ap.add_argument("--vex-mxcsr", action="store_true",
                    help="VEX column: random MXCSR rounding modes (unicorn ignores MXCSR; VEX models RC)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    shapes, count = collect_shapes(args.kernel)
    print(f"instructions walked: {count}  distinct shapes: {len(shapes)}  ({time.perf_counter() - t0:.0f} s)")
    todo = list(shapes.values())[:args.limit or None]
    every = max(len(todo) // args.vex, 1) if args.vex else 0
    work = [(raw, args.states, i, bool(every) and i % every == 0, args.vex_mxcsr) for i, raw in enumerate(todo)]
    random.Random(0).shuffle(work)  # an interrupted run (Ctrl-C) has checked a uniform sample of the shapes
    refused: collections.Counter = collections.Counter()
    by_class = {"unicorn": collections.Counter(), "vex": collections.Counter()}
    by_what = {"unicorn": collections.Counter(), "vex": collections.Counter()}
    examples: dict[tuple[str, str], str] = {}
    run = states = vex_run = done = 0
    interrupted = False
    pool = Pool(args.jobs)
    try:
        for result in pool.imap_unordered(check_shape, work, chunksize=8):
            done += 1
            if done % 1000 == 0:
                print(f"  ... {done} shapes ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            if "refused" in result:
                refused[result["refused"]] += 1
                continue
            run += 1
            states += result["states"]
            vex_run += bool(result.get("vex_run"))
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
    except KeyboardInterrupt:
        interrupted = True
    finally:
        pool.terminate()
    elapsed = time.perf_counter() - t0
    if interrupted:
        print(f"INTERRUPTED: the figures below cover {done} of {len(todo)} shapes, a uniform sample")
    print(f"shapes total: {len(todo)}  shapes checked: {done}  shapes run: {run}  states run: {states}  "
          f"({elapsed:.0f} s)")
    print("refused by reason:")
    for reason, n in refused.most_common():
        print(f"  {n:7d}  {reason}")
    if args.vex:
        print(f"vex: {vex_run} shapes evaluated (2 states each, MXCSR {'random' if args.vex_mxcsr else '0x1f80'})")
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

"""The thin command line.  Every command returns one of the fixed exit codes.

  0  clean: a relocatable plan that is proved (``check``), a proof (``prove``), no findings
  1  findings: a rejected plan, a refuted relocation, corpus entries that missed their expectation
  2  usage or input error (bad hex, bad address, unreadable image, a store altered since relocverify sealed
     it), or an environment that refuses the work (a full or read-only disk, a fork refused): one line on stderr
  3  unknown: no proof and no refutation (``unknown`` or ``opaque`` verdicts); for ``vmlinux``,
     a run that did not complete
  4  internal error: a bug in relocverify or a library; one line, and ``--debug`` shows the traceback

``vmlinux`` exits 1 when any instruction has a verdict named by ``--fail-on``
(default ``refuted``).  ``RelocverifyError``, argparse errors and unexpected
exceptions are converted here and nowhere else: no traceback reaches a user
unless ``--debug`` asks for it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
from typing import Sequence, TextIO

from ..errors import InputError, RelocverifyError
from ..inputs import parse_address
from ..plan.plan import DEFAULT_AT, DEFAULT_TRAMP
from ..store.sqlite_errors import DatabaseError, environment_line
from . import arguments as A

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNKNOWN, EXIT_INTERNAL = 0, 1, 2, 3, 4



class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise InputError(f"{message} (see: {self.prog} --help)")


def _typed(fn):
    """An argument type from a checker that raises InputError: argparse names the option."""
    def check(text: str):
        try:
            return fn(text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    check.__name__ = fn.__name__
    return check


SECONDS, COUNT = _typed(A.seconds), _typed(A.count)
LOCATION = _typed(A.location)
CODE, TRAMP, RANGE = _typed(A.code_address), _typed(A.trampoline_address), _typed(A.memory_range)
ADDRESS, IN_FILE, OUT_FILE, VERDICTS = _typed(parse_address), _typed(A.input_file), _typed(A.output_file), _typed(A.verdicts)
#: The argument types, for commands that add their own subparser (``add_parser(sub, TYPES)``).
TYPES = {"SECONDS": SECONDS, "COUNT": COUNT, "CODE": CODE, "TRAMP": TRAMP, "RANGE": RANGE, "ADDRESS": ADDRESS,
         "IN_FILE": IN_FILE, "OUT_FILE": OUT_FILE, "VERDICTS": VERDICTS, "SCHEDULER": _typed(A.scheduler_address),
         "IN_PATH": _typed(A.file_or_directory), "LOCATION": LOCATION, "TRIALS": _typed(A.trials),
         "JOBS": _typed(A.jobs)}


def cmd_check(args, out: TextIO) -> int:
    from . import check

    return check.command(args, out)


def cmd_prove(args, out: TextIO) -> int:
    from . import prove

    return prove.command(args, out)


def cmd_replay(args, out: TextIO) -> int:
    from . import replay

    return replay.command(args, out)


def cmd_policy(args, out: TextIO) -> int:
    from ..plan.policy import RULES

    if args.json:
        json.dump([{"rule": r.name, "strategy": r.strategy, "reason": r.reason} for r in RULES], out, indent=2)
        out.write("\n")
        return EXIT_CLEAN
    for r in RULES:
        out.write(f"{r.name:<22} {r.strategy:<15} {r.reason}\n")
    return EXIT_CLEAN


def cmd_corpus(args, out: TextIO) -> int:
    from . import corpus

    return corpus.command(args, out)


def cmd_package(args, out: TextIO) -> int:
    from . import package

    return package.command(args, out)


def cmd_module(args, out: TextIO) -> int:
    from . import module

    return module.command(args, out)


def cmd_elf(args, out: TextIO) -> int:
    from . import elf

    return elf.command(args, out)


def cmd_vmlinux(args, out: TextIO) -> int:
    from . import vmlinux

    return vmlinux.command(args, out)


def _versions() -> str:
    from ..engine.native_rows import JUMP_STATUS as JUMPS
    from ..engine.native_rows import KEY_STATUS as KEYS
    from ..engine.native_rows import STATUS as ROWS
    from ..proof.native_walk import STATUS as WALK
    from ..store.native_tally import STATUS as TALLY
    from ..versions import tool_versions

    v = tool_versions()
    return (f"relocverify {v['relocverify']} (capstone {v['capstone']}, iced-x86 {v['iced']}, pyvex {v['pyvex']}, "
            f"angr {v['angr']}, claripy {v['claripy']}, z3 {v['z3']}, unicorn {v['unicorn']}; IR walk: {WALK}; "
            f"packed rows: {ROWS}; jump-probe walk: {JUMPS}; key walk: {KEYS}; packed counts' tally: {TALLY})")


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, help="print the versions of relocverify, its decoders, "
                         "VEX, z3 and unicorn, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        raise _VersionAsked()


class _VersionAsked(Exception):
    """--version: ``main`` prints the versions on its own output stream."""


#: Per command: the arguments naming files it reads, files it writes, and directories it writes; checked
#: against each other by ``outputs.check_paths`` before the command runs (an output never overwrites an input).
IO = {
    "check": (("image", "system_map", "live_text", "kallsyms"), (), ()),
    "vmlinux": (("path", "system_map"), ("db", "summary_json"), ()),
    "elf": (("paths",), ("db", "summary_json"), ()),
    "module": (("modules", "kernel", "system_map"), ("db", "summary_json"), ()),
    "package": (("name",), ("db", "summary_json"), ()),
    "run": (("image", "system_map", "db"), (), ()),
    "report": (("db", "baseline"), (), ("output",)),
    "gate": (("image", "corpus", "module"), ("junit", "sarif"), ()),
    "corpus": (("paths",), (), ()),
    "selftest": (("elf",), ("output",), ()),
    "show": (("source", "system_map"), (), ()),
    "export": (("store",), ("output",), ()),
    "audit": (("image", "system_map", "module", "package", "dbg"), ("db", "summary_json"), ()),
    "confirm": (("package", "dbg", "elf", "audit", "module_trigger"), (), ()),
}


def _paths(args, names) -> list[str]:
    out = []
    for name in names:
        value = getattr(args, name, None)
        if isinstance(value, (list, tuple)):
            out += [v for v in value if isinstance(v, str)]
        elif isinstance(value, str) and (os.sep in value or os.path.exists(value)):
            out.append(value)
    return out


def check_io(args) -> None:
    """Refuse, before any work, an output that is an input (``outputs.check_paths``)."""
    from ..outputs import check_paths

    spec = IO.get(args.command)
    if spec is None:
        return
    reads, writes, dirs = spec
    ins, outs = _paths(args, reads), _paths(args, writes)
    if args.command == "gate" and getattr(args, "baseline", None):
        (outs if args.update_baseline else ins).append(args.baseline)
    check_paths(ins, outs, _paths(args, dirs))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="relocverify",
                description="relocverify: a formally checked x86-64 instruction relocation verifier. Exit codes: "
                            "0 clean, 1 findings, 2 usage or input error, 3 unknown or incomplete, 4 internal error.")
    p.add_argument("--version", action=_Version)
    p.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    c = sub.add_parser("check", help="decode, plan and prove one instruction (its bytes, or its address in --image)")
    c.add_argument("hex", metavar="HEX|ADDRESS", nargs="+",
                   help="the instruction's bytes in hex, quoted or not (f0 ff 05 10 00 00 00); with --image and no "
                        "--at, its ADDRESS instead: tcp_v4_rcv+0x19, tcp_v4_rcv+25, kprobe:tcp_v4_rcv+25, "
                        "NAME@0xADDR+OFF or 0xADDR")
    c.add_argument("--at", type=LOCATION, default=None, metavar="ADDR",
                   help=f"the instruction's address A (default {DEFAULT_AT:#x}); a FUNCTION+OFF needs --image")
    c.add_argument("--tramp", type=TRAMP, default=DEFAULT_TRAMP, metavar="ADDR",
                   help=f"the trampoline's address T (default {DEFAULT_TRAMP:#x}, module space)")
    c.add_argument("--json", action="store_true", help="print the decode, plan and verdict as JSON")
    c.add_argument("--timeout", type=SECONDS, default=10.0, metavar="S", help="solver timeout in seconds (default 10)")
    c.add_argument("--image", default=None, metavar="VMLINUX", type=IN_FILE,
                   help="the kernel the instruction is in: read its bytes there, check its sites and variants "
                        "(the image's index is cached on disk: the next question is quick)")
    c.add_argument("--system-map", default=None, metavar="FILE", type=IN_FILE,
                   help="System.map or kallsyms for --image")
    c.add_argument("--no-cache", action="store_true", help="neither read nor write the persistent proof cache")
    from . import live as live_options

    live_options.add_options(c, TYPES)
    c.set_defaults(func=cmd_check)

    pr = sub.add_parser("prove", help="check a relocation made by another tool")
    pr.add_argument("--orig", required=True, metavar="HEX", help="the original instruction's bytes")
    pr.add_argument("--at", type=LOCATION, required=True, metavar="A",
                    help="the original's address (0xADDR, or FUNCTION+OFF with --image)")
    pr.add_argument("--image", default=None, metavar="VMLINUX", type=IN_FILE, help="resolves a symbolic --at")
    pr.add_argument("--system-map", default=None, metavar="FILE", type=IN_FILE, help="System.map for --image")
    pr.add_argument("--reloc", required=True, metavar="HEX", help="the relocated code, as placed at T")
    pr.add_argument("--tramp", type=TRAMP, required=True, metavar="T", help="where the relocated code runs")
    pr.add_argument("--json", action="store_true", help="print the verdict and counterexample as JSON")
    pr.add_argument("--timeout", type=SECONDS, default=10.0, metavar="S", help="solver timeout in seconds (default 10)")
    pr.add_argument("--tracer-memory", type=RANGE, action="append", metavar="ADDR:SIZE",
                    help="memory the relocating tool owns (save slots): left out of the comparison; repeatable")
    pr.set_defaults(func=cmd_prove)

    rp = sub.add_parser("replay", help="replay a counterexample concretely on unicorn")
    rp.add_argument("--orig", required=True, metavar="HEX", help="the original instruction's bytes")
    rp.add_argument("--at", type=LOCATION, required=True, metavar="A",
                    help="the original's address (0xADDR, or FUNCTION+OFF with --image)")
    rp.add_argument("--image", default=None, metavar="VMLINUX", type=IN_FILE, help="resolves a symbolic --at")
    rp.add_argument("--system-map", default=None, metavar="FILE", type=IN_FILE, help="System.map for --image")
    rp.add_argument("--reloc", metavar="HEX", default=None, help="relocated bytes at T (or give --effects)")
    rp.add_argument("--effects", metavar="JSON", default=None, help="an emulate plan's effects as JSON")
    rp.add_argument("--tramp", type=TRAMP, required=True, metavar="T", help="the trampoline's address")
    rp.add_argument("--state", required=True, metavar="JSON",
                    help='the input state: {"registers": {"rax": "0x1"}, "memory": {"0x1000": "ab"}}')
    rp.add_argument("--json", action="store_true", help="print both outcomes and their differences as JSON")
    rp.set_defaults(func=cmd_replay)

    po = sub.add_parser("policy", help="print the relocation policy table")
    po.add_argument("--json", action="store_true", help="print the table as JSON")
    po.set_defaults(func=cmd_policy)

    co = sub.add_parser("corpus", help="run the bundled corpora, or fetch a real kernel")
    co_sub = co.add_subparsers(dest="corpus_command", required=True, parser_class=_Parser, metavar="run|fetch")
    cr = co_sub.add_parser("run", help="check every entry of the corpora against its expected outcome")
    cr.add_argument("paths", nargs="*", type=IN_FILE, help="corpus TOML files (default: the bundled corpora)")
    cr.add_argument("--json", action="store_true", help="print every entry's checks as JSON")
    cf = co_sub.add_parser("fetch", help="download a named Debian kernel (apt-get download) and extract it")
    cf.add_argument("name", help="debian-6.1-cloud, debian-6.1-amd64 or debian-6.12-cloud")
    cf.add_argument("--cache", default=None, metavar="DIR",
                    help="where to keep the packages (default: $RELOCVERIFY_CACHE or ~/.cache/relocverify)")
    cf.add_argument("--json", action="store_true", help="print the extracted files' paths and sha256s as JSON")
    co.set_defaults(func=cmd_corpus)

    v = sub.add_parser("vmlinux", help="verify every instruction of a kernel image")
    v.add_argument("path", nargs="?", default=None, type=IN_FILE,
                   help="vmlinux ELF or bzImage (default: the Debian 6.1 cloud kernel, downloaded on first use)")
    v.add_argument("--system-map", default=None, metavar="FILE", type=IN_FILE,
                   help="System.map or kallsyms (needed for a stripped vmlinux or a bzImage)")
    v.add_argument("--db", default=None, metavar="FILE", type=OUT_FILE,
                   help="the result store (default: relocverify-<sha>.sqlite next to the image)")
    v.add_argument("--trampoline-base", type=TRAMP, default=DEFAULT_TRAMP, metavar="ADDR",
                   help=f"the trampoline address every plan uses (default {DEFAULT_TRAMP:#x})")
    v.add_argument("--limit", type=COUNT, default=None, metavar="N", help="verify only the first N functions")
    A.add_batch_options(v, TYPES, "also write the summary as JSON to FILE")
    A.add_jump_probes(v)
    A.add_dask(v, TYPES)
    v.set_defaults(func=cmd_vmlinux)

    from . import elf, module

    elf.add_parser(sub, TYPES)
    sub.choices["elf"].set_defaults(func=cmd_elf)
    module.add_parser(sub, TYPES)
    sub.choices["module"].set_defaults(func=cmd_module)
    from . import package

    package.add_parser(sub, TYPES)
    sub.choices["package"].set_defaults(func=cmd_package)
    from . import run as run_command

    run_command.add_parser(sub, TYPES)
    from . import export as export_command, show as show_command

    show_command.add_parser(sub, TYPES)
    export_command.add_parser(sub, TYPES)
    from . import report as report_command

    report_command.add_parser(sub)
    from . import gate as gate_command

    gate_command.add_parser(sub)
    from . import selftest as selftest_command

    selftest_command.add_parser(sub, TYPES)
    from . import audit as audit_command

    audit_command.add_parser(sub, TYPES)
    from . import confirm as confirm_command

    confirm_command.add_parser(sub, TYPES)

    return p


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    if out is None and err is None:  # the real command line: SIGTERM ends a run as Ctrl-C does
        try:
            signal.signal(signal.SIGTERM, _terminate)
        except ValueError:  # not the main thread
            pass
    if out is None and err is None:
        _usable_std_streams()
    out = out or sys.stdout
    err = err or sys.stderr
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        if not argv:
            parser.print_help(err)
            return EXIT_USAGE
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help(err)
            return EXIT_USAGE
        check_io(args)
        return _run(args, out, err)
    except _VersionAsked:
        out.write(_versions() + "\n")
        return EXIT_CLEAN
    except RelocverifyError as e:
        err.write(f"relocverify: error: {_one_line(e)}\n")
        return EXIT_USAGE
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else EXIT_CLEAN
    except KeyboardInterrupt:  # SIGINT or SIGTERM (``_terminate``): the run did not complete
        err.write("relocverify: interrupted: the run did not complete (what it stored is intact; rerun to finish)\n")
        return EXIT_UNKNOWN
    except BrokenPipeError:
        return EXIT_CLEAN
    except DatabaseError as e:  # a store or cache SQLite cannot use: damaged, full or read-only
        if debug:
            raise
        where = _store_of(argv)
        env = environment_line(e, where)
        err.write(f"relocverify: error: {_one_line(env) if env else where + ': a damaged or unusable SQLite file: ' + _one_line(e)}\n")
        return EXIT_USAGE
    except Exception as e:  # a bug: one line, unless --debug asks for the traceback
        from ..outputs import environment_error

        env = _refused_start(e) or environment_error(e, getattr(e, "filename", None) or "an output")
        if env is not None:  # a full or read-only disk is the environment's failure, not ours
            err.write(f"relocverify: error: {_one_line(env)}\n")
            return EXIT_USAGE
        if debug:
            raise
        err.write(f"relocverify: internal error: {type(e).__name__}: {_one_line(e)} "
                  f"(rerun with --debug for the traceback, and report it)\n")
        return EXIT_INTERNAL


def _run(args, out: TextIO, err: TextIO) -> int:
    """The command, its output held until it ends and then written: the exit code is the command's whatever
    becomes of stdout (a reader that closed the pipe early must not turn a finding's exit 1 into 0: issue 44).
    Output already made is written even when the command is interrupted or fails."""
    held = io.StringIO()
    try:
        code = args.func(args, held)
    finally:
        _deliver(held.getvalue(), out, err)
    return code


def _deliver(text: str, out: TextIO, err: TextIO) -> None:
    if not text:
        return
    try:
        out.write(text)
        out.flush()
    except (BrokenPipeError, ValueError, OSError):  # closed or broken: the output is lost, the exit code is not
        if out is sys.stdout:
            _drop_stdout()
        try:
            err.write("relocverify: stdout is closed: the output was not written (the exit code stands)\n")
        except (OSError, ValueError):
            pass


def _drop_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush at exit says nothing."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def _usable_std_streams() -> None:
    """A closed stdout or stderr (``2>&-``: Python then has None) becomes /dev/null: what would have gone
    there is lost, and the run and its exit code are what they would have been (issue 44)."""
    for name in ("stdout", "stderr"):
        if not _usable(getattr(sys, name)):
            setattr(sys, name, open(os.devnull, "w"))


def _usable(stream) -> bool:
    """A stream to write to: not None, not closed, and its file descriptor open (a stream with no descriptor,
    such as a test's capture, is usable)."""
    if stream is None or getattr(stream, "closed", False):
        return False
    try:
        fd = stream.fileno()
    except (AttributeError, io.UnsupportedOperation):
        return True
    except ValueError:
        return False
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _refused_start(e: BaseException) -> str | None:
    """A process or thread the system would not start (``processes.refused``: a limit on processes such as
    ``ulimit -u``/RLIMIT_NPROC or a cgroup's ``pids.max``, or no memory) as one line; None for anything else.
    The environment's failure, not ours: exit 2, like a full disk (issue 44: exit 4)."""
    from ..processes import refused

    why = refused(e)
    if why is None:
        return None
    return (f"cannot start another process or thread: the system refused it ({why}: ulimit -u, RLIMIT_NPROC or a "
            f"cgroup's pids.max); run with --jobs 1 or raise the limit")


def _store_of(argv) -> str:
    """The store or cache a command was given, to name it in an error."""
    for flag in ("--db", "--cache-dir"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            return argv[argv.index(flag) + 1]
    return "the store"


def _one_line(e: BaseException) -> str:
    from .render import escape

    text = " ".join(str(e).split()) or type(e).__name__
    return escape(text)[:400]


if __name__ == "__main__":
    sys.exit(main())

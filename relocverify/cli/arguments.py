"""Argument types for the command line: each checks its value when the
arguments are parsed, before any long work starts, and refuses a bad one
with a line that says what a good one looks like."""

from __future__ import annotations

import math
import os
import re
import stat
import sys

from .. import inputs
from ..errors import InputError

#: The longest trampoline the planner builds (plan.plan.TRAMPOLINE_MAX), plus its slot.
TRAMPOLINE_SPAN = inputs.TRAMPOLINE_SPAN


#: The longest timeout: a day.  The solver, the watchdog and the pools take deadlines as time_t and ms in
#: 32 bits; 1e300 s overflowed them (an internal error).
MAX_SECONDS = 86_400.0


def seconds(text: str) -> float:
    """A timeout: a finite number of seconds above 0, at most a day (``MAX_SECONDS``)."""
    try:
        v = float(text)
    except ValueError:
        raise InputError(f"{text!r} is not a number of seconds, e.g. 10 or 0.5") from None
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"a timeout must be a finite number of seconds above 0, not {text!r}")
    if v > MAX_SECONDS:
        raise InputError(f"a timeout of {text} s is more than a day ({MAX_SECONDS:.0f} s), the longest one")
    return v


def count(text: str) -> int:
    """A count from 1 to 2^31 (functions, jobs, trials, pairs): a larger one would run for ever."""
    return inputs.count(text)


def jobs(text: str) -> int:
    """Worker processes: from 1 to this machine's CPUs.  More only contend for the same cores, each with its
    own memory (10,000 took 21 of 24 GB and ignored SIGTERM while forking): refused with the limit."""
    n = inputs.count(text, "--jobs")
    cpus = os.cpu_count() or 1
    if n > cpus:
        raise InputError(f"--jobs {n}: this machine has {cpus} CPU{'s' if cpus > 1 else ''}; give at most {cpus} "
                         f"(more workers only contend for the same cores)")
    return n


MAX_TRIALS = 10 ** 6


def trials(text: str) -> int:
    """Random trials of a function (``run``): from 1 to a million, each one a pair of unicorn calls."""
    return inputs.count(text, "--trials", limit=MAX_TRIALS)


def code_address(text: str) -> int:
    """An address code can run at: canonical (bits 63..47 equal), with room for an
    instruction (15 bytes) before 2^64 (``inputs.code_address``)."""
    return inputs.code_address(text)


def trampoline_address(text: str) -> int:
    """A trampoline address: canonical, with room for the longest trampoline before 2^64."""
    return inputs.trampoline_address(text)


def memory_range(text: str) -> tuple[int, int]:
    """ADDR:SIZE: at least one byte, canonical from start to end (``inputs.memory_range``)."""
    return inputs.memory_range(text)


def location(text: str):
    """An address as engineers write it (``image.locations``): 0xADDR, FUNCTION+OFF, kprobe:FUNCTION+OFF ..."""
    from .locate import location as parse

    return parse(text)


def input_file(text: str) -> str:
    """A readable regular file (``inputs.input_file``: no FIFO, device, directory or socket)."""
    return inputs.input_file(text)


def output_file(text: str) -> str:
    """A file the command may write: its directory exists and is writable, and it is not a directory, a
    device, a FIFO or a socket (``outputs.check_paths`` checks it against the inputs)."""
    if os.path.isdir(text):
        raise InputError(f"{text}: is a directory; name a file to write")
    if os.path.exists(text) and not stat.S_ISREG(os.stat(text).st_mode):
        raise InputError(f"{text}: not a regular file (a device, FIFO or socket): name a file to write")
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory):
        raise InputError(f"{text}: the directory {directory} does not exist; create it first")
    if not os.access(directory, os.W_OK) or (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise InputError(f"{text}: cannot write there")
    return text


def verdicts(text: str) -> frozenset[str]:
    """VERDICT[,VERDICT...]: names from the Verdict enum."""
    from ..proof.verdict import Verdict

    names = [t.strip() for t in text.split(",") if t.strip()]
    known = [v.value for v in Verdict]
    bad = [n for n in names if n not in known]
    if not names or bad:
        raise InputError(f"--fail-on takes verdicts from {', '.join(known)}, comma-separated; not {text!r}")
    return frozenset(names)


def file_or_directory(text: str) -> str:
    """A directory, or a readable regular file."""
    return text if os.path.isdir(text) else input_file(text)


def add_batch_options(parser, types: dict, summary_help: str, fail_on: bool = True) -> None:
    """The options every batch command (vmlinux, elf, module, package, audit) shares, said once; ``fail_on``:
    whether the command's exit code follows ``--fail-on`` verdicts (audit's follows its buckets)."""
    parser.add_argument("--jobs", type=types["JOBS"], default=None, metavar="N",
                        help="worker processes, at most one per CPU (default: one per CPU)")
    parser.add_argument("--timeout", type=types["SECONDS"], default=10.0, metavar="S",
                        help="solver timeout per proof (default 10)")
    parser.add_argument("--summary-json", default=None, metavar="FILE", type=types["OUT_FILE"], help=summary_help)
    if fail_on:
        parser.add_argument("--fail-on", type=types["VERDICTS"], default=frozenset({"refuted"}),
                            metavar="VERDICT[,VERDICT...]",
                            help="exit 1 when any instruction has one of these verdicts (default: refuted)")
    parser.add_argument("--no-progress", action="store_true", help="print no progress on stderr")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="the persistent proof cache's directory (default: $RELOCVERIFY_PROOF_CACHE, else "
                             "$RELOCVERIFY_CACHE or ~/.cache/relocverify)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the persistent proof cache")


def add_jump_probes(parser) -> None:
    """--jump-probes, for every batch command (vmlinux, elf, module, package)."""
    parser.add_argument("--jump-probes", action="store_true",
                        help="also answer, per instruction, whether a jump-optimized probe can sit there (a range "
                             "safe to overwrite, a block plan, a block proof) and why not")


def run_options(args, tramp: int, limit: int | None = None, **kw):
    """The engine's ``RunOptions`` from a batch command's options (``add_batch_options``: --jobs, --timeout,
    --cache-dir, --no-cache; --jump-probes; --scheduler and --dask-local where the command has them);
    ``kw``: the other fields (``with_sites``, ``policy``)."""
    from ..schedule.local_pool import default_jobs
    from ..engine.run import RunOptions
    from ..environment import default_proof_cache_dir

    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    return RunOptions(tramp, args.jobs or default_jobs(), args.timeout, limit, cache_dir=cache_dir,
                      scheduler=getattr(args, "scheduler", None), dask_local=getattr(args, "dask_local", None),
                      jump_probes=getattr(args, "jump_probes", False), **kw)


def progress_lines(args):
    """Where a batch command's progress lines go: stderr, or nowhere (None) with --no-progress."""
    if args.no_progress:
        return None

    return lambda line: print(line, file=sys.stderr, flush=True)


def scheduler_address(text: str) -> str:
    """A Dask scheduler's address: [tcp://|tls://]HOST:PORT."""
    if not re.fullmatch(r"(?:(?:tcp|tls|ucx|inproc)://)?[\w.\-\[\]:]+:\d{1,5}", text):
        raise InputError(f"--scheduler takes a Dask scheduler's address, e.g. tcp://10.0.0.5:8786; not {text!r}")
    return text


def add_dask(parser, types: dict) -> None:
    """--scheduler and --dask-local: where a batch's tasks run instead of the local process pool."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--scheduler", type=types["SCHEDULER"], default=None, metavar="ADDRESS",
                       help="run the tasks on the Dask cluster whose scheduler is at ADDRESS (workers need "
                            "relocverify installed and the image files at the same paths)")
    group.add_argument("--dask-local", type=types["COUNT"], default=None, metavar="N",
                       help="run the tasks on a Dask LocalCluster of N worker processes")

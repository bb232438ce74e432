"""``relocverify report``: the HTML correctness report of a store, as a static directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TextIO

from ..errors import InputError, StoreError


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="write a static HTML correctness report of a store (opens from file://)")
    r.add_argument("db", metavar="DB", help="the store a `relocverify vmlinux` run wrote (its newest image)")
    r.add_argument("--baseline", metavar="DB", default=None,
                   help="an earlier store: the report also shows new rejections, lost proofs and decoder "
                        "changes since it, by function")
    r.add_argument("-o", "--output", metavar="DIR", required=True,
                   help="the directory to write (index.html, assets/, data/); created if missing")
    r.add_argument("--plan-limit", metavar="N", type=int, default=None,
                   help="recompute every instruction's plan when the image has at most N instructions "
                        "(default 20000); above, only the plans of instructions that are not proved")
    r.set_defaults(func=command)


def command(args, out: TextIO) -> int:
    from ..report.build import PLAN_LIMIT, build_report
    from .render import escape

    if not os.path.isfile(args.db):
        raise InputError(f"{args.db}: no such store")
    limit = PLAN_LIMIT if args.plan_limit is None else args.plan_limit
    if limit < 0:
        raise InputError("--plan-limit must be at least 0")
    try:
        done = _build_staged(args.output, lambda staging: build_report(args.db, staging, args.baseline, limit))
    except StoreError as exc:  # DB or --baseline is not a relocverify store: the user's input
        raise InputError(str(exc)) from None
    out.write(f"report: {escape(os.path.join(args.output, 'index.html'))}\n")
    out.write(f"{done['instructions']:,} instructions in {done['functions']:,} functions, {done['shards']:,} shards, "
              f"{done['plans']:,} plans recomputed, {done['bytes'] / 1e6:.1f} MB, {done['seconds']} s\n")
    out.write(f"rejections grouped by {escape(done['sources'])}\n")
    return 0


def _sweep_stale(directory: str, prefix: str) -> None:
    """Remove the staging directories a killed report left in ``directory`` (``<prefix><pid>-*`` of a process
    that is gone: a SIGKILL runs no ``finally``; issue 44: an 84 MB one stayed for good)."""
    from ..processes import alive

    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)



def _build_staged(output: str, build):
    """``build(staging)`` into a new directory beside ``output``, then its entries (index.html, assets/,
    data/) moved into ``output`` one rename each: a failure (a full or read-only disk) leaves ``output``
    as it was and no staging directory behind; files of the user's in ``output`` are never touched."""
    from ..outputs import environment_error

    parent = os.path.dirname(os.path.abspath(output))
    _sweep_stale(parent, ".relocverify-report-")
    _sweep_stale(output, ".relocverify-old-")
    pid = os.getpid()
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".relocverify-report-{pid}-", dir=parent)
    except OSError as exc:
        raise environment_error(exc, output) or InputError(f"{output}: cannot write: {exc.strerror}") from None
    aside = None
    try:
        done = build(staging)
        os.makedirs(output, exist_ok=True)
        aside = tempfile.mkdtemp(prefix=f".relocverify-old-{pid}-", dir=output)
        for name in sorted(os.listdir(staging), key=lambda n: n == "index.html"):  # index.html last
            target = os.path.join(output, name)
            if os.path.lexists(target):
                os.rename(target, os.path.join(aside, name))
            os.rename(os.path.join(staging, name), target)
        return done
    except OSError as exc:
        env = environment_error(exc, output)
        if env is None:
            raise
        raise env from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

"""``relocverify report``: the HTML correctness report of a store, as a static directory."""

from __future__ import annotations

import os
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
        done = build_report(args.db, args.output, args.baseline, limit)
    except StoreError as exc:  # DB or --baseline is not a relocverify store: the user's input
        raise InputError(str(exc)) from None
    out.write(f"report: {escape(done['index'])}\n")
    out.write(f"{done['instructions']:,} instructions in {done['functions']:,} functions, {done['shards']:,} shards, "
              f"{done['plans']:,} plans recomputed, {done['bytes'] / 1e6:.1f} MB, {done['seconds']} s\n")
    out.write(f"rejections grouped by {escape(done['sources'])}\n")
    return 0

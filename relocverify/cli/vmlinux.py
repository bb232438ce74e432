"""``relocverify vmlinux``: verify every instruction of a kernel image into a store (an
``engine.requests.KernelRequest``, given to ``engine.verify.verify``), and show its summary."""

from __future__ import annotations

from typing import TextIO

from ..engine.requests import DEFAULT_KERNEL  # what ``relocverify vmlinux`` verifies when given no path
from .finish import finish, next_steps
from .render import escape

__all__ = ["DEFAULT_KERNEL", "command"]


def command(args, out: TextIO) -> int:
    from ..engine.requests import KernelRequest
    from ..engine.summary import render_summary
    from ..engine.verify import verify
    from .arguments import output_file, progress_lines, run_options

    request = KernelRequest(args.path, run_options(args, args.trampoline_base, args.limit), args.db, args.system_map,
                            check_store=output_file)
    summary = verify(request, progress_lines(args))
    out.write(render_summary(summary.document, escape))
    next_steps(out, summary.store)
    return finish(out, args, summary)

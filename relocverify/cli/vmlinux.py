"""``relocverify vmlinux``: verify every instruction of a kernel image into a store
(``engine.verify.verify_vmlinux``), and show its summary."""

from __future__ import annotations

from typing import TextIO

from ..engine.verify import DEFAULT_KERNEL  # what ``relocverify vmlinux`` verifies when given no path
from .finish import finish, next_steps
from .render import escape

__all__ = ["DEFAULT_KERNEL", "command"]


def command(args, out: TextIO) -> int:
    from ..engine.summary import render_summary
    from ..engine.verify import verify_vmlinux
    from .arguments import output_file, progress_lines, run_options

    summary = verify_vmlinux(args.path, run_options(args, args.trampoline_base, args.limit), args.db,
                             args.system_map, progress_lines(args), check_store=output_file)
    out.write(render_summary(summary.document, escape))
    next_steps(out, summary.store)
    return finish(out, args, summary)

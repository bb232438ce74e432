"""The engine's C extensions (``extensions.load``): the packed-row writer (``row_pack.c``, see
``worker.Worker.function_rows``; ``Worker._walk_rows`` serves without it) and the jump-probe walk
(``jump_walk.c``, see ``jumps.JumpProver.packed``; ``JumpProver.function`` serves without it) and the key
walk (``key_walk.c``, see ``keys.KeyMaker.walk``, whose Python loop serves without it), each with the line
that says which serves."""

from __future__ import annotations

from ..extensions import load

ROW_PACK, STATUS = load(__package__, "row_pack", __file__, "one walk in Python", "the packed-row writer")
JUMP_WALK, JUMP_STATUS = load(__package__, "jump_walk", __file__, "one walk in Python", "the jump-probe walk")
KEY_WALK, KEY_STATUS = load(__package__, "key_walk", __file__, "iced-x86 at every instruction", "the key walk")

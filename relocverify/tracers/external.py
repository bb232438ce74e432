"""An unmodelled tracer behind a command (``relocverify audit --tracer-cmd CMD``).

The protocol (docs/audit.md has an example tracer).  The command reads lines on stdin:

    ADDR_HEX TRAMP_HEX BYTES_HEX

(the instruction's address A, the slot's address T, and the instruction's bytes), and writes one
line per input line, in order:

    refuse REASON          the tracer does not probe there (REASON: free text, one line)
    reloc CODE_HEX         the bytes that run from T instead of the instruction, the tracer's jump
                           back included (its fixups after a single-step written as that jump)

Process hygiene is ``x86.decoders.external.ExternalAdapter``'s (its own process group, a
deadline per answer, bounded lines, no more answers than inputs, stderr drained and its tail
kept, a stalling or flooding or dying command killed and reported as one ``InputError``).
A line that is neither form is the tracer's answer "unknown" with the reason.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil

from ..x86.decoders.external import ExternalAdapter
from ..x86.instruction import Instruction
from .model import NO_CONTEXT, Answer, Cite, Context, Refuse, Relocate, Unmodelled

BATCH = 4096
MAX_CODE = 256


def parse_answer(line: str, cite: Cite) -> Answer:
    word, _, rest = line.strip().partition(" ")
    if word == "refuse":
        return Refuse(rest.strip() or "(no reason given)", cite)
    if word == "reloc":
        try:
            code = bytes.fromhex(rest.strip())
        except ValueError:
            return Unmodelled(f"protocol: reloc bytes are not hex: {rest[:60]!r}", cite)
        if not 0 < len(code) <= MAX_CODE:
            return Unmodelled(f"protocol: reloc must be 1..{MAX_CODE} bytes, got {len(code)}", cite)
        return Relocate(code, code, "as the command answered", cite)
    return Unmodelled(f"protocol: expected 'refuse REASON' or 'reloc HEX', got {line[:60]!r}", cite)


def content_tag(command: str) -> str:
    """What a command's remembered answers are kept under: its words, and the SHA-256 of every file they name
    (the program found on PATH, a script given to an interpreter), so an edited tracer is asked again
    instead of being reported with the old one's answers (issue 44: they were kept under the command line
    alone)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    digest = hashlib.sha256(command.encode())
    for i, word in enumerate(words):
        path = (shutil.which(word) if i == 0 else None) or (word if os.path.isfile(word) else None)
        if path is None:
            continue
        try:
            with open(path, "rb") as fh:
                digest.update(hashlib.file_digest(fh, "sha256").digest())
        except OSError:
            digest.update(b"unreadable:" + path.encode())
    return f"{command}|{digest.hexdigest()[:32]}"


class ExternalTracer:
    """A tracer answered by a command, in batches (``prefetch``), each answer remembered."""

    decoder = None
    needs_boundary = False

    def __init__(self, command: str, answer_seconds: float = 10.0):
        self.command = command
        self.name = f"cmd:{command}"
        self.source = f"--tracer-cmd {command}"
        self.version_tag = content_tag(command)
        self.cite = Cite(f"--tracer-cmd {command}", "its answer")
        self._process = _Process(command, answer_seconds)
        self._answers: dict[tuple[int, int, bytes], Answer] = {}

    def site_refusal(self, context: Context) -> Refuse | None:
        return None

    def prefetch(self, items: list[tuple[int, int, bytes]]) -> None:
        """Ask the command about (A, T, bytes) items it was not asked yet, ``BATCH`` a process."""
        todo = list(dict.fromkeys(i for i in items if i not in self._answers))
        for k in range(0, len(todo), BATCH):
            chunk = todo[k:k + BATCH]
            for item, line in zip(chunk, self._process.ask(chunk)):
                self._answers[item] = parse_answer(line, self.cite)

    def answer(self, insn: Instruction, tramp: int, context: Context = NO_CONTEXT) -> Answer:
        item = (insn.address, tramp, insn.raw)
        if item not in self._answers:
            self.prefetch([item])
        return self._answers[item]


class _Process(ExternalAdapter):
    """ExternalAdapter's process handling (``exchange``), for the tracer protocol's lines."""

    option = "--tracer-cmd"

    def __init__(self, command: str, answer_seconds: float):
        super().__init__(command, "tracer", answer_seconds)

    def ask(self, items: list[tuple[int, int, bytes]]) -> list[str]:
        return self.exchange("".join(f"{a:x} {t:x} {raw.hex()}\n" for a, t, raw in items), len(items))

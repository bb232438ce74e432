"""Jump probes in a batch: for every instruction, can a jump-optimized probe sit there, and if not, why.

``relocverify vmlinux --jump-probes`` adds a phase after the rows: each
worker walks its functions again and, for every instruction at A, answers
with one bucket:

1. the patched range [A, A+L), the smallest run of whole instructions
   covering 5 bytes, must be safe to overwrite (``kernel.patch_range``:
   no branch target strictly inside it anywhere in the image, no indirect
   jump or jump table in the function, no exception-table entry, no kernel
   site).  Asked first: it needs only lengths, not a full decode;
2. the run must have a block plan (``plan.block``: no call, nothing only
   emulation can run, nothing the policy rejects);
3. the block must be proved (``proof.block.prove_block``: one obligation
   over the sequence).  A proof made by the fast path is kept under the
   block's position-independent key (``block_key``) for the rest of the
   run; other blocks are proved one by one.

``eligible`` is the bucket of a proved jump probe; every other bucket is a
refusal, keyed as ``range:<key>``, ``block:<key>`` or ``proof:<verdict>``,
with the first reason seen kept as its example.  The int3 probe's verdict
(the instruction's own row) is unaffected by any of this.
"""

from __future__ import annotations

from ..image.functions import Function
from ..kernel.patch_range import PatchRanges
from ..plan.block import JUMP_SIZE, NoBlock, plan_block
from ..proof.block import block_key, prove_block
from ..proof.verdict import Verdict
from ..x86.decode import decode

ELIGIBLE = "eligible"


class JumpProver:
    """One worker's jump-probe answers, with the block proofs it has made so far."""

    def __init__(self, ranges: PatchRanges, tramp: int, timeout_s: float, rules=None):
        self.ranges = ranges
        self.tramp = tramp
        self.timeout_ms = int(timeout_s * 1000)
        self.rules = rules
        self.proved: dict[bytes, tuple[str, str]] = {}  # block key -> (bucket, reason)
        self.proofs = 0

    def function(self, fn: Function, data: bytes, spans: list[tuple[int, int]]) -> list[tuple[int, str, str]]:
        """(offset, bucket, reason) for each instruction (offset, length) of ``fn``."""
        out = []
        memo: dict[int, object] = {}  # span index -> decoded: runs overlap, each decodes once
        for i, (off, n) in enumerate(spans):
            address = fn.start + off
            length, j = 0, i
            while length < JUMP_SIZE and j < len(spans) and spans[j][0] == off + length:
                length += spans[j][1]
                j += 1
            refusal = self.ranges.refusal(fn, address, max(length, JUMP_SIZE))
            if refusal is not None:
                out.append((off, f"range:{refusal.key}", refusal.reason))
                continue
            decoded = []
            for k in range(i, j):
                d = memo.get(k)
                if d is None:
                    o, m = spans[k]
                    d = memo[k] = decode(data[o:o + m], fn.start + o)
                decoded.append(d)
            block = plan_block(decoded, self.tramp, self.rules)
            if isinstance(block, NoBlock):
                out.append((off, f"block:{block.key}", block.reason))
                continue
            out.append((off,) + self._prove(block))
        return out

    def _prove(self, block) -> tuple[str, str]:
        key = block_key(block)
        if key is not None and key in self.proved:
            return self.proved[key]
        self.proofs += 1
        try:
            result = prove_block(block, self.timeout_ms)
        except Exception as exc:  # a bug in a library must not stop the run: this point is refused
            return "proof:error", f"internal error: {type(exc).__name__}: {str(exc)[:100]}"
        if result.verdict is Verdict.PROVED:
            answer = (ELIGIBLE, result.reason)
            if key is not None and result.method == "fast-path":
                self.proved[key] = answer
            return answer
        return f"proof:{result.verdict.value}", result.reason

"""An external decoder for ``relocverify gate --decoder-cmd``: whichever
capstone the interpreter running it has (e.g. 4.0.2 in its own venv).

capstone 5 reports field offsets (``disp_offset``, ``imm_offset``); capstone
4 does not, so under capstone 4 the answer leaves those keys out (the gate
then compares the length and the branch target only).
"""

import json
import sys

import capstone

MD = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
MD.detail = True
HAS_OFFSETS = hasattr(capstone.CsInsn, "disp_offset")


def answer(address: int, raw: bytes) -> dict:
    try:
        ins = next(MD.disasm(raw, address, 1), None)
    except capstone.CsError as e:
        return {"error": str(e)}
    if ins is None:
        return {"error": "invalid"}
    target = None
    if ins.group(capstone.CS_GRP_JUMP) or ins.group(capstone.CS_GRP_CALL):
        ops = ins.operands
        if len(ops) == 1 and ops[0].type == capstone.x86.X86_OP_IMM:
            target = ops[0].imm & 0xFFFFFFFFFFFFFFFF
    doc = {"length": ins.size, "target": target}
    if HAS_OFFSETS:
        doc.update(disp_offset=ins.disp_offset if ins.disp_size else None, disp_size=ins.disp_size,
                   imm_offset=ins.imm_offset if ins.imm_size else None, imm_size=ins.imm_size)
    return doc


def main() -> None:
    for line in sys.stdin:
        addr, _, hexbytes = line.strip().partition(" ")
        sys.stdout.write(json.dumps(answer(int(addr, 16), bytes.fromhex(hexbytes))) + "\n")


if __name__ == "__main__":
    main()

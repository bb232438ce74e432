"""An external decoder for ``relocverify gate --decoder-cmd``: iced-x86,
speaking the line protocol of relocverify.x86.decoders.external.

    python iced_decoder.py                 # correct
    python iced_decoder.py --bug lock      # the 2009 DTrace port: f0 decoded as a 1-byte instruction
    python iced_decoder.py --bug last4     # the displacement assumed to be the last 4 bytes
                                           # (wrong for cmp $imm, disp(%rip))
"""

import json
import sys

import iced_x86

BRANCHES = {iced_x86.FlowControl.UNCONDITIONAL_BRANCH, iced_x86.FlowControl.CONDITIONAL_BRANCH,
            iced_x86.FlowControl.CALL}
NEAR = {iced_x86.OpKind.NEAR_BRANCH16, iced_x86.OpKind.NEAR_BRANCH32, iced_x86.OpKind.NEAR_BRANCH64}


def answer(address: int, raw: bytes, bug: str | None) -> dict:
    if bug == "lock" and raw[:1] == b"\xf0":
        return {"length": 1, "disp_offset": None, "disp_size": 0, "imm_offset": None, "imm_size": 0,
                "target": None}
    dec = iced_x86.Decoder(64, raw, ip=address)
    ins = dec.decode()
    if ins.is_invalid or dec.last_error != 0:
        return {"error": "invalid"}
    co = dec.get_constant_offsets(ins)
    target = None
    if (ins.flow_control in BRANCHES or ins.mnemonic == iced_x86.Mnemonic.XBEGIN) and ins.op0_kind in NEAR:
        target = ins.near_branch_target
    disp_offset = co.displacement_offset if co.has_displacement else None
    if bug == "last4" and co.has_displacement and co.displacement_size == 4:
        disp_offset = ins.len - 4
    return {"length": ins.len,
            "disp_offset": disp_offset, "disp_size": co.displacement_size if co.has_displacement else 0,
            "imm_offset": co.immediate_offset if co.has_immediate else None,
            "imm_size": co.immediate_size if co.has_immediate else 0,
            "target": target}


def main() -> None:
    bug = sys.argv[sys.argv.index("--bug") + 1] if "--bug" in sys.argv else None
    for line in sys.stdin:
        addr, _, hexbytes = line.strip().partition(" ")
        sys.stdout.write(json.dumps(answer(int(addr, 16), bytes.fromhex(hexbytes), bug)) + "\n")


if __name__ == "__main__":
    main()

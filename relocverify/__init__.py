"""relocverify: a formally checked x86-64 instruction relocation verifier.

Data flow, one module per stage:

    image.py        kernel ELF / bzImage / System.map  -> Image
    functions.py    Image                               -> Function bounds
    instruction.py  decoder-neutral Instruction record  (frozen)
    decoders.py     bytes at an address                 -> Instruction | Undecodable | Disagreement
    policy.py       per-class strategy table, a reason on every row
    plan.py         (Instruction, A, T)                 -> Plan (reject | copy | rewrite | emulate)
    effects.py      the declarative emulation language of emulate plans
    proof.py        (Plan or foreign relocation)        -> Verdict + Counterexample
    replay.py       a counterexample replayed concretely on unicorn
    store.py        SQLite store of verdicts, runs and the proof cache
    batch.py        every instruction of an image       -> one verdict each
    sites.py        kernel sites the bytes do not reveal (extable, alternatives, ...)
    cli.py          the thin command line
"""

__version__ = "0.1.0"

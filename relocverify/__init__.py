"""relocverify: a formally checked x86-64 instruction relocation verifier.

The data flow is the folder tree, one subpackage per stage, each importing
only from the stages below it:

    x86/        the shared base: registers, encodings, the instruction record, decoders
    image/      ELF vmlinux / bzImage / System.map          -> Image, functions
    plan/       (Instruction, A, T)                          -> Plan (reject | copy | rewrite | emulate)
    concrete/   unicorn and the effect interpreter           -> concrete outcomes, replays
    proof/      (Plan or foreign relocation)                 -> Verdict, Counterexample
    kernel/     kernel sites the bytes do not reveal         -> site findings
    store/      SQLite results, the persistent proof cache
    engine/     every instruction of an image                -> one finding each, in the store
    corpus/     corpora with expected outcomes               -> pass / miss
    cli/        the thin command line

``errors``, ``inputs`` and ``versions`` sit at the bottom beside ``x86``.
"""

__version__ = "0.3.0"

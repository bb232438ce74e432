"""relocverify: a formally checked x86-64 instruction relocation verifier.

The data flow is the folder tree, one subpackage per stage, each importing only from the stages
below it (``tests/test_layers.py`` holds the order; README's stage table names every module):

    x86/        the shared base: registers, encodings, the instruction record, decoders
    image/      ELF vmlinux / bzImage / System.map / modules / user ELF  -> Image, functions
    plan/       (Instruction, A, T)                          -> Plan (reject | copy | rewrite | emulate)
    concrete/   unicorn, the effect interpreter, this CPU    -> concrete outcomes, replays
    proof/      (Plan or foreign relocation)                 -> Verdict, Counterexample
    kernel/     kernel sites the bytes do not reveal         -> site findings, patch ranges
    corpus/     corpora with expected outcomes               -> pass / miss
    store/      SQLite results (the writer, ``Store``; the read model, ``Results``), the proof cache
    selftest/   candidate false proofs judged by the CPU; the validated form table
    gate/       a decoder judged against a baseline, the other decoders and the plans that follow
    schedule/   pools of workers (local processes, Dask), the SMT helper, the watchdog, progress:
                runs phases of tasks and knows no verdicts (``schedule.kinds.WorkerKind``,
                ``schedule.phase.Phase``)
    engine/     every instruction of an image                -> one finding each, in the store:
                the phases (``engine/phases``: survey, proofs, rows, replacements, jump probes,
                passes added from outside) in the order of ``engine.run.PHASES``;
                ``engine.verify.verify`` is the one entry point, given a frozen request
                (``engine.requests``: vmlinux, elf, module, package, an image), returning a
                frozen ``RunSummary``
    report/     the static HTML report, ``show``, ``export`` (read the store)
    runtime/    probes placed for proved plans in a boot-patched kernel under unicorn
    tracers/    kprobes, optprobes, uprobes, kinst, fasttrap modelled and audited, each image as
                the engine hands it over (``tracers.run.audit``, given the same requests), into a
                frozen ``AuditSummary``
    confirm/    the audit's findings tried on the kernel booted under QEMU
    cli/        the thin command line

``errors``, ``text``, ``environment``, ``outputs``, ``collector``, ``extensions`` and
``processes`` are the shared base; ``inputs`` and ``versions`` sit beside ``x86``.
"""

__version__ = "0.3.0"

"""The engine's phases, each a ``schedule.phase.Phase`` that ``schedule.phase.drive`` runs on the run's pool,
in the order ``engine.run.PHASES`` lists them:

    survey        Survey: every instruction's instance key; the keys the proof cache lacks
    proofs        Proofs: each such key's representative proved once, on whichever worker is free
    rows          Rows: every function's rows, each instruction with its key's finding, merged in rounds
    replacements  Replacements: every alternative's replacement verified at its live address
    pass_rows     PassRows: a pass added from outside (``engine.passes.FunctionPass``), function by function
    stored_rows   StoredRows: a pass over the stored rows (``engine.passes.StoredPass``), merged in function order
    jump_answers  JumpAnswers: per instruction, whether a jump probe can sit there

    board         Board: what survey, proofs and rows hand each other; the merges of the workers' shards
    harvest       what the workers proved, into the persistent proof cache (``Behind``: by a thread)
    sizes         how the phases cut their work into tasks
"""

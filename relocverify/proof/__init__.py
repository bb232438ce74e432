"""The proof stage and its trust base.

    verdict      Verdict (ordered by strength), ProofResult, Counterexample
    semantics    VEX IR over claripy: the symbolic machine both sides run on
    canonical    a lifted block's canonical form and lifter-check facts, from pyvex's objects (the reference)
    lifted       the same, read natively from libVEX's C block (irsb_walk.c, loaded by native_walk)
    fast_path    proof by IR identity (its soundness argument in its docstrings)
    smt          the SMT obligation and its counterexamples, replayed on unicorn
    atomicity    the LOCK obligation
    lift_gaps    instructions VEX lifts wrongly: never proved
    cache_key    what a verdict depends on, so that it may be reused
    prove        the entry points: our plans, foreign relocations, foreign emulations
"""

"""The scheduler: runs tasks on a pool of workers and hands back their values; it knows no verdicts.

    kinds        WorkerKind: what a pool knows of its workers (how to make one, what to merge of theirs)
    local_pool   LocalPool: forked local processes, a dead one replaced and its task handed back
    dask_pool    DaskPool: the same interface over a Dask cluster
    phase        Phase: one round of tasks on a pool (its queues, what becomes of each value, what goes
                 again when a worker dies), and ``drive``, which runs one with its progress line
    rounds       RoundMerges: a phase's shards merged in rounds while the workers go on
    smt_helper   the SMT check in a process of its own, for a cold run's workers
    watchdog     a timer that ends work which outlives its time (SIGALRM, or a thread's async exception)
    progress     one line per phase on stderr, or a rich bar on a terminal

The engine (``engine/``) says what the tasks are: ``engine.worker_kind.ENGINE_WORKERS``, and its phases
(``engine/phases``).
"""

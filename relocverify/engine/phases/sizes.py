"""How the engine's phases cut their work into tasks.  Read at run time (a test may set them smaller); any
value >= 1 gives the same store, and only the time changes (docs/performance.md has the measurements)."""

#: Functions per survey or rows task: enough that a task's message costs little beside its work, few enough
#: that the two workers end a phase close together.
CHUNK_FUNCTIONS = 64
#: Functions per task of counting instructions of functions an earlier run stored (no decoding of plans).
COUNT_CHUNK = CHUNK_FUNCTIONS * 4
#: Representatives per proofs task: a task is handed to whichever worker is free, so small enough that the
#: last ones end together (a worker decodes at most ``worker.DECODE_AHEAD`` of a task ahead of its proofs).
PROVE_CHUNK = 256
#: Alternatives per replacements task.
REPLACEMENT_CHUNK = 256
#: Functions per jump-probes task: each may hold block proofs of several seconds.
JUMP_CHUNK = 32
#: Functions per task of a pass added from outside (``engine.passes``).
PASS_CHUNK = 64
#: Functions per task of a pass over the stored rows (``engine.passes.StoredPass``): a chunk's value is merged
#: whole in the parent, so larger chunks leave it less to merge (what repeats from function to function, such as
#: the audit's cases, is merged once per chunk).
STORED_CHUNK = 128
#: The survey's and the rows phase's shards are closed and merged into the store (``Store.merge_shards_behind``,
#: ``schedule.rounds``) this many times, the last at the phase's end, so that most of the merging runs beside the workers rather than after
#: them.  More rounds mean smaller merges, each with its own transaction.
ROWS_ROUNDS = 4
#: The part of each worker's rows the last round takes: its merge is the one that runs after the workers, with a
#: core idle (a kernel's, a quarter of the rows, took 0.2 s).
ROWS_LAST_SHARE = 0.1


def chunks(items: list, n: int) -> list[list]:
    """``items`` cut into lists of ``n`` (the last shorter)."""
    return [items[i:i + n] for i in range(0, len(items), n)]

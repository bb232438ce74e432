"""The decoder gate: every instruction of some inputs decoded by the decoder
under test, compared with a baseline, with the other decoders' consensus,
and with the relocation plan and verdict that follow from its answer.

``run.run_gate`` is the entry point; ``relocverify gate`` is its CLI.
"""

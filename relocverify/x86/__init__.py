"""The shared x86-64 base: registers, encoding helpers, the structural layout
of an encoding, the decoder-neutral instruction record, and the decoders.

Everything else in relocverify may import from here; nothing here imports
from the stages above it.
"""

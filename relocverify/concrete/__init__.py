"""Concrete execution: the machine states and outcomes of a replay, the
unicorn machine that runs code at kernel addresses, the concrete
interpreter of emulation effects, and the replay that compares two sides.

The probe runtime (``relocverify.runtime``) is built on the same machine.
"""

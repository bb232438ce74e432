"""The decoder adapters: each turns bytes at an address into one decoder's
answer.  ``relocverify.x86.decode`` cross-checks them; ``known_bugs`` holds
the documented decoder defects a disagreement may be resolved by.
"""

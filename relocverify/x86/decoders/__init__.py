"""The decoders, each one class behind ``protocol.Decoder``: each turns bytes
at an address into one decoder's answer.  ``relocverify.x86.decode``
cross-checks capstone's and iced-x86's (``protocol.DetailDecoder.detail``),
the decoder gate compares them all (``decode_many``); ``adapters`` names them;
``known_bugs`` holds the documented decoder defects a disagreement may be
resolved by.
"""

"""The project's exception tree.

Raise these only for caller mistakes and unusable inputs; per-instruction
outcomes (undecodable bytes, rejected plans, unknown verdicts) are values.
Third-party exceptions are converted to these at the one place they can
arise, and the CLI turns every ``RelocverifyError`` into a one-line message
and a fixed exit code (see ``cli.main``).
"""


class RelocverifyError(Exception):
    """Base of every error the CLI reports as a one-line message."""


class InputError(RelocverifyError):
    """The user's input is unusable: bad hex, bad address, bad option."""


class ImageError(InputError):
    """An ELF, bzImage or symbol file cannot be read as a kernel image."""


class StoreError(RelocverifyError):
    """The result store cannot be opened or is not a relocverify store."""


class FetchError(RelocverifyError):
    """A named kernel package cannot be downloaded or extracted."""

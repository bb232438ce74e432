"""Tracer models: what kprobes, optprobes, uprobes, kinst and fasttrap do with an instruction.

One module per tracer and version (``kprobes_6_1``, ``kprobes_6_12``, ``uprobes_6_1``, ...), over
shared model code (``kprobes``, ``uprobes``, ...); ``history`` holds versions from before known
fixes.  ``model.py`` says what a model answers; ``judge.py`` proves an answer; ``audit.py``
buckets every instruction of an image per tracer, in one process; ``audit_pass.py`` does the same as a
pass of the engine's run, on its workers; ``run.py`` audits whole inputs.  Nothing below this package
imports it.
"""

from __future__ import annotations

from importlib import import_module

from ..errors import InputError

#: name -> (module, attribute): the models ``relocverify audit --tracer`` knows.
_MODELS = {
    "kprobes@6.1": ("kprobes_6_1", "MODEL"),
    "kprobes@6.12": ("kprobes_6_12", "MODEL"),
    "optprobes@6.1": ("optprobes", "MODEL_6_1"),
    "optprobes@6.12": ("optprobes", "MODEL_6_12"),
    "optprobes@6.1+ret": ("optprobes", "MODEL_6_1_RET"),  # return sites as apply_returns leaves them without RETHUNK
    "uprobes@6.1": ("uprobes_6_1", "MODEL"),
    "uprobes@6.12": ("uprobes_6_12", "MODEL"),
    "kprobes@6.1+findings": ("findings", "KPROBES_6_1"),  # docs/findings' patches applied
    "optprobes@6.1+findings": ("findings", "OPTPROBES_6_1"),
    "uprobes@6.1+findings": ("findings", "UPROBES_6_1"),
    "kinst": ("kinst", "MODEL"),
    "fasttrap": ("fasttrap", "MODEL"),
}
ALIASES = {"kprobes": "kprobes@6.1", "optprobes": "optprobes@6.1", "uprobes": "uprobes@6.1"}


def names() -> list[str]:
    from .history import HISTORY

    return list(_MODELS) + list(HISTORY)


def get_model(name: str):
    """The model called ``name`` ('kprobes@6.1', 'kinst', a ``history`` version)."""
    name = ALIASES.get(name, name)
    if name in _MODELS:
        module, attr = _MODELS[name]
        return getattr(import_module(f"{__name__}.{module}"), attr)
    from .history import HISTORY

    if name in HISTORY:
        return HISTORY[name]
    raise InputError(f"no tracer model {name!r}; known: {', '.join(names())} (or audit an unmodelled tracer "
                     f"with --tracer-cmd)")

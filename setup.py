"""The compiled parts of relocverify, each a second implementation of Python code it is tested against:

* ``relocverify.proof.irsb_walk`` (``relocverify/proof/lifted.py``) reads libVEX's IR structures, so it is
  compiled against the headers of the pyvex it runs with: pyproject.toml's build requirements pin the
  same pyvex as its dependencies;
* ``relocverify.engine.row_pack`` (``relocverify/engine/worker.py``) writes a function's packed row;
* ``relocverify.engine.jump_walk`` (``relocverify/engine/jumps.py``) answers a function's jump probes;
* ``relocverify.store.tally`` (``relocverify/store/store.py``) adds up an image's packed counts for its summary.

A machine without a C compiler still installs relocverify (all are optional) and runs their Python
paths, more slowly; ``relocverify --version`` says which serve."""

import importlib.util
import os

from setuptools import Extension, setup


def _pyvex_include() -> str:
    spec = importlib.util.find_spec("pyvex")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("building relocverify.proof.irsb_walk needs pyvex installed (its libVEX headers)")
    return os.path.join(list(spec.submodule_search_locations)[0], "include")


HERE = os.path.dirname(os.path.abspath(__file__))


def _extensions_module():
    """``relocverify/extensions.py`` by its path (the standard library only), not the package: the build
    and the loader take a source's digest the same way."""
    spec = importlib.util.spec_from_file_location("_relocverify_extensions",
                                                  os.path.join(HERE, "relocverify", "extensions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DIGEST = _extensions_module().build_digest


def _extension(name: str, source: str, depends=(), **kw) -> Extension:
    """An optional extension that carries the digest of the source it was built from (the ``.c`` file and
    the headers beside it that it includes, ``depends``): its loader (``extensions.load``) refuses a build
    of another source (an edited file not rebuilt), and the Python path serves until it is rebuilt."""
    digest = _DIGEST(os.path.join(HERE, source))
    return Extension(name, [source], depends=list(depends), define_macros=[("RV_SOURCE_SHA256", f'"{digest}"')],
                     extra_compile_args=["-O2"], optional=True, **kw)


setup(ext_modules=[_extension("relocverify.proof.irsb_walk", "relocverify/proof/irsb_walk.c",
                              include_dirs=[_pyvex_include()]),
                   _extension("relocverify.engine.row_pack", "relocverify/engine/row_pack.c",
                              depends=["relocverify/engine/buffers.h"]),
                   _extension("relocverify.engine.jump_walk", "relocverify/engine/jump_walk.c",
                              depends=["relocverify/engine/buffers.h"]),
                   _extension("relocverify.engine.key_walk", "relocverify/engine/key_walk.c"),
                   _extension("relocverify.store.tally", "relocverify/store/tally.c")])

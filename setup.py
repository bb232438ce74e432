"""The one compiled part of relocverify: ``relocverify.proof.irsb_walk`` (see ``relocverify/proof/lifted.py``).

It reads libVEX's IR structures, so it is compiled against the headers of the pyvex it runs with:
pyproject.toml's build requirements pin the same pyvex as its dependencies.  A machine without a C
compiler still installs relocverify (the extension is optional) and proves with pyvex's objects,
more slowly; ``relocverify --version`` says which."""

import hashlib
import importlib.util
import os

from setuptools import Extension, setup


def _pyvex_include() -> str:
    spec = importlib.util.find_spec("pyvex")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("building relocverify.proof.irsb_walk needs pyvex installed (its libVEX headers)")
    return os.path.join(list(spec.submodule_search_locations)[0], "include")


SOURCE = "relocverify/proof/irsb_walk.c"
# The module carries the digest of the source it was built from: ``proof.native_walk`` refuses a build
# of another source (an edited irsb_walk.c not rebuilt), and the pyvex path serves until it is rebuilt.
DIGEST = hashlib.sha256(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), SOURCE), "rb").read()).hexdigest()

setup(ext_modules=[Extension("relocverify.proof.irsb_walk", [SOURCE], include_dirs=[_pyvex_include()],
                             define_macros=[("RV_SOURCE_SHA256", f'"{DIGEST}"')], extra_compile_args=["-O2"],
                             optional=True)])

"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from relocverify.image.fetch import fetch, stripped_copy


@pytest.fixture(scope="session")
def debian_kernels():
    """get(name) -> (FetchedKernel, path of a stripped copy of its vmlinux), fetched once per session."""
    cache = {}

    def get(name):
        if name not in cache:
            kernel = fetch(name)
            cache[name] = (kernel, stripped_copy(kernel.vmlinux))
        return cache[name]
    return get

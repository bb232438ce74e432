"""optprobes over the text the kernel walks after boot: return thunk sites as ``apply_returns`` leaves
them (``optprobes@6.1+ret``) against the file's bytes (``optprobes@6.1``).

On the confirm guest (Debian 6.1.187 under QEMU TCG, ``-cpu max``: no X86_FEATURE_RETHUNK) a probe at
``pipe_poll+0xf`` is [OPTIMIZED] and the return site at ``pipe_poll+0x105`` holds ``c3 cc cc cc cc``
(docs/confirm.md); ``optprobes@6.1`` refuses the probe for that site's ``jmp __x86_return_thunk``."""

from __future__ import annotations

import pytest

from relocverify.kernel.variants import return_site_bytes
from relocverify.plan.plan import DEFAULT_TRAMP
from relocverify.tracers import get_model
from relocverify.tracers.model import Context, Refuse, RelocateBlock
from relocverify.x86.decode import decode

T = DEFAULT_TRAMP
START = 0xFFFFFFFF81100000


@pytest.fixture(autouse=True, scope="module")
def _sources(linux_sources):
    """The models decode with the kernel's own decoder."""


def _answer(model: str, data: bytes, off: int, kinds: dict, start: int, thunks):
    m = get_model(model)
    live = m.live_bytes(data, kinds)
    offsets, pos = [], 0
    while pos < len(live):
        offsets.append(pos)
        pos += decode(live[pos:pos + 15], start + pos).length
    walk = m.function_walk(live, start, offsets, frozenset(), thunks)
    return live, m.answer_in(walk, live, off, T, Context(True, (), "f"), frozenset(),
                             lambda o: tuple(kinds.get(o, ())), None)


def test_apply_returns_leaves_ret_and_int3_without_rethunk_and_the_jump_with_it():
    jmp = bytes.fromhex("e9d6b3aa00")
    assert return_site_bytes(jmp, rethunk=False) == bytes.fromhex("c3cccccccc")
    assert return_site_bytes(jmp, rethunk=True) == jmp


def test_a_return_thunk_jump_refuses_the_function_in_the_file_and_not_in_the_live_text():
    # push %rbp; mov %rsp,%rbp; add $1,%rax; add $2,%rax; pop %rbp; jmp __x86_return_thunk (a return site)
    data = bytes.fromhex("55 4889e5 4883c001 4883c002 5d e9 00100000".replace(" ", ""))
    site = len(data) - 5
    thunk = START + len(data) + 0x1000
    kinds = {site: ("return_thunk",)}
    file_live, file_answer = _answer("optprobes@6.1", data, 1, kinds, START, (thunk, thunk + 0x40))
    assert file_live == data
    assert isinstance(file_answer, Refuse) and "__indirect_thunk_start" in file_answer.reason
    live, answer = _answer("optprobes@6.1+ret", data, 1, kinds, START, (thunk, thunk + 0x40))
    assert live[site:] == bytes.fromhex("c3cccccccc") and live[:site] == data[:site]
    assert isinstance(answer, RelocateBlock)
    assert "apply_returns" in get_model("optprobes@6.1+ret").source


def test_the_live_variant_predicts_what_the_confirm_guest_showed_at_pipe_poll():
    """The real Debian 6.1.187 kernel: the model judging the file refuses pipe_poll+0xf for the return
    site at +0x105; the model judging apply_returns' bytes optimizes it, and predicts the live bytes
    the guest read there (c3cccccccc)."""
    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions
    from relocverify.image.loader import load_image
    from relocverify.kernel.sites import find_sites

    kernel = fetch("debian-6.1-cloud")
    image = load_image(kernel.vmlinux, kernel.system_map)
    fn = next(f for f in find_functions(image) if f.name == "pipe_poll")
    data = image.read(fn.start, fn.end - fn.start)
    sites = find_sites(image)
    kinds: dict[int, tuple] = {}
    for s in sites.iter_sites():  # each site at its own address, as the store's rows carry them
        if fn.start <= s.address < fn.end:
            kinds[s.address - fn.start] = kinds.get(s.address - fn.start, ()) + (s.kind,)
    assert kinds.get(0x105) == ("return_thunk",)
    thunks = (image.symbol_address("__indirect_thunk_start"), image.symbol_address("__indirect_thunk_end"))
    _, refused = _answer("optprobes@6.1", data, 0xF, kinds, fn.start, thunks)
    assert isinstance(refused, Refuse) and "+0x105" in refused.reason and "__indirect_thunk_start" in refused.reason
    live, optimized = _answer("optprobes@6.1+ret", data, 0xF, kinds, fn.start, thunks)
    assert isinstance(optimized, RelocateBlock)
    assert live[0x105:0x10A].hex() == "c3cccccccc"  # what /proc/kcore showed in the guest


def test_confirm_says_which_optprobes_model_predicts_what_the_kernel_listed():
    """confirm's prediction for an optimized probe (``confirm.prediction``), from the cached guest's own
    image index: at pipe_poll+0xf, which the guest listed [OPTIMIZED], optprobes@6.1 disagrees and
    optprobes@6.1+ret agrees; at dcache_readdir+0x8f both say not optimized (a call in the copied run
    for the +ret model: its thunk jump is a retpoline, which stays)."""
    from relocverify.confirm.guest import Guest
    from relocverify.confirm.prediction import optprobes_predictions
    from relocverify.confirm.sites import resolve_kernel_site
    from relocverify.image.fetch import fetch

    kernel = fetch("debian-6.1-cloud")
    guest = Guest("debian-6.1-cloud", kernel.release, "", "", "", kernel.vmlinux, kernel.system_map, (), (), ())
    site = resolve_kernel_site("pipe_poll+0xf", guest.vmlinux, guest.system_map)
    file_model, live_model = optprobes_predictions(site, guest)
    assert (file_model.model, live_model.model) == ("optprobes@6.1", "optprobes@6.1+ret")
    assert file_model.optimized is False and "+0x105" in file_model.why and file_model.agrees(True) is False
    assert live_model.optimized is True and live_model.agrees(True) is True
    site = resolve_kernel_site("dcache_readdir+0x8f", guest.vmlinux, guest.system_map)
    assert [p.optimized for p in optprobes_predictions(site, guest)] == [False, False]

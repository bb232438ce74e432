"""Live kernel text (issue 43, item 1): ``check --live-text DUMP --kallsyms FILE`` and ``--running``.

The corpus (``corpora/live/``) is the Debian 6.1 cloud kernel's live text as the ``confirm`` guest ran it
with spectre_v2=off and with spectre_v2=retpoline, and ``expected.toml`` says per site which boot variant
is live in each.  The fast tests read the dumps alone; the slow ones ask ``check`` on the real kernel, and
boot the guest to capture the live text again."""

from __future__ import annotations

import io
import json
import struct
import tomllib
from pathlib import Path

import pytest

from relocverify import cli
from relocverify.errors import InputError
from relocverify.image.running import KcoreUnreadable, RunningKernel, gnu_build_id, read_kcore, running_image
from relocverify.image.locations import parse_location
from relocverify.kernel.live import (LiveText, live_instruction, live_text, live_variant, merge_ranges, parse_dump,
                                     parse_kallsyms, slide)
from relocverify.kernel.variants import NoVariants, Variant

LIVE = Path(__file__).resolve().parent.parent / "corpora" / "live"
EXPECTED = tomllib.loads((LIVE / "expected.toml").read_text())
TEXT_START = 0xFFFFFFFF81000000  # the 6.1 cloud vmlinux's .text


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def capture(name: str) -> LiveText:
    c = EXPECTED["capture"][name]
    return live_text((LIVE / c["dump"]).read_text(), c["dump"], (LIVE / c["kallsyms"]).read_text(), c["kallsyms"],
                     TEXT_START)


def address(name: str, at: str) -> int:
    spec = parse_location(at)
    return parse_kallsyms((LIVE / EXPECTED["capture"][name]["kallsyms"]).read_text(), "k")[spec.name] + spec.offset


# -- the captured dumps, without the kernel ------------------------------------------------------------------

@pytest.mark.parametrize("site", EXPECTED["site"], ids=lambda s: s["at"])
def test_each_capture_holds_the_live_bytes_the_corpus_names(site):
    for name in EXPECTED["capture"]:
        text = capture(name)
        a = address(name, site["at"])
        want = bytes.fromhex(site[name]["live"])
        assert text.read(a, len(want)) == want, (name, site["at"])
        assert live_instruction(text, a, None).raw == want


def test_the_two_boots_differ_exactly_where_a_site_says_they_do():
    off, retpoline = capture("off"), capture("retpoline")
    for site in EXPECTED["site"]:
        a = address("off", site["at"])
        differ = off.read(a, 5) != retpoline.read(a, 5)
        assert differ == (site["off"]["live"] != site["retpoline"]["live"]), site["at"]
    assert off.ranges[0][0] == retpoline.ranges[0][0] and len(off.ranges) == len(retpoline.ranges) == 3


def test_a_slid_dump_reads_as_the_unslid_one():
    """KASLR: the dump's and kallsyms' addresses both moved by the slide read the same bytes at an image address."""
    moved = 0x2a00000
    dump = "".join(f"{a + moved:x} {d.hex()}\n" for a, d in capture("off").ranges)
    kallsyms = "\n".join(f"{a + moved:x} T {n}" for n, a in parse_kallsyms(
        (LIVE / EXPECTED["capture"]["off"]["kallsyms"]).read_text(), "k").items())
    slid = live_text(dump, "d", kallsyms, "k", TEXT_START)
    a = address("off", "dcache_readdir+0x8f")
    assert slid.slide == moved and slid.read(a, 3) == capture("off").read(a, 3) == bytes.fromhex("41ffd2")


def test_a_console_log_is_a_dump_and_pieces_join():
    text = "RVC:live 0xffffffff81000000 0f1f44\nRVC:live 0xffffffff81000003 0000 # the rest\n\n"
    assert parse_dump(text, "log") == ((0xFFFFFFFF81000000, bytes.fromhex("0f1f440000")),)
    assert merge_ranges([(10, b"ab"), (11, b"XY"), (20, b"z")]) == ((10, b"aXY"), (20, b"z"))


@pytest.mark.parametrize("dump,kallsyms,said", [
    ("ffffffff81000000 0f1", "ffffffff81000000 T _stext", "not a live-text line"),
    ("# nothing\n", "ffffffff81000000 T _stext", "no live text"),
    ("ffffffff81000000 90", "0000000000000000 T _stext\n0000000000000000 T vfs_read", "kptr_restrict"),
    ("ffffffff81000000 90", "ffffffff81002000 T vfs_read", "neither _stext nor _text"),
])
def test_unusable_dumps_and_kallsyms_are_one_line(dump, kallsyms, said):
    with pytest.raises(InputError, match=said):
        live_text(dump, "d", kallsyms, "k", TEXT_START)


def test_a_walk_from_the_function_start_says_whether_the_address_is_an_instruction():
    text = LiveText(((0x1000, bytes.fromhex("41ffd20f1f00c3")),), 0, "t")  # call *%r10; nopl (%rax); ret
    assert live_instruction(text, 0x1003, 0x1000) == (bytes.fromhex("0f1f00"), True)
    assert live_instruction(text, 0x1001, 0x1000).boundary is False
    assert live_instruction(text, 0x2000, 0x1000) is None


def test_the_live_variant_is_named_or_the_model_is_found_wrong():
    variants = [Variant("thunk (on disk)", bytes.fromhex("2ee82bfea700")), Variant("call *%r10", bytes.fromhex("41ffd2"))]
    named = live_variant("retpoline", 0x10, variants, bytes.fromhex("41ffd2"), bytes.fromhex("2ee82bfea700"))
    assert (named.variant, named.differs, named.runtime) == ("call *%r10", True, "")
    wrong = live_variant("retpoline", 0x10, variants, bytes.fromhex("ffd0"), bytes.fromhex("2ee82bfea700"))
    assert wrong.variant is None and "against the model" in wrong.note
    fentry = live_variant("fentry", 0x10, NoVariants("x"), bytes.fromhex("0f1f440000"), bytes.fromhex("e800000000"))
    assert fentry.variant is None and "ftrace" in fentry.runtime


# -- the running kernel ---------------------------------------------------------------------------------------

def test_a_kernel_that_is_not_debian_and_not_installed_is_one_line_saying_so():
    kernel = RunningKernel("6.18.44-fc-v657", "#1 SMP PREEMPT_DYNAMIC @0", None)
    assert kernel.debian_version is None
    with pytest.raises(InputError, match="not a Debian kernel .* name its vmlinux instead"):
        running_image(kernel)
    assert RunningKernel("6.1.0-53-cloud-amd64", "#1 SMP PREEMPT_DYNAMIC Debian 6.1.187-1 (2025-05-31)",
                         None).debian_version == "6.1.187-1"


def test_running_on_this_machine_answers_or_gives_one_line_why_not():
    from relocverify.image.running import identify

    kernel = identify()
    code, out, err = run("check", "--running", "kprobe:vfs_read+0")
    if kernel.debian_version is None:
        assert code == cli.EXIT_USAGE and out == ""
        assert err.count("\n") == 1 and f"the running kernel {kernel.release} is not a Debian kernel" in err
    else:  # a Debian machine: the answer, or one line (no permission, no symbols to be had)
        assert code != cli.EXIT_INTERNAL and (out or err.count("\n") == 1), err


def test_show_running_takes_the_function_alone_or_says_why_not():
    from relocverify.image.running import identify

    code, out, err = run("show", "--running", "vfs_read")
    if identify().debian_version is None:
        assert code == cli.EXIT_USAGE and out == "" and err.count("\n") == 1 and "not a Debian kernel" in err
    else:
        assert code != cli.EXIT_INTERNAL, err
    code, out, err = run("show", "vfs_read")
    assert code == cli.EXIT_USAGE and "show needs SOURCE and FUNCTION" in err and "--running" in err
    code, out, err = run("show", "--running", "vmlinux", "vfs_read")
    assert code == cli.EXIT_USAGE and "give no SOURCE" in err


def test_export_running_finds_the_running_kernels_store_or_says_why_not():
    from relocverify.image.running import identify

    code, out, err = run("export", "--running", "--format", "bpftrace")
    if identify().debian_version is None:
        assert code == cli.EXIT_USAGE and out == "" and err.count("\n") == 1 and "not a Debian kernel" in err
    else:  # its store, or the line naming the command that writes it
        assert code == cli.EXIT_CLEAN or "relocverify vmlinux" in err, err
    code, out, err = run("export", "--format", "bpftrace")
    assert code == cli.EXIT_USAGE and "export needs a STORE" in err


def test_the_running_kernels_store_is_where_vmlinux_writes_it(tmp_path):
    """export --running looks where ``relocverify vmlinux IMAGE`` writes by default: the same path from the
    image index's identity as from the loaded image's."""
    import elfbuild

    from relocverify.engine.verify import default_store, store_path
    from relocverify.image.loader import load_image
    from relocverify.store.image_index import indexed

    image = str(elfbuild.build_elf(tmp_path, ".text\n.globl f\n.type f,@function\nf: nop\n ret\n.size f,.-f\n",
                                   "SECTIONS { . = 0xffffffff81000000; .text : { *(.text) } }"))
    assert store_path(image, indexed(image, kernel=False, cache_dir=str(tmp_path)).identity) == \
        default_store(image, load_image(image))


def test_the_build_id_is_read_from_notes():
    note = struct.pack("<III", 4, 4, 3) + b"GNU\0" + bytes.fromhex("deadbeef")
    other = struct.pack("<III", 6, 4, 1) + b"Linux\0\0\0" + b"\0" * 4
    assert gnu_build_id(other + note) == "deadbeef" and gnu_build_id(other) is None


def test_kcore_is_read_through_its_load_segments(tmp_path):
    """/proc/kcore's layout: an ELF core whose PT_LOAD segments map kernel addresses to file offsets."""
    vaddr, body = 0xFFFFFFFF81000000, bytes(range(256)) * 4
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0x1000, vaddr, 0, len(body), len(body), 0x1000)
    ehdr = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 4, 62, 1, 0, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    core = tmp_path / "kcore"
    core.write_bytes(ehdr + phdr + bytes(0x1000 - 64 - 56) + body)
    assert read_kcore([(vaddr + 0x10, 4)], str(core)) == [(vaddr + 0x10, bytes([16, 17, 18, 19]))]
    assert "in no segment" in read_kcore([(vaddr - 1, 4)], str(core)).reason
    assert isinstance(read_kcore([(vaddr, 1)], str(tmp_path / "missing")), KcoreUnreadable)


def test_live_text_without_kallsyms_is_refused(tmp_path):
    dump = tmp_path / "d"
    dump.write_text("ffffffff81000000 90\n")
    code, out, err = run("check", "--live-text", str(dump), "kprobe:vfs_read+0")
    assert code == cli.EXIT_USAGE and "go together" in err


# -- on the real kernel --------------------------------------------------------------------------------------

def _answer(name: str, at: str, dump: str, kallsyms: str) -> dict:
    code, out, err = run("check", "--json", "--live-text", dump, "--kallsyms", kallsyms, at)
    assert code in (cli.EXIT_CLEAN, cli.EXIT_FINDINGS), err
    return json.loads(out)


@pytest.mark.slow
@pytest.mark.parametrize("site", EXPECTED["site"], ids=lambda s: s["at"])
def test_check_names_the_live_variant_of_each_site_in_each_boot(site, debian_kernels):
    debian_kernels("debian-6.1-cloud")
    answers = {}
    for name, c in EXPECTED["capture"].items():
        doc = _answer(name, site["at"], str(LIVE / c["dump"]), str(LIVE / c["kallsyms"]))
        live = doc["live"]
        assert live["judged"] == "live" and live["live_bytes"] == site[name]["live"], (name, live)
        found = [s for s in live["sites"] if s["kind"] == site["kind"]]
        assert [(s["variant"], s["differs"]) for s in found] == [(site[name]["variant"], site[name]["differs"])]
        assert doc["mnemonic"] and bytes.fromhex(live["live_bytes"]).hex() == site[name]["live"]
        answers[name] = doc
    if site["off"]["live"] != site["retpoline"]["live"]:
        assert answers["off"]["mnemonic"] != answers["retpoline"]["mnemonic"]


@pytest.mark.slow
def test_the_text_answer_says_the_live_variant_and_the_files_bytes(debian_kernels):
    debian_kernels("debian-6.1-cloud")
    c = EXPECTED["capture"]["off"]
    code, out, err = run("check", "--live-text", str(LIVE / c["dump"]), "--kallsyms", str(LIVE / c["kallsyms"]),
                         "dcache_readdir+0x8f")
    assert code == cli.EXIT_CLEAN, err
    assert "callq *%r10" in out and "the file has 2e e8 2b fe a7 00" in " ".join(out.split())
    assert "live variant 'call *%r10', differs from the file" in " ".join(out.split())


@pytest.mark.slow
def test_the_guest_booted_twice_gives_live_text_that_names_each_variant(debian_kernels, tmp_path):
    """Boot the confirm guest with spectre_v2=off and =retpoline, bring the three functions' live text and
    kallsyms out through the serial console, and ask check about the corpus's sites: the answers match
    the committed corpus (captured the same way)."""
    from relocverify.confirm.guest import build_guest
    from relocverify.confirm.live_text import capture as boot_capture
    from relocverify.store.image_index import indexed

    debian_kernels("debian-6.1-cloud")
    guest = build_guest("debian-6.1-cloud")
    index = indexed(guest.vmlinux, guest.system_map)
    functions = [(n, index.functions.named(n).start, index.functions.named(n).size)
                 for n in ("dcache_readdir", "vfs_read", "pipe_poll")]
    for name, c in EXPECTED["capture"].items():
        got = boot_capture(guest, functions, c["cmdline"], cache_dir=str(tmp_path))
        assert got.seconds is not None  # booted now, not from the cache
        assert parse_dump(Path(got.dump).read_text(), "now") == parse_dump((LIVE / c["dump"]).read_text(), "corpus")
        for site in EXPECTED["site"]:
            live = _answer(name, site["at"], got.dump, got.kallsyms)["live"]
            assert live["live_bytes"] == site[name]["live"]
            assert site[name]["variant"] in [s["variant"] for s in live["sites"]]
        assert boot_capture(guest, functions, c["cmdline"], cache_dir=str(tmp_path)).seconds is None  # cached


def test_unreadable_live_text_judges_the_file_and_says_so(tmp_path):
    """--running where /proc/kcore cannot be read (here: there is none; elsewhere: not root): the file is judged,
    and the answer says the live bytes were not read and why."""
    import os
    from types import SimpleNamespace

    import elfbuild

    from relocverify.cli import check as check_cli
    from relocverify.cli import live as live_cli
    from relocverify.store.image_index import indexed

    image = str(elfbuild.build_elf(tmp_path, ".text\n.globl f\n.type f,@function\nf: nop\n ret\n.size f,.-f\n",
                                   "SECTIONS { . = 0xffffffff81000000; .text : { *(.text) } }"))
    index = indexed(image, kernel=False, cache_dir=str(tmp_path))
    got = live_cli.live_text(SimpleNamespace(running=True, live_text=None), index, 0xFFFFFFFF81000000,
                             0xFFFFFFFF81000002)
    if os.access("/proc/kcore", os.R_OK) and os.access("/proc/kallsyms", os.R_OK):
        return  # readable here: the other tests judge live text
    assert isinstance(got, live_cli.Unread) and got.reason
    said = check_cli._live_lines(got)
    assert len(said) == 1 and "live: not read" in said[0] and "the file's verdict" in said[0]
    assert check_cli._live_json(got) == {"read": False, "reason": got.reason, "judged": "file"}


def test_audit_running_audits_the_running_kernels_file_or_says_why_not():
    from relocverify.image.running import identify

    code, out, err = run("audit", "--running", "--tracer", "kprobes@6.1", "--limit", "2")
    if identify().debian_version is None:
        assert code == cli.EXIT_USAGE and out == "" and err.count("\n") == 1 and "not a Debian kernel" in err
    else:  # the running kernel's file audited, and said so
        assert code != cli.EXIT_INTERNAL and "audit: the running kernel" in err, err
    code, out, err = run("audit", "--running", "/bin/true", "--tracer", "kprobes@6.1")
    assert code == cli.EXIT_USAGE and "give no IMAGE" in err


# --- the console's damage to a capture (no boot) ---------------------------------------------------------

def _damaged(hexes, draw_damage):
    """What a serial console may do to a line: lose characters, carry another line's text inside it, end early."""
    from hypothesis import strategies as st

    out = []
    for h in hexes:
        kind = draw_damage(st.sampled_from(["none", "none", "drop", "insert", "truncate"]))
        if kind == "drop" and h:
            i = draw_damage(st.integers(0, len(h) - 1))
            h = h[:i] + h[i + 1:]
        elif kind == "insert":
            i = draw_damage(st.integers(0, len(h)))
            h = h[:i] + draw_damage(st.sampled_from(["[   12.5] random: crng init done", "RVC:note x", " ", "0"])) + h[i:]
        elif kind == "truncate" and h:
            h = h[:draw_damage(st.integers(0, len(h) - 1))]
        out.append((kind, h))
    return out


def test_a_capture_takes_only_pieces_two_whole_copies_agree_on():
    """``confirm.live_text.whole`` over generated pieces and console damage (characters lost, another line's text
    inside, a line cut short; CI once met a piece one hex digit short): a piece is taken with its true bytes or
    not at all, and taken whenever two copies came out undamaged."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from relocverify.confirm.live_text import COPIES, whole

    @settings(max_examples=150, deadline=None)
    @given(data=st.data(), sizes=st.lists(st.integers(1, 64), min_size=1, max_size=6), boots=st.integers(1, 3))
    def check(data, sizes, boots):
        asked, truth, read, intact = [], {}, [], {}
        address = 0xFFFFFFFF81000000
        for n in sizes:
            truth[address] = data.draw(st.binary(min_size=n, max_size=n)).hex()
            asked.append((address, n))
            address += n
        for _ in range(boots):
            for a, n in asked:
                for kind, h in _damaged([truth[a]] * COPIES, data.draw):
                    read.append((a, h))
                    intact[a] = intact.get(a, 0) + (kind == "none" or h == truth[a])
        good, problems = whole(asked, read)
        assert all(good[a] == truth[a] for a in good)  # never another value
        assert {a for a, _ in asked if intact.get(a, 0) >= 2} <= set(good)
        assert len(good) + len(problems) == len(asked)

    check()

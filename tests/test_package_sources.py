"""``relocverify package NAME|DEB|DIR`` and ``--jump-probes`` beyond ``vmlinux``.

Small kernel packages built here with ``dpkg-deb`` (every compression it
writes) and small directories check how a kernel's parts are found; a tiny
kernel with gcc-built modules runs the whole command, jump probes included;
gcc-built user-space files check the user-space range rules.  The slow tests
compare the real Debian 6.1 cloud packages (.deb and -dbg, and a tree
unpacked from them) with ``package debian-6.1-cloud``: the same images, the
same verdict counts."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from relocverify.cli import main
from relocverify.engine.jumps import empty_jump_section, jump_totals
from relocverify.errors import InputError
from relocverify.image.debian import from_debs, from_directory, is_placeholder, module_order, unpacked
from relocverify.image.fetch import KERNELS, strip_elf

RELEASE = "9.9.9-1-test-amd64"
PLACEHOLDER = "ffffffffffffffff B The real System.map is in the linux-image-<version>-dbg package\n"
#: Module paths below kernel/, in the order ``sorted()`` gives the Paths of a named kernel's modules
#: (by component: ``x/`` before ``x-y/``, although "x-y/" < "x/" as strings).
MODULES = ["drivers/x/a.ko", "drivers/x-y/b.ko", "fs/c.ko.xz", "net/d.ko.zst"]


def run_main(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def vmlinux(tmp_path_factory) -> Path:
    """A tiny linked kernel (``test_engine.SMALL_ASM``: code at 0xffffffff81000000, with .symtab)."""
    import elfbuild
    import test_engine

    return elfbuild.build_elf(tmp_path_factory.mktemp("kernel"), test_engine.SMALL_ASM, test_engine.SMALL_LDS)


def build_deb(directory: Path, package: str, files: dict[str, bytes], compression: str = "xz") -> Path:
    """A .deb of ``files`` (package path -> bytes), built by dpkg-deb."""
    if shutil.which("dpkg-deb") is None:
        pytest.fail("building the test packages needs dpkg-deb: apt-get install dpkg")
    root = directory / f"{package}-root"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(f"Package: {package}\nVersion: 9.9.9-1\nArchitecture: amd64\n"
                                             f"Maintainer: Test <test@example.org>\nDescription: test kernel\n")
    deb = directory / f"{package}_9.9.9-1_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", f"-Z{compression}", "-b", str(root), str(deb)], check=True,
                   capture_output=True)
    return deb


def image_files() -> dict[str, bytes]:
    files = {f"boot/vmlinuz-{RELEASE}": b"not a real bzImage", f"boot/System.map-{RELEASE}": PLACEHOLDER.encode(),
             f"boot/config-{RELEASE}": b"CONFIG_X86_64=y\n", f"lib/modules/{RELEASE}/modules.order": b""}
    files.update({f"lib/modules/{RELEASE}/kernel/{m}": b"module " + m.encode() for m in MODULES})
    return files


@pytest.mark.parametrize("compression", ["xz", "gzip", "zstd", "none"])
def test_a_kernel_deb_and_its_dbg_give_the_dbg_vmlinux_and_every_module(vmlinux, tmp_path, compression):
    image = build_deb(tmp_path, f"linux-image-{RELEASE}-unsigned", image_files(), compression)
    dbg = build_deb(tmp_path, f"linux-image-{RELEASE}-dbg",
                    {f"usr/lib/debug/boot/vmlinux-{RELEASE}": vmlinux.read_bytes(),
                     f"usr/lib/debug/boot/System.map-{RELEASE}": b"ffffffff81000000 T f_plain\n",
                     f"usr/lib/debug/lib/modules/{RELEASE}/kernel/drivers/x/a.ko": b"debug info only"},
                    compression)
    parts = from_debs(image, dbg, cache_dir=tmp_path / "cache")
    assert parts.release == RELEASE and parts.system_map is None
    assert Path(parts.vmlinux).read_bytes() == vmlinux.read_bytes()
    assert parts.vmlinux.endswith(f"usr/lib/debug/boot/vmlinux-{RELEASE}")
    assert [name for name, _ in parts.modules] == MODULES
    assert all(Path(p).read_bytes() == b"module " + n.encode() for n, p in parts.modules)
    assert "ELF with its symbols" in parts.used and "4 modules" in parts.used
    # extracted once: a second look reuses the tree while the .deb is the same file
    marker = unpacked(dbg, tmp_path / "cache") / ".complete"
    before = marker.stat().st_mtime_ns
    from_debs(image, dbg, cache_dir=tmp_path / "cache")
    assert marker.stat().st_mtime_ns == before


def test_a_kernel_deb_without_its_dbg_is_refused_in_one_line_with_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("RELOCVERIFY_CACHE", str(tmp_path / "cache"))
    image = build_deb(tmp_path, f"linux-image-{RELEASE}-unsigned", image_files())
    code, out, err = run_main("package", image, "--db", tmp_path / "p.sqlite", "--no-progress")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "placeholder" in err and "--dbg" in err
    assert is_placeholder(unpacked(image, tmp_path / "cache") / f"boot/System.map-{RELEASE}")


def test_packages_that_do_not_go_together_are_refused(vmlinux, tmp_path):
    image = build_deb(tmp_path, f"linux-image-{RELEASE}-unsigned", image_files())
    dbg = build_deb(tmp_path, f"linux-image-{RELEASE}-dbg", {f"usr/lib/debug/boot/vmlinux-{RELEASE}":
                                                              vmlinux.read_bytes()})
    other = build_deb(tmp_path, "hello", {"usr/bin/hello": b"#!/bin/sh\n"})
    cache = tmp_path / "cache"
    with pytest.raises(InputError, match="the -dbg package: pass the linux-image package as DEB"):
        from_debs(dbg, image, cache_dir=cache)
    with pytest.raises(InputError, match="not a linux-image package"):
        from_debs(other, cache_dir=cache)
    with pytest.raises(InputError, match="does not go with"):
        from_debs(image, other, cache_dir=cache)
    code, _, err = run_main("package", "debian-6.1-cloud", "--dbg", dbg, "--db", tmp_path / "p.sqlite")
    assert code == 2 and "--dbg goes with a linux-image .deb" in err
    (tmp_path / "notes.txt").write_text("not a kernel")
    code, _, err = run_main("package", tmp_path / "notes.txt", "--db", tmp_path / "p.sqlite")
    assert code == 2 and "not a named kernel" in err


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_a_directory_is_found_in_each_of_its_shapes(vmlinux, tmp_path):
    elf = vmlinux.read_bytes()
    # /lib/modules/<release> with its build link to a tree that holds the vmlinux
    root = _tree(tmp_path / "root", {f"lib/modules/{RELEASE}/kernel/{m}": b"m" for m in MODULES}
                 | {"src/linux/vmlinux": elf})
    os.symlink(root / "src" / "linux", root / "lib" / "modules" / RELEASE / "build")
    parts = from_directory(root / "lib" / "modules" / RELEASE)
    assert parts.vmlinux == str(root / "lib" / "modules" / RELEASE / "build" / "vmlinux")
    assert [n for n, _ in parts.modules] == MODULES  # build/ is a link: not walked
    # an unpacked image package and its -dbg: the -dbg's vmlinux wins over boot/vmlinuz
    tree = _tree(tmp_path / "tree", image_files() | {f"usr/lib/debug/boot/vmlinux-{RELEASE}": elf})
    parts = from_directory(tree)
    assert parts.vmlinux == str(tree / f"usr/lib/debug/boot/vmlinux-{RELEASE}") and len(parts.modules) == 4
    # a stripped vmlinux with a real System.map: both used, and said so
    stripped = _tree(tmp_path / "stripped", {f"boot/vmlinux-{RELEASE}": strip_elf(elf),
                                             f"boot/System.map-{RELEASE}": b"ffffffff81000000 T f_plain\n",
                                             f"lib/modules/{RELEASE}/kernel/a.ko": b"m"})
    parts = from_directory(stripped)
    assert parts.system_map == str(stripped / f"boot/System.map-{RELEASE}") and "stripped ELF" in parts.used
    # only the image package: a bzImage whose System.map is the placeholder
    bare = _tree(tmp_path / "bare", image_files())
    with pytest.raises(InputError, match="placeholder.*unpack linux-image-.*-dbg there too"):
        from_directory(bare)
    # a build tree
    build = _tree(tmp_path / "build", {"vmlinux": elf, "fs/ext4/ext4.ko": b"m", "drivers/e1000/e1000.ko.xz": b"m"})
    assert [n for n, _ in from_directory(build).modules] == ["drivers/e1000/e1000.ko.xz", "fs/ext4/ext4.ko"]
    with pytest.raises(InputError, match="not a kernel directory"):
        from_directory(_tree(tmp_path / "empty", {"README": b"x"}))


def test_modules_are_ordered_as_a_named_kernels_paths_are():
    names = ["net/x-y/b.ko", "net/x/a.ko", "net/x/z.ko", "fs/a.ko"]
    assert sorted(names, key=module_order) == [str(p) for p in sorted(Path(n) for n in names)]
    assert sorted(names, key=module_order) != sorted(names)


MODULE_C = r"""
extern long f_plain(long);
long counter;
long a_function(long x) {
    long y = f_plain(x) * 3;
    if (y > 100)
        y -= 7;
    counter += y;
    return y ^ (x << 2);
}
long another(long x) { return x * 5 + counter; }
"""


def test_package_of_a_directory_verifies_every_image_and_its_jump_probes_add_up(vmlinux, tmp_path):
    modules = tmp_path / "lib" / "modules" / RELEASE / "kernel" / "drivers"
    for sub in ("x", "x-y"):
        (modules / sub).mkdir(parents=True)
        source = tmp_path / f"{sub}.c"
        source.write_text(MODULE_C)
        subprocess.run(["gcc", "-O2", "-c", "-mcmodel=kernel", "-fno-pic", "-mno-red-zone", "-fno-asynchronous-"
                        "unwind-tables", "-o", str(modules / sub / f"{sub}.ko"), str(source)], check=True)
    shutil.copy(vmlinux, tmp_path / "lib" / "modules" / RELEASE / "vmlinux")
    summary = tmp_path / "p.json"
    code, out, err = run_main("package", tmp_path / "lib" / "modules" / RELEASE, "--db", tmp_path / "p.sqlite",
                              "--jump-probes", "--summary-json", summary, "--no-progress", "--no-cache")
    assert code == 0, err
    assert out.startswith(f"using {tmp_path / 'lib' / 'modules' / RELEASE}: vmlinux ")
    doc = json.loads(summary.read_text())
    assert list(doc["images"]) == ["vmlinux", "drivers/x/x.ko", "drivers/x-y/x-y.ko"]
    assert doc["totals_add_up"] and sum(doc["totals"].values()) == sum(s["instructions"]
                                                                       for s in doc["images"].values())
    jumps = doc["jump_probe"]
    assert jumps["totals_add_up"] and jumps["images"] == 3 and jumps["eligible"] > 0
    assert jumps["instructions"] == sum(doc["totals"].values())
    for name, image in doc["images"].items():
        j = image["jump_probe"]
        assert j["eligible"] + sum(j["refused"].values()) == image["instructions"] > 0, name
        assert "unchecked" not in j  # modules have their own site tables: nothing is skipped
    assert "jump probes: " in out and "totals add up: True" in out
    # --limit-modules takes the first by path: drivers/x before drivers/x-y
    code, out, _ = run_main("package", tmp_path / "lib" / "modules" / RELEASE, "--db", tmp_path / "q.sqlite",
                            "--limit-modules", "1", "--summary-json", summary, "--no-progress", "--no-cache")
    assert code == 0 and list(json.loads(summary.read_text())["images"]) == ["vmlinux", "drivers/x/x.ko"]


def test_jump_totals_add_up_over_images_with_and_without_functions():
    one = {"eligible": 3, "refused": {"block:call-in-range": 2, "range:site:bug": 1}, "instructions": 6,
           "totals_add_up": True, "block_proofs": 4}
    two = {"eligible": 1, "refused": {"block:call-in-range": 1}, "instructions": 2, "totals_add_up": True,
           "unchecked": ["why"]}
    total = jump_totals([one, two, empty_jump_section()])
    assert total["eligible"] == 4 and total["refused"] == {"block:call-in-range": 3, "range:site:bug": 1}
    assert total["instructions"] == 8 and total["totals_add_up"] and total["images"] == 3
    assert total["block_proofs"] == 4 and total["unchecked"] == ["why"]
    assert not jump_totals([one | {"instructions": 7}])["totals_add_up"]


# --- user space -------------------------------------------------------------------------------

USER_MAIN = r"""
#include <stdlib.h>
extern void may_fail(char *p, int n);
static void release(char **p) { free(*p); }
__attribute__((noinline)) int guarded(int n) {
    char *buf __attribute__((cleanup(release))) = malloc(16);
    may_fail(buf, n);
    return buf[0] + 1;
}
int leaf(int a, int b) { int r = a * 3 + b; if (r > 100) r -= 7; return r ^ (a << 2); }
int main(int argc, char **argv) { (void)argv; return guarded(argc) + leaf(argc, 2); }
"""
USER_HELPER = "#include <stdlib.h>\nvoid may_fail(char *p, int n) { if (n > 3) abort(); p[0] = (char)n; }\n"

#: ``first`` falls through into ``second``: stripped, the two are swept as one function, and
#: nothing in the file branches to ``second`` (other objects call it through their PLT).
FALL_THROUGH = """
    .text
    .globl first
    .type first, @function
first:
    xor %eax, %eax
    add %edi, %eax
    .size first, .-first
    .globl second
    .type second, @function
second:
    add $5, %eax
    imul %esi, %eax
    ret
    .size second, .-second
"""


def _jump_rows(db: Path) -> dict[str, dict[str, int]]:
    from relocverify.store.store import Results

    rows: dict[str, dict[str, int]] = {}
    store = Results(str(db))
    try:
        images = [r[0] for r in store.db.execute("SELECT id FROM images")]
        for image in images:
            for _, function, _, bucket in store.jump_rows(image):
                per = rows.setdefault(function, {})
                per[bucket] = per.get(bucket, 0) + 1
    finally:
        store.close()
    return rows


def test_user_space_jump_probes_refuse_landing_pads_and_say_what_is_skipped(tmp_path):
    (tmp_path / "main.c").write_text(USER_MAIN)
    (tmp_path / "helper.c").write_text(USER_HELPER)
    program = tmp_path / "guarded"
    subprocess.run(["gcc", "-O2", "-fexceptions", "-o", str(program), str(tmp_path / "main.c"),
                    str(tmp_path / "helper.c")], check=True)
    summary = tmp_path / "u.json"
    code, out, err = run_main("elf", program, "--db", tmp_path / "u.sqlite", "--jump-probes", "--summary-json",
                              summary, "--no-progress", "--no-cache")
    assert code == 0, err
    j = json.loads(summary.read_text())["jump_probe"]
    assert j["totals_add_up"] and j["eligible"] > 0
    assert any("kernel sites" in u and "skipped" in u for u in j["unchecked"])
    assert "jump probes, not checked: user space" in out
    rows = _jump_rows(tmp_path / "u.sqlite")
    # guarded's cleanup is a landing pad the unwinder reaches: its frame is refused whole
    assert "range:exception-table" in rows["guarded"] and "eligible" not in rows["guarded"]
    assert rows["leaf"].get("eligible", 0) > 0 and "range:exception-table" not in rows["leaf"]


def test_user_space_jump_probes_refuse_a_range_over_an_exported_entry(tmp_path):
    (tmp_path / "y.s").write_text(FALL_THROUGH)
    library = tmp_path / "liby.so"
    subprocess.run(["gcc", "-shared", "-nostartfiles", "-nostdlib", "-o", str(library), str(tmp_path / "y.s")],
                   check=True)
    subprocess.run(["strip", str(library)], check=True)
    code, out, err = run_main("elf", library, "--db", tmp_path / "y.sqlite", "--jump-probes", "--no-progress",
                              "--no-cache")
    assert code == 0, err
    (swept, buckets), = _jump_rows(tmp_path / "y.sqlite").items()
    # xor and add each start a range over second's entry (first+4): refused; second's own add is eligible
    assert swept.startswith("sub_") and buckets["range:branch-target-inside"] == 2 and buckets["eligible"] == 1


# --- the real Debian 6.1 cloud packages -----------------------------------------------------

LIMITS = ["--limit", "300", "--limit-modules", "8"]


@pytest.fixture(scope="module")
def by_name(tmp_path_factory):
    """``package debian-6.1-cloud`` on the first 300 functions of each of the vmlinux and 8 modules."""
    work = tmp_path_factory.mktemp("by-name")
    code, out, err = run_main("package", "debian-6.1-cloud", "--db", work / "n.sqlite", *LIMITS,
                              "--summary-json", work / "n.json", "--no-progress")
    assert code == 0, err
    return json.loads((work / "n.json").read_text())


def _debs() -> tuple[Path, Path]:
    from relocverify.environment import default_cache_dir
    from relocverify.image.fetch import fetch

    kernel = fetch("debian-6.1-cloud")
    spec = KERNELS["debian-6.1-cloud"]
    names = {n.split("_", 1)[0]: n for n in kernel.sha256s if n.endswith(".deb")}
    cache = Path(default_cache_dir())
    return cache / names[spec.unsigned], cache / names[spec.dbg]


def _same_counts(by_name: dict, other: dict) -> None:
    assert list(other["images"]) == list(by_name["images"]) and len(other["images"]) == 9
    for name, summary in by_name["images"].items():
        assert other["images"][name]["by_verdict"] == summary["by_verdict"], name
        assert other["images"][name]["image"]["identity"] == summary["image"]["identity"], name
    assert other["totals"] == by_name["totals"] and other["totals_add_up"] and by_name["totals_add_up"]


@pytest.mark.slow
def test_the_deb_and_its_dbg_give_the_counts_of_the_named_package(by_name, tmp_path):
    image, dbg = _debs()
    code, out, err = run_main("package", image, "--dbg", dbg, "--db", tmp_path / "d.sqlite", *LIMITS,
                              "--summary-json", tmp_path / "d.json", "--no-progress")
    assert code == 0, err
    assert out.startswith(f"using {image.name}: vmlinux ") and "(ELF with its symbols)" in out
    _same_counts(by_name, json.loads((tmp_path / "d.json").read_text()))
    # without --dbg, the -dbg package of the same name and version is found (beside it, or in the cache)
    code, out, err = run_main("package", image, "--db", tmp_path / "e.sqlite", *LIMITS,
                              "--summary-json", tmp_path / "e.json", "--no-progress")
    assert code == 0 and "(ELF with its symbols)" in out, err
    _same_counts(by_name, json.loads((tmp_path / "e.json").read_text()))


@pytest.mark.slow
def test_a_tree_unpacked_from_the_debs_gives_the_counts_of_the_named_package(by_name, tmp_path):
    from relocverify.image.debian import extract

    image, dbg = _debs()
    tree = tmp_path / "tree"
    extract(image, lambda path: True, tree)
    extract(dbg, lambda path: path.parent.as_posix() == "usr/lib/debug/boot", tree, lambda found: len(found) >= 2)
    for source in (tree, tree / "lib" / "modules" / KERNELS["debian-6.1-cloud"].release):
        code, out, err = run_main("package", source, "--db", tmp_path / f"{source.name}.sqlite", *LIMITS,
                                  "--summary-json", tmp_path / "t.json", "--no-progress")
        assert code == 0, err
        assert f"vmlinux {tree}/usr/lib/debug/boot/vmlinux-" in out and "1,121 modules" in out
        _same_counts(by_name, json.loads((tmp_path / "t.json").read_text()))


@pytest.mark.slow
def test_jump_probes_on_a_real_module_add_up_and_read_its_site_tables(tmp_path):
    from relocverify.image.fetch import extract_modules, fetch

    kernel = fetch("debian-6.1-cloud")
    modules = extract_modules("debian-6.1-cloud", ["vfat.ko", "tcp_bbr.ko"])
    code, out, err = run_main("module", *modules, "--kernel", kernel.vmlinux, "--db", tmp_path / "m.sqlite",
                              "--jump-probes", "--summary-json", tmp_path / "m.json", "--no-progress")
    assert code == 0, err
    doc = json.loads((tmp_path / "m.json").read_text())
    j = doc["jump_probe"]
    assert j["totals_add_up"] and j["images"] == 2 and 0 < j["eligible"] < j["instructions"]
    assert j["instructions"] == sum(doc["totals"].values())
    assert any(k.startswith("range:site:") for k in j["refused"])  # the module's own site tables
    assert "jump probes: " in out

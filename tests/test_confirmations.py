"""The audit's summary and report carry what ``confirm --audit`` found on the running kernel
(``store.confirmations``: ``STORE.confirm.json`` beside the store, attached by image identity)."""

from __future__ import annotations

import json
import subprocess

from relocverify.store import confirmations

VEX = "vpcmpeqb via check_jmp_cond"


def _audit(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([".venv/bin/relocverify", "audit", "--tracer", "uprobes@6.1", str(tmp_path / "t"), "--db",
                           str(tmp_path / "t.sqlite"), "--no-progress", "--cache-dir", str(tmp_path / "cache"),
                           *extra], capture_output=True, text=True)


def _program(tmp_path) -> None:
    source = tmp_path / "t.c"
    source.write_text('void f(void){ __asm__ volatile("vpcmpeqb (%rdi), %ymm0, %ymm0\\n\\tvzeroupper"); }\n'
                      "int main(void){ return 0; }\n")
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "t"), str(source)], check=True)


def _confirm_record(group: str, outcome: str) -> dict:
    """One group as ``confirm.groups.GroupResult.as_json`` writes it."""
    return {"tracer": "uprobes@6.1", "bucket": "tracer-wrong", "group": group, "count": 1, "outcome": outcome,
            "outcomes": {outcome: 1}, "note": "in a user program",
            "sites": [{"where": "__strlen_avx2+0x19", "outcome": outcome,
                       "evidence": "the trigger's output differs: strlen sums 0 instead of 45150"}]}


def test_a_confirmed_group_is_labelled_in_the_summary_text_json_and_report(tmp_path):
    from relocverify.report.tracers import last_audit, tracer_html

    _program(tmp_path)
    first = _audit(tmp_path, "--json")
    summary = json.loads(first.stdout)
    groups = summary["tracers"]["uprobes@6.1"]["groups"]["tracer-wrong"]
    vex = next(g["group"] for g in groups if g["group"].startswith(VEX))
    other = next(g["group"] for g in groups if not g["group"].startswith(VEX))
    assert all("confirmed" not in g for g in groups)  # nothing confirmed yet
    db = str(tmp_path / "t.sqlite")
    confirmations.save(db, summary["image"]["identity"], "6.1.187", "QEMU TCG",
                       [_confirm_record(vex, "reproduced"), _confirm_record(other, "not-executed")])

    doc = json.loads(_audit(tmp_path, "--json").stdout)
    by_name = {g["group"]: g for g in doc["tracers"]["uprobes@6.1"]["groups"]["tracer-wrong"]}
    assert by_name[vex]["confirmed"]["label"] == "tracer-wrong (reproduced on 6.1.187, QEMU TCG)"
    assert by_name[vex]["confirmed"]["sites"][0]["site"] == "__strlen_avx2+0x19"
    assert by_name[other]["confirmed"]["label"] == "tracer-wrong (not executed on 6.1.187, QEMU TCG)"

    text = _audit(tmp_path).stdout
    assert f"tracer-wrong (reproduced on 6.1.187, QEMU TCG) uprobes@6.1: 1 x {vex}" in text
    assert "on the running kernel: __strlen_avx2+0x19 reproduced" in text

    html = tracer_html(last_audit(db))
    assert '<span class="confirmed">tracer-wrong (reproduced on 6.1.187, QEMU TCG)</span>' in html
    assert "strlen sums 0 instead of 45150" in html


def test_confirmations_of_another_image_or_an_old_file_are_attached_to_nothing(tmp_path):
    summary = {"image": {"identity": "abc"}, "tracers": {"uprobes@6.1": {"groups": {"tracer-wrong": [
        {"group": "g", "count": 1}]}}}}
    confirmations.save(str(tmp_path / "s"), "another", "6.1.187", "QEMU TCG", [_confirm_record("g", "reproduced")])
    attached = confirmations.attach(json.loads(json.dumps(summary)), confirmations.load(str(tmp_path / "s")))
    assert "confirmed" not in attached["tracers"]["uprobes@6.1"]["groups"]["tracer-wrong"][0]
    (tmp_path / "s.confirm.json").write_text(json.dumps([_confirm_record("g", "reproduced")]))  # the old bare list
    assert confirmations.load(str(tmp_path / "s")) is None


def test_controls_are_attached_to_their_tracer():
    summary = {"image": {"identity": "abc"}, "tracers": {"kprobes@6.1": {"groups": {}}}}
    controls = {"tracer": "kprobes@6.1", "bucket": "agree", "group": "controls", "count": 50, "outcome":
                "not-reproduced", "outcomes": {"not-reproduced": 50}, "note": "", "sites": []}
    doc = {"format": confirmations.FORMAT, "image": "abc", "kernel": "6.1.187", "accelerator": "QEMU TCG",
           "groups": [controls]}
    c = confirmations.attach(summary, doc)["tracers"]["kprobes@6.1"]["controls"]
    assert c["count"] == 50 and c["outcomes"] == {"not-reproduced": 50}
    assert c["label"] == "agree (not reproduced on 6.1.187, QEMU TCG)"


def test_the_kernel_version_is_read_from_the_banner_of_the_real_kernel():
    """Debian 6.1.187's banner names gcc's Debian version first (12.2.0-14): the kernel's is the last."""
    from relocverify.confirm.groups import kernel_version
    from relocverify.confirm.guest import Guest
    from relocverify.image.fetch import fetch

    kernel = fetch("debian-6.1-cloud")
    guest = Guest("debian-6.1-cloud", kernel.release, "", "", "", kernel.vmlinux, kernel.system_map, (), (), ())
    assert kernel_version(guest) == "6.1.187"

"""Progress goes to a terminal as a bar and anywhere else as plain lines: one rule for every command
(``schedule.progress.Progress``), the audit's included (it once wrote a carriage-return line per step into
a log file: a 10 KB line)."""

from __future__ import annotations

import io

from relocverify.cli.audit import _progress


def test_the_audit_writes_no_carriage_return_into_a_file():
    stream = io.StringIO()
    say = _progress(stream)
    for done in range(0, 10_001, 100):
        say("survey", done, 10_000)
    for done in range(1, 4):
        say("modules", done, 3)
    say.close()
    text = stream.getvalue()
    assert "\r" not in text
    assert text.count("\n") == 2 and "audit: survey: 10,000 instructions" in text and "audit: modules: 3" in text

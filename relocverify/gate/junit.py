"""The gate's result as JUnit XML: a test suite per unit, a failing test
case per differing instruction the baseline does not accept."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from ..text import printable, printable_lines



def junit_xml(report) -> str:
    root = ET.Element("testsuites", name=printable(f"relocverify gate {report.tested}"))
    new = {id(f) for f in report.new_findings}
    for unit in report.units:
        mine = [f for f in report.findings if f.unit == unit.name and id(f) in new]
        suite = ET.SubElement(root, "testsuite", name=printable(unit.name), tests=str(max(1, len(mine))),
                              failures=str(len(mine)), errors="0")
        for f in mine:
            case = ET.SubElement(suite, "testcase", classname=printable(f"{unit.name}.{f.klass}"),
                                 name=f"{f.address:#x} {f.raw.hex(' ')}")
            failure = ET.SubElement(case, "failure", message=printable(f"{f.klass}: {f.tested} differs"),
                                    type=printable(f.klass))
            failure.text = printable_lines("\n".join(report.finding_lines(f)))
        if not mine:
            ET.SubElement(suite, "testcase", classname=printable(unit.name),
                          name=f"{unit.instructions} instructions agree or are accepted")
        if unit.digest_changed:
            case = ET.SubElement(suite, "testcase", classname=printable(unit.name), name="baseline digest")
            ET.SubElement(case, "failure", message="the tested decoder's answers changed since the baseline")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"

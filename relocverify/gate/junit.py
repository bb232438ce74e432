"""The gate's result as JUnit XML: a test suite per unit, a failing test
case per differing instruction the baseline does not accept."""

from __future__ import annotations

from xml.etree import ElementTree as ET


def junit_xml(report) -> str:
    root = ET.Element("testsuites", name=f"relocverify gate {report.tested}")
    new = {id(f) for f in report.new_findings}
    for unit in report.units:
        mine = [f for f in report.findings if f.unit == unit.name and id(f) in new]
        suite = ET.SubElement(root, "testsuite", name=unit.name, tests=str(max(1, len(mine))),
                              failures=str(len(mine)), errors="0")
        for f in mine:
            case = ET.SubElement(suite, "testcase", classname=f"{unit.name}.{f.klass}",
                                 name=f"{f.address:#x} {f.raw.hex(' ')}")
            failure = ET.SubElement(case, "failure", message=f"{f.klass}: {f.tested} differs", type=f.klass)
            failure.text = "\n".join(report.finding_lines(f))
        if not mine:
            ET.SubElement(suite, "testcase", classname=unit.name,
                          name=f"{unit.instructions} instructions agree or are accepted")
        if unit.digest_changed:
            case = ET.SubElement(suite, "testcase", classname=unit.name, name="baseline digest")
            ET.SubElement(case, "failure", message="the tested decoder's answers changed since the baseline")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"

#!/usr/bin/python3
"""Prints how many tests ctest skipped and why, from its JUnit report (ctest --output-junit).

The reason is the test's own word: the line after GoogleTest's "Skipped" (GTEST_SKIP's
message), or a "SKIP: ..." / "skipped: ..." line (the scripts that exit 77). Tests grouped by reason, most
frequent first, so that "42 skipped: ../shared is missing" reads as one line.

Usage: skip_summary.py REPORT.xml [LABEL]
"""
import collections
import re
import sys
import xml.etree.ElementTree as ET


def reason(case):
    out = case.findtext("system-out") or ""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if re.search(r": Skipped$", line) and i + 1 < len(lines) and lines[i + 1].strip():
            return lines[i + 1].strip()
        m = re.match(r"(?:SKIP|skipped): (.*)", line, re.I)
        if m:
            return m.group(1).strip()
    skipped = case.find("skipped")
    return (skipped.get("message") if skipped is not None else None) or "no reason given"


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else "tests"
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    by_reason = collections.defaultdict(list)
    total = 0
    for case in cases:
        total += 1
        if case.get("status") == "notrun" or case.find("skipped") is not None:
            by_reason[reason(case)].append(case.get("name", "?").split("  #")[0])
    n = sum(len(v) for v in by_reason.values())
    print(f"{label}: {n} of {total} skipped" + (":" if n else ""))
    for why, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        example = names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")
        print(f"  {len(names)} x {why} ({example})")


if __name__ == "__main__":
    main()

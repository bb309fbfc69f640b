#!/usr/bin/env python3
"""Reads the ginkgo JSON report of a scripts/conformance run and tells what it found.

    conformance_report.py summary REPORT ALL_SPECS --out MD --passing LIST [--log LOG]
                          [--serial] [--meta K=V]...
        writes CONFORMANCE.md (totals of the release's [Conformance] specs, per SIG, each
        failure with its first line and what it waits on) and the list of the specs that
        passed, one full name a line; a hand-written block between the NOTES markers of an
        existing MD is carried over
    conformance_report.py check REPORT EXPECTED [--log LOG]
        the specs of EXPECTED (one full name a line) that did not pass; exit 1 if any

REPORT is ginkgo's --json-report (a list of suite reports); when it has no specs (ginkgo
writes none once a parallel process has disappeared) LOG, the `ginkgo -v` output, is read
instead, and a spec of the run with no result there counts as failed ("lost"). ALL_SPECS is
`e2e.test --list-tests` output, from which the release's [Conformance] specs are counted. A spec's full
name is ginkgo's: the texts of its containers and its own, joined by spaces.

What a failure waits on is decided by the rules in scripts/upstream/conformance_causes.tsv
(the first that matches the spec's name or failure message): keep them there, so every run
groups failures the same way.
"""

import argparse
import collections
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CAUSES = os.path.join(HERE, "conformance_causes.tsv")
NOTES_BEGIN = "<!-- notes: kept by scripts/conformance across runs -->"
NOTES_END = "<!-- notes end -->"
FAILED_STATES = {"failed", "panicked", "interrupted", "aborted", "timedout", "lost"}
# What ginkgo prints when a parallel process exits before reporting (a spec crashed it, e.g.
# a Failf in a goroutine of its own): the specs it was running have no result anywhere.
DISAPPEARED = re.compile(r"parallel process disappeared|timed out waiting for all parallel procs")
LOST = {"State": "lost", "Failure": {"Message": "no result: its ginkgo process disappeared "
                                                "before reporting (the spec crashed it)"}}


def spec_name(spec):
    texts = list(spec.get("ContainerHierarchyTexts") or []) + [spec.get("LeafNodeText", "")]
    return " ".join(t for t in texts if t)


def load_suites(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def load_specs(path, log=None):
    """The It specs that ran, by full name: from ginkgo's JSON report, else (ginkgo writes
    none when a parallel process disappears) from its verbose output."""
    specs = {}
    for suite in load_suites(path):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            specs[spec_name(spec)] = spec
    if not any(s.get("State") != "skipped" for s in specs.values()) and log:
        specs = specs_from_log(log)
    return specs


# `ginkgo -v` prints each spec that ran as a block between lines of dashes:
#   • [FAILED] [2.1 seconds]          (a pass is "• [2.1 seconds]")
#   <containers> [It] <leaf> [label, label]
#   <file:line>
#     Timeline >> ... << Timeline     (failures)
#     [FAILED] <message>
#     In [It] at: <file:line> @ <time>
HEADER = re.compile(r"^• (?:\[([A-Z]+)\] )?\[([0-9.]+) seconds\]$")
NODE = re.compile(r" \[(?:It|BeforeEach|AfterEach|JustBeforeEach|JustAfterEach|DeferCleanup \(Each\))\] ")
LABELS = re.compile(r" \[[^\[\]]*, [^\[\]]*\]$")


def specs_from_log(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    specs = {}
    i = 0
    while i < len(lines):
        m = HEADER.match(lines[i])
        if not m or i + 1 >= len(lines):
            i += 1
            continue
        name = LABELS.sub("", NODE.sub(" ", lines[i + 1]))
        j = i + 2
        while j < len(lines) and not lines[j].startswith("-" * 30):
            j += 1
        block = lines[i + 2:j]
        state = (m.group(1) or "PASSED").lower()
        message, location = "", {}
        for k, line in enumerate(block):
            fm = re.match(r"^  \[(FAILED|PANICKED|TIMEDOUT|INTERRUPTED)\] (?!in \[)(.*)$", line)
            if fm:
                # The last such line is the summary; its message runs to "In [..] at:".
                message = "\n".join([fm.group(2)] + [
                    l.strip() for l in block[k + 1:] if not l.startswith("  In [")][:40])
                rest = [l for l in block[k + 1:] if l.startswith("  In [")]
                if rest:
                    lm = re.search(r"at: (\S+):(\d+)", rest[0])
                    if lm:
                        location = {"FileName": lm.group(1), "LineNumber": int(lm.group(2))}
        specs[name] = {
            "State": state,
            "RunTime": float(m.group(2)) * 1e9,
            "Failure": {"Message": message, "Location": location} if state != "passed" else None,
            "CapturedGinkgoWriterOutput": "\n".join(block),
        }
        i = j
    return specs


def process_disappeared(log):
    if not log:
        return False
    with open(log, encoding="utf-8", errors="replace") as f:
        return bool(DISAPPEARED.search(f.read()))


def suite_failures(path):
    """Failures outside any It (the suite's setup): they fail every spec."""
    suites = load_suites(path)
    out = []
    for suite in suites:
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It" and spec.get("State") in FAILED_STATES:
                out.append((spec.get("LeafNodeType"), first_line(spec)))
    return out


def all_conformance(path):
    names = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if "[Conformance]" not in line:
                continue
            # --list-tests prints "<file>:<line>: <full name>"
            m = re.match(r"^\S+:\d+: (.*)$", line)
            names.append(m.group(1) if m else line.strip())
    return names


def first_line(spec):
    failure = spec.get("Failure") or {}
    message = (failure.get("Message") or "").strip()
    if not message and spec.get("State") == "interrupted":
        message = "interrupted (the run's --timeout, or Ctrl-C)"
    if not message:
        message = spec.get("State", "")
    line = message.splitlines()[0] if message else ""
    return line if len(line) <= 300 else line[:297] + "..."


def failure_text(spec, output=False):
    """The failure's message and location; with output, also what the spec logged."""
    failure = spec.get("Failure") or {}
    parts = [failure.get("Message") or "", failure.get("ForwardedPanic") or ""]
    loc = failure.get("Location") or {}
    parts.append("%s:%s" % (loc.get("FileName", ""), loc.get("LineNumber", "")))
    if spec.get("State") == "panicked":
        parts.append("PANICKED")
    if output:
        parts.append(spec.get("CapturedGinkgoWriterOutput") or "")
        parts.append(spec.get("CapturedStdOutErr") or "")
    return "\n".join(parts)


def load_causes():
    rules = []
    with open(CAUSES, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 4:
                sys.exit(f"{CAUSES}:{number}: want 4 tab-separated fields (where, pattern, kind, cause)")
            where, pattern, kind, cause = fields
            if where not in ("name", "message", "output"):
                sys.exit(f"{CAUSES}:{number}: 'where' is name, message or output, not {where!r}")
            rules.append((where, re.compile(pattern, re.S), kind, cause))
    return rules


def classify(rules, name, spec):
    subjects = {"name": name, "message": failure_text(spec), "output": failure_text(spec, True)}
    for where, pattern, kind, cause in rules:
        subject = subjects[where]
        m = pattern.search(subject)
        if m:
            # A cause may quote what the pattern caught: {1}, {2}...
            for i, group in enumerate(m.groups(), 1):
                cause = cause.replace("{%d}" % i, group or "")
            return kind, cause
    return "unknown", "not classified yet (conformance_causes.tsv has no rule for it)"


def sig_of(name):
    m = re.match(r"^\[(sig-[a-z-]+)\]", name)
    return m.group(1) if m else "(none)"


def md_escape(text):
    return text.replace("|", "\\|").replace("`", "'")


def summary(args):
    specs = load_specs(args.report, args.log)
    conformance = all_conformance(args.all_specs)
    rules = load_causes()
    meta = dict(kv.split("=", 1) for kv in args.meta)

    lost = process_disappeared(args.log)
    rows = []  # (name, sig, outcome, spec)
    for name in conformance:
        spec = specs.get(name)
        if spec is None and lost and (args.serial or "[Serial]" not in name):
            spec = LOST
        state = spec.get("State") if spec else None
        if state == "passed":
            outcome = "passed"
        elif state in FAILED_STATES:
            outcome = "failed"
        else:
            outcome = "skipped"
        rows.append((name, sig_of(name), outcome, spec))

    count = collections.Counter(outcome for _, _, outcome, _ in rows)
    serial = [r for r in rows if "[Serial]" in r[0]]
    serial_run = any(r[3] and r[3].get("State") != "skipped" for r in serial)
    per_sig = collections.defaultdict(collections.Counter)
    for name, sig, outcome, _ in rows:
        per_sig[sig][outcome] += 1
        per_sig[sig]["total"] += 1

    failures = []
    for name, sig, outcome, spec in rows:
        if outcome == "failed":
            kind, cause = classify(rules, name, spec)
            failures.append((name, sig, kind, cause, first_line(spec), spec))
    by_cause = collections.Counter((kind, cause) for _, _, kind, cause, _, _ in failures)

    notes = ""
    if os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            old = f.read()
        if NOTES_BEGIN in old and NOTES_END in old:
            notes = old.split(NOTES_BEGIN, 1)[1].split(NOTES_END, 1)[0].strip("\n")

    out = []
    w = out.append
    w("# Conformance: Kubernetes %s's [Conformance] specs against the embedded default" % meta.get("release", "?"))
    w("")
    w("Written by `scripts/conformance` (do not edit by hand, except the notes at the end): "
      "upstream's own `e2e.test` of the release core-cluster serves, built by "
      "`scripts/upstream.sh`, runs the release's `[Conformance]` specs with ginkgo in "
      "parallel against `ccm` (the embedded default: API server, controllers, fake cloud, "
      "3 simulated nodes). `scripts/conformance.passing` lists the specs that passed; "
      "`scripts/conformance --check` runs only those and fails when one stops passing (CI).")
    w("")
    w("| run | |")
    w("| --- | --- |")
    for key, label in (("date", "date"), ("tree", "tree"), ("ccm", "ccm"), ("e2e", "e2e.test"),
                       ("procs", "ginkgo processes"), ("wall", "wall time")):
        if key in meta:
            w("| %s | %s |" % (label, md_escape(meta[key])))
    w("")
    w("## Totals")
    w("")
    total = len(rows)
    w("| of the release's %d [Conformance] specs | count |" % total)
    w("| --- | ---: |")
    w("| passed | %d |" % count["passed"])
    w("| failed | %d |" % count["failed"])
    skipped_serial = sum(1 for r in serial if r[2] == "skipped")
    w("| skipped | %d |" % count["skipped"])
    w("")
    if serial and not serial_run:
        w("Skipped: the %d `[Serial]` specs (they need the cluster to themselves; "
          "`scripts/conformance --serial` runs them one at a time after the parallel ones)"
          % skipped_serial + (", and %d others" % (count["skipped"] - skipped_serial)
                              if count["skipped"] > skipped_serial else "") + ".")
        w("")
    for kind, line in suite_failures(args.report):
        w("The suite's %s failed: `%s`." % (kind, md_escape(line)))
        w("")
    w("## Per SIG")
    w("")
    w("| SIG | specs | passed | failed | skipped |")
    w("| --- | ---: | ---: | ---: | ---: |")
    for sig in sorted(per_sig):
        c = per_sig[sig]
        w("| %s | %d | %d | %d | %d |" % (sig, c["total"], c["passed"], c["failed"], c["skipped"]))
    w("| **all** | **%d** | **%d** | **%d** | **%d** |" % (total, count["passed"], count["failed"], count["skipped"]))
    w("")
    w("## Failures by what they wait on")
    w("")
    w("Each failure's kind and cause come from the first rule of "
      "`scripts/upstream/conformance_causes.tsv` that matches it.")
    w("")
    w("| kind | cause | specs |")
    w("| --- | --- | ---: |")
    for (kind, cause), n in sorted(by_cause.items(), key=lambda kv: (-kv[1], kv[0])):
        w("| %s | %s | %d |" % (kind, md_escape(cause), n))
    w("")
    w("## Failures")
    w("")
    for sig in sorted(per_sig):
        mine = [f for f in failures if f[1] == sig]
        if not mine:
            continue
        w("### %s (%d)" % (sig, len(mine)))
        w("")
        for name, _, kind, cause, line, spec in sorted(mine):
            seconds = (spec.get("RunTime") or 0) / 1e9
            w("- %s  " % md_escape(name))
            w("  `%s` (%.0f s)  " % (md_escape(line), seconds))
            w("  *%s*: %s" % (kind, md_escape(cause)))
        w("")
    w("## Notes")
    w("")
    w(NOTES_BEGIN)
    w(notes if notes else "(none yet)")
    w(NOTES_END)
    w("")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out))

    passed = sorted(name for name, _, outcome, _ in rows if outcome == "passed")
    with open(args.passing, "w", encoding="utf-8") as f:
        f.write("".join(n + "\n" for n in passed))

    print("%d passed, %d failed, %d skipped (of %d [Conformance] specs)"
          % (count["passed"], count["failed"], count["skipped"], total))


def check(args):
    specs = load_specs(args.report, args.log)
    with open(args.expected, encoding="utf-8") as f:
        expected = [line.rstrip("\n") for line in f if line.strip()]
    lost = process_disappeared(args.log)
    failed = []
    for name in expected:
        spec = specs.get(name) or (LOST if lost else None)
        if spec is None or spec.get("State") != "passed":
            state = spec.get("State") if spec else "not run (no spec of that name: renamed upstream?)"
            failed.append((name, state, first_line(spec) if spec else ""))
    for kind, line in suite_failures(args.report):
        print("the suite's %s failed: %s" % (kind, line))
    for name, state, line in failed:
        print("NOT PASSING (%s): %s" % (state, name))
        if line:
            print("    %s" % line)
    print("%d passed, %d failed" % (len(expected) - len(failed), len(failed)))
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary")
    s.add_argument("report")
    s.add_argument("all_specs")
    s.add_argument("--out", required=True)
    s.add_argument("--passing", required=True)
    s.add_argument("--meta", action="append", default=[])
    s.add_argument("--log", help="ginkgo -v output, read when the JSON report has no specs")
    s.add_argument("--serial", action="store_true", help="the [Serial] specs were run too")
    c = sub.add_parser("check")
    c.add_argument("report")
    c.add_argument("expected")
    c.add_argument("--log", help="ginkgo -v output, read when the JSON report has no specs")
    args = parser.parse_args()
    if args.command == "summary":
        summary(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())

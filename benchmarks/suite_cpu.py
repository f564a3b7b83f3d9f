"""Where the test suite's time goes: how its files spread over the parallel workers, and the CPU
of the processes its tests start (docs/benchmarks.md, "The test suite").

    # the spread: a verbose run with a JUnit report (in a fresh clone, as CI runs it)
    CI=true PYTEST_ADDOPTS="-v --junitxml=/tmp/suite.xml" bash .ci/run > /tmp/suite.log 2>&1
    python benchmarks/suite_cpu.py spread /tmp/suite.log /tmp/suite.xml

    # the CPU: every Python process of a venv records its CPU at exit while the suite runs
    python benchmarks/suite_cpu.py record .venv /tmp/procs.jsonl
    .venv/bin/pytest -p no:cacheprovider
    python benchmarks/suite_cpu.py cpu /tmp/procs.jsonl
    python benchmarks/suite_cpu.py forget .venv

Recorded at exit: processes killed by SIGKILL, or started with -S (supervisors, the spawner),
are not counted; the workers' own CPU is counted once, when they end.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import sysconfig
import xml.etree.ElementTree as ElementTree
from pathlib import Path

RECORDER = """import atexit, json, os, sys


def _record_cpu(path={path!r}):
    times = os.times()
    line = {{
        "argv": sys.orig_argv[:6],
        "cpu_s": times.user + times.system,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0],
    }}
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\\n")


atexit.register(_record_cpu)
"""


def largest(seconds: dict[str, float], count: int = 15) -> list[tuple[str, float]]:
    return sorted(seconds.items(), key=lambda item: -item[1])[:count]


def spread(log: Path, junit: Path) -> None:
    """Each worker's files and the sum of their tests' durations, and the slowest files."""
    by_file: collections.defaultdict[str, float] = collections.defaultdict(float)
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = [part for part in case.get("classname", "").split(".") if part[:1].islower()]
        by_file["/".join(module) + ".py"] += float(case.get("time") or 0)
    workers: dict[str, list[str]] = collections.defaultdict(list)
    for line in log.read_text(errors="replace").splitlines():
        found = re.match(r"\[(gw\d+)\] \[\s*\d+%\] \w+ (\S+?)::", line)
        if found and found[2] not in workers[found[1]]:
            workers[found[1]].append(found[2])
    print(f"{sum(by_file.values()):.0f} s of tests in {len(by_file)} files")
    for worker, files in sorted(workers.items()):
        seconds = sum(by_file[name] for name in files)
        print(f"{worker}: {len(files)} files, {seconds:.0f} s; its last: {', '.join(files[-2:])}")
    print("slowest files:")
    for name, seconds in largest(by_file):
        print(f"  {seconds:7.1f} s  {name}")


def kind_of(argv: list[str]) -> str:
    """A process's kind: the gpumux command, else the script or module it ran."""
    named = [at for at, word in enumerate(argv) if word.rsplit("/", 1)[-1] == "gpumux"]
    if named:
        rest = argv[named[0] + 1 :]
        return "gpumux " + (rest[0] if rest and not rest[0].startswith("-") else "(options)")
    scripts = [word.rsplit("/", 1)[-1] for word in argv[1:] if word.endswith(".py")]
    if scripts:
        return scripts[0]
    return " ".join(argv[1:3])[:50]


def cpu(records: Path) -> None:
    """CPU by kind of process and by the test file that started it."""
    kinds: collections.defaultdict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[str] = collections.Counter()
    files: collections.defaultdict[str, float] = collections.defaultdict(float)
    for line in records.read_text().splitlines():
        record = json.loads(line)
        kind = kind_of(record["argv"])
        kinds[kind] += record["cpu_s"]
        counts[kind] += 1
        files[record["test"] or "(no test: a worker, or a wider fixture's)"] += record["cpu_s"]
    print(f"{sum(counts.values())} processes, {sum(kinds.values()):.0f} s of CPU")
    print("by kind:")
    for kind, seconds in largest(kinds):
        print(f"  {seconds:7.1f} s  {counts[kind]:5d} x {seconds / counts[kind]:5.2f} s  {kind}")
    print("by the test file that started it:")
    for name, seconds in largest(files):
        print(f"  {seconds:7.1f} s  {name}")


def recorder_of(venv: Path) -> Path:
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    return Path(purelib) / "sitecustomize.py"


def record(venv: Path, out: Path) -> None:
    """Install the recorder in the venv's site-packages, appending to `out`."""
    recorder = recorder_of(venv)
    if recorder.exists() and "_record_cpu" not in recorder.read_text():
        sys.exit(f"{recorder} exists and is not this recorder: left as it is")
    recorder.write_text(RECORDER.format(path=str(out.resolve())))
    print(f"recording to {out} from {recorder}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    spread_args = commands.add_parser("spread", help="the workers' share of a verbose run")
    spread_args.add_argument("log", type=Path)
    spread_args.add_argument("junit", type=Path)
    cpu_args = commands.add_parser("cpu", help="the CPU of the recorded processes")
    cpu_args.add_argument("records", type=Path)
    record_args = commands.add_parser("record", help="record a venv's processes' CPU at exit")
    record_args.add_argument("venv", type=Path)
    record_args.add_argument("out", type=Path)
    forget_args = commands.add_parser("forget", help="remove the recorder from a venv")
    forget_args.add_argument("venv", type=Path)
    args = parser.parse_args()
    if args.command == "spread":
        spread(args.log, args.junit)
    elif args.command == "cpu":
        cpu(args.records)
    elif args.command == "record":
        record(args.venv, args.out)
    else:
        recorder_of(args.venv).unlink(missing_ok=True)
        print(f"removed {recorder_of(args.venv)}")


if __name__ == "__main__":
    main()

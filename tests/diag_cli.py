"""Shared by the `check --diagnose` tests: run the CLI and read its diagnosis lines."""
import os
import re
import subprocess

BUILD = os.environ.get("FA_BUILD", "build")
CLI = os.path.join(BUILD, "flashattn")


def check_diagnose(args):
    """`flashattn check --diagnose ARGS`: (exit status, the `diagnosis:` lines, stdout); any status
    other than pass (0) or fail (1) fails the test."""
    r = subprocess.run([CLI, "check", "--diagnose", *args], capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("diagnosis: ")]
    return r.returncode, lines, r.stdout


def first_id(lines):
    """The id of the first (best) diagnosis line."""
    return re.match(r"diagnosis: (\S+)", lines[0]).group(1)


def seq_table(out):
    """The per-sequence relative RMS errors of the report's `error by sequence` line."""
    line = next(ln for ln in out.splitlines() if ln.startswith("error by sequence"))
    return [float(x.split(":")[1]) for x in line.split(":", 1)[1].split()]

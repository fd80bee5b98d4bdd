"""Run every fuzz target for N seconds each and print one table: executions, exec/s, libFuzzer's
coverage (cov: and ft:), corpus entries and crashes.

    python benchmarks/fuzz.py --seconds 600 [--only json,config,...] [--jobs 2]

Targets: the libFuzzer harnesses of the C core (c_core/fuzz/, built with clang into build/fuzz by
`meson setup build/fuzz -Dpython=false -Dfuzz=true --native-file toolchains/clang.ini`, here when
missing), the converter's atheris targets (benchmarks/fuzz_convert.py) and the remote surfaces'
(benchmarks/fuzz_remote.py: serve-experts' and orchestrate's requests through atheris, and an HTTP/2
grammar against both servers running), all run with the same libFuzzer flags. Each works on build/fuzz-corpus/<target>/ (new inputs land there; the committed
seed corpus is read beside it) and writes crash, timeout and out-of-memory inputs to
build/fuzz-artifacts/<target>/. A crash stops libFuzzer; the target is restarted for the rest of
its time, so every crash in the time is counted. The table is written to benchmarks/results/fuzz.md
too. A crash found becomes a regression input: tests/fuzz_regressions/<target>/ (Python targets,
replayed by tests/test_fuzz_regressions.py) or c_core/fuzz/corpus/<target>/ (C targets).
"""

import argparse
import datetime
import platform
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
C_TARGETS = ("json", "model", "tokenize")
PY_TARGETS = ("config", "safetensors", "gguf")
REMOTE_TARGETS = ("experts", "orchestrate", "http2")   # benchmarks/fuzz_remote.py
C_SOURCES, C_BUILD = ROOT / "c_core" / "fuzz", ROOT / "build" / "fuzz"
ARTIFACTS, WORK = ROOT / "build" / "fuzz-artifacts", ROOT / "build" / "fuzz-corpus"
STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/", re.M)
ARTIFACT = re.compile(r"Test unit written to (\S+)")
MAX_RESTARTS = 20


def build_c():
    """None when the C harnesses are built (building them if needed), else why they are not."""
    if not C_SOURCES.is_dir():
        return "C sources missing (no c_core/fuzz/)"
    if all((C_BUILD / "c_core" / "fuzz" / f"fuzz_{t}").exists() for t in C_TARGETS):
        return None
    steps = [] if (C_BUILD / "build.ninja").exists() else [
        ["meson", "setup", str(C_BUILD), "-Dpython=false", "-Dfuzz=true", "--native-file", "toolchains/clang.ini"]]
    for cmd in steps + [["ninja", "-C", str(C_BUILD)]]:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stdout + r.stderr).strip().splitlines()[-1:] or ["?"]
            return f"C build failed: `{' '.join(cmd[:2])}`: {last[0][:120]}"
    return None


def command(target, seconds, timeout):
    """(argv, seed corpus) of one libFuzzer run of `target`, or (None, why not)."""
    flags = [f"-max_total_time={seconds}", f"-timeout={timeout}", "-print_final_stats=1",
             f"-artifact_prefix={ARTIFACTS / target}/"]
    if target in PY_TARGETS + REMOTE_TARGETS:
        seeds, dictionary = ROOT / "benchmarks" / "fuzz_corpus" / target, ROOT / "benchmarks" / "fuzz_corpus" / f"{target}.dict"
        script = "fuzz_convert.py" if target in PY_TARGETS else "fuzz_remote.py"
        argv = [sys.executable, str(ROOT / "benchmarks" / script), target]
    else:
        exe = C_BUILD / "c_core" / "fuzz" / f"fuzz_{target}"
        if not exe.exists():
            return None, f"not built (no {exe.relative_to(ROOT)})"
        seeds, dictionary = C_SOURCES / "corpus" / target, C_SOURCES / f"{target}.dict"
        argv = [str(exe)]
    if dictionary.exists():
        flags.insert(0, f"-dict={dictionary}")
    return argv + flags + [str(WORK / target)] + ([str(seeds)] if seeds.is_dir() else []), seeds


def run(target, seconds, timeout, log_dir):
    """One target for `seconds`, restarted after each crash: its row's values."""
    kind = "libFuzzer C" if target in C_TARGETS else "HTTP/2 grammar" if target == "http2" else "atheris Python"
    row = {"target": target, "kind": kind, "seconds": 0,
           "executions": 0, "cov": None, "ft": None, "corpus": None, "crashes": []}
    (ARTIFACTS / target).mkdir(parents=True, exist_ok=True)
    (WORK / target).mkdir(parents=True, exist_ok=True)
    start, log = time.monotonic(), log_dir / f"{target}.log"
    with open(log, "w") as out:
        for _ in range(MAX_RESTARTS):
            left = int(round(seconds - (time.monotonic() - start)))
            if left < 1:
                break
            argv, why = command(target, left, timeout)
            if argv is None:
                row["note"] = why
                return row
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            t0 = time.monotonic()
            r = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", timeout=left + 10 * timeout + 60)
            out.write(r.stdout)
            row["seconds"] += time.monotonic() - t0
            units = re.findall(r"stat::number_of_executed_units:\s*(\d+)", r.stdout)
            status = STATUS.findall(r.stdout)
            row["executions"] += int(units[-1]) if units else int(status[-1][0]) if status else 0
            if status:
                row["cov"], row["ft"], row["corpus"] = (int(v) for v in status[-1][1:])
            crashes = ARTIFACT.findall(r.stdout)
            row["crashes"] += crashes
            if r.returncode == 0 and not crashes:
                break
            if not crashes:   # failed without an artifact: say so rather than loop
                tail = [line for line in r.stdout.splitlines() if line.strip()][-1:] or ["?"]
                row["note"] = f"exit {r.returncode}: {tail[0][:120]}"
                break
    row["log"] = log
    return row


def _rel(path):
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def table(rows):
    lines = ["| target | kind | seconds | executions | exec/s | cov | ft | corpus | crashes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("note") and not r["executions"]:
            lines.append(f"| {r['target']} | {r['kind']} | – | – | – | – | – | – | {r['note']} |")
            continue
        files = list(dict.fromkeys(r["crashes"]))   # a crash found again after a restart, once
        crashes = str(len(r["crashes"])) + (": " + ", ".join(f"`{_rel(c)}`" for c in files[:3]) if files else "")
        if len(files) > 3:
            crashes += f" and {len(files) - 3} more"
        if r.get("note"):
            crashes += f" ({r['note']})"
        rate = r["executions"] / r["seconds"] if r["seconds"] else 0
        fmt = lambda v: "–" if v is None else f"{v:,}"   # noqa: E731
        lines.append(f"| {r['target']} | {r['kind']} | {r['seconds']:.0f} | {r['executions']:,} | {rate:,.0f} | "
                     f"{fmt(r['cov'])} | {fmt(r['ft'])} | {fmt(r['corpus'])} | {crashes} |")
    return "\n".join(lines)


def _cpu():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit():
    def git(*args):
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, required=True, help="fuzzing time of each target")
    p.add_argument("--only", help=f"comma-separated targets (default all: {','.join(C_TARGETS + PY_TARGETS + REMOTE_TARGETS)})")
    p.add_argument("--jobs", type=int, default=1, help="targets run at once (default 1)")
    p.add_argument("--timeout", type=int, default=10, help="seconds one input may run before it is a finding")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.md")
    args = p.parse_args()
    if args.seconds < 1 or args.jobs < 1 or args.timeout < 1:
        p.error("--seconds, --jobs and --timeout must be at least 1")
    targets = list(C_TARGETS + PY_TARGETS + REMOTE_TARGETS)
    if args.only:
        targets = [t.strip() for t in args.only.split(",") if t.strip()]
        unknown = sorted(set(targets) - set(C_TARGETS + PY_TARGETS + REMOTE_TARGETS))
        if unknown:
            p.error(f"--only: unknown target {unknown[0]!r} (targets: {', '.join(C_TARGETS + PY_TARGETS + REMOTE_TARGETS)})")
    c_missing = build_c() if set(targets) & set(C_TARGETS) else None
    log_dir = ROOT / "build" / "fuzz-logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    def one(target):
        if target in C_TARGETS and c_missing:
            return {"target": target, "kind": "libFuzzer C", "executions": 0, "note": c_missing}
        row = run(target, args.seconds, args.timeout, log_dir)
        print(f"{target}: {row['executions']:,} executions, cov {row['cov']}, ft {row['ft']}, "
              f"{len(row['crashes'])} crashes (log {_rel(row.get('log', '?'))})", file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, targets))
    text = table(rows)
    print(text)
    head = (f"# Fuzzing, {datetime.date.today().isoformat()}\n\n"
            f"`python benchmarks/fuzz.py --seconds {args.seconds} --jobs {args.jobs}"
            f"{' --only ' + ','.join(targets) if args.only else ''}` on {_cpu()} "
            f"({shutil.os.cpu_count()} CPUs), commit {_commit()}; each input limited to {args.timeout} s, "
            f"the Python targets to {4} GiB of address space. cov and ft: libFuzzer's final coverage "
            f"counters (edges; features); corpus: entries in the working corpus.\n\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(head + text + "\n")
    return 1 if any(r.get("crashes") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

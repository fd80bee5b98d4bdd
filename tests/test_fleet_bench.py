"""benchmarks/fleet.py end to end, small: simulated edges against one expert server found in a real
3-member etcd, then a leading orchestrator killed under real edges.  The figures are the
benchmark's; what the suite checks is that every call was answered and that no edge's token
differs from the all-local reference run (the benchmark's own count of lost tokens)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from etcd_cluster import ETCD, MISSING

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "fleet.py"

pytestmark = pytest.mark.skipif(ETCD is None, reason=MISSING)


def rows(text, heading):
    """The rows of the markdown table under `heading`, as lists of cells."""
    part = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in part.splitlines()
            if line.startswith("|") and not line.startswith("|---")][1:]


def test_fleet_benchmark_small_run(tmp_path):
    out = tmp_path / "fleet.md"
    run = subprocess.run([sys.executable, str(BENCH), "--edges", "1,2", "--servers", "1", "--seconds", "1.5",
                          "--reps", "1", "--kills", "orchestrator", "--kill-edges", "1", "--kill-seconds", "7",
                          "--kill-after", "2.5", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd="/")
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    throughput = rows(text, "## Throughput")
    assert [r[:2] for r in throughput] == [["1", "1"], ["1", "2"]]
    for r in throughput:
        assert float(r[2].replace(",", "")) > 0 and r[11] == "0", r   # calls answered, none failed
    (kill,) = rows(text, "## Kills")
    tokens, lost, leader = int(kill[2].replace(",", "")), int(kill[3]), kill[7]
    assert tokens > 0 and lost == 0, kill
    assert re.fullmatch(r"\d+\.\d\d", leader) and float(leader) < 2 + 2, kill   # the TTL (2 s) and test_control_plane's slack
    assert kill[9] == "0", kill   # no placement version written twice

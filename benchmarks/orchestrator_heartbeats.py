"""The latency of `colibri orchestrate`'s heartbeats when it holds many edges.

    python benchmarks/orchestrator_heartbeats.py [--edges 200] [--layers 24] [--experts 64] [--beats 60]

Writes a state file of `--edges` edges of a layers x experts model, each with a load on every
expert and half of them placed local, starts `colibri orchestrate` on it, and sends `--beats`
heartbeats round the edges, each carrying 24 load pairs that move the edge's placement (a placement
change is the heartbeat that waits for the state to be durable).  Prints the median and the
slowest latency, in ms."""
import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EXPERT_BYTES = 1 << 20


def state_file(path, n_edges, n_ids, rng):
    edges = {}
    for e in range(n_edges):
        load = rng.uniform(1, 100, n_ids)
        edges[f"edge-{e}"] = {
            "model_hash": "01" * 8, "seq": 1, "heartbeats": 10, "device_p90_us": [40, 2100], "cache_hit_permille": 900,
            "budget_bytes": n_ids // 2 * EXPERT_BYTES, "expert_bytes": EXPERT_BYTES, "placement_version": 1,
            "edge_version": 1, "local": sorted(np.argsort(-load)[:n_ids // 2].tolist()),
            "load": {str(i): round(float(x), 4) for i, x in enumerate(load)}, "last_seen": time.time()}
    path.write_text(json.dumps({"format": "colibri-orchestrator", "version": 1, "edges": edges}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--edges", type=int, default=200)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--beats", type=int, default=60)
    args = p.parse_args()

    import grpc

    from colibri.remote import colibri_remote_pb2 as pb
    from colibri.remote import colibri_remote_pb2_grpc as pbg

    n_ids, rng = args.layers * args.experts, np.random.default_rng(0)
    state = Path(tempfile.mkdtemp()) / "state.json"
    state_file(state, args.edges, n_ids, rng)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "colibri", "orchestrate", "--listen", f"127.0.0.1:{port}",
                               "--state", str(state), "--interval", "2"], stderr=subprocess.PIPE, text=True)
    try:
        print(server.stderr.readline().strip(), f"({state.stat().st_size / 1e6:.1f} MB of state)")
        latencies = []
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pbg.OrchestratorStub(channel)
            for beat in range(args.beats):
                e = beat % args.edges
                ids = rng.choice(n_ids, 24, replace=False)
                pairs = [x for i in ids for x in (int(i), 1000)]   # past any local expert's load: they come in
                msg = pb.HeartbeatRequest(edge=f"edge-{e}", model_hash=b"\x01" * 8, seq=2 + beat,
                                          device_p90_us=[40, 2100], cache_hit_permille=900, load_delta=pairs,
                                          placement_version=1, budget_bytes=n_ids // 2 * EXPERT_BYTES,
                                          expert_bytes=EXPERT_BYTES)
                t = time.perf_counter()
                stub.Heartbeat(msg, timeout=60)
                latencies.append((time.perf_counter() - t) * 1e3)
        print(f"{args.edges} edges of {args.layers} x {args.experts} experts, {args.beats} heartbeats: "
              f"median {statistics.median(latencies):.1f} ms, slowest {max(latencies):.1f} ms")
    finally:
        server.terminate()
        server.wait(timeout=120)


if __name__ == "__main__":
    main()

"""A real etcd cluster on loopback for the control plane's tests and benchmarks/fleet.py: `members`
etcd processes (Debian's etcd-server, which ./run-tests installs), each with its own data folder
and two free ports, forming one Raft cluster.

    with EtcdCluster(tmp_path, members=3) as cluster:
        store = Etcd(cluster.endpoints)
        cluster.kill(0)            # SIGKILL one member: the other two keep a quorum
"""
import os
import shutil
import signal
import socket
import subprocess
import time

from colibri.remote.etcd import Etcd, EtcdError

ETCD = shutil.which("etcd")
MISSING = "etcd is not installed (Debian's etcd-server; ./run-tests installs it)"


def free_ports(n):
    """`n` distinct free loopback ports (held open together, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EtcdCluster:
    def __init__(self, folder, members=1, *, start_timeout_s=20.0):
        if ETCD is None:
            raise RuntimeError(MISSING)
        self.folder = folder
        ports = free_ports(2 * members)
        self.client_ports, peer_ports = ports[:members], ports[members:]
        self.names = [f"m{i}" for i in range(members)]
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, peer_ports))
        self.procs = []
        for name, client, peer in zip(self.names, self.client_ports, peer_ports):
            log = open(os.path.join(folder, f"etcd-{name}.log"), "wb")
            self.procs.append(subprocess.Popen(
                [ETCD, "--name", name, "--data-dir", os.path.join(folder, f"etcd-{name}"),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 # a quick election on loopback: a killed member's followers notice in under a second
                 "--heartbeat-interval", "50", "--election-timeout", "500"],
                stdout=log, stderr=subprocess.STDOUT))
            log.close()
        self.endpoints = ",".join(f"127.0.0.1:{p}" for p in self.client_ports)
        deadline = time.monotonic() + start_timeout_s
        for port in self.client_ports:   # every member answers a write through the cluster's quorum
            store = Etcd(f"127.0.0.1:{port}", timeout_s=1.0)
            while True:
                try:
                    store.put("/colibri-test/ready", b"1")
                    break
                except EtcdError:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                        self.stop()
                        raise RuntimeError(f"etcd did not start in {start_timeout_s} s: see {folder}/etcd-*.log")
                    time.sleep(0.1)

    def endpoint(self, i):
        return f"127.0.0.1:{self.client_ports[i]}"

    def kill(self, i):
        """SIGKILL member `i`."""
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

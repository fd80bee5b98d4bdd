"""`colibri serve-experts` and `colibri orchestrate` against hostile peers and hostile files: weights.bin
truncated under a running server, a client that opens calls and never reads their replies, bind
failures, token files that are not a token."""
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import colibri

grpc = pytest.importorskip("grpc")

from colibri.remote import colibri_remote_pb2 as pb  # noqa: E402
from colibri.remote import colibri_remote_pb2_grpc as rpc  # noqa: E402
from colibri.remote import model_hash  # noqa: E402
from colibri.remote.driver import RemoteDriver  # noqa: E402
from support import FIXTURES, TESTS, self_signed  # noqa: E402
from test_remote import Server, compute, extent_bytes  # noqa: E402

MIXTRAL = FIXTURES / "tiny-mixtral.colibri"


# ------------------------------------------------------------------------------- a truncated weights.bin

def test_a_model_read_into_memory_survives_its_file_truncated(tmp_path):
    """Model(copy=True), the server's: the file truncated under it, the logits stay those of the
    model mapped from the untouched fixture (a mapping would fault: SIGBUS)."""
    shutil.copytree(MIXTRAL, tmp_path / "model")
    want = colibri.Model(MIXTRAL).session(ctx=32).forward([1, 17, 42, 99])
    model = colibri.Model(tmp_path / "model", copy=True)
    session = model.session(ctx=32)
    os.truncate(tmp_path / "model" / "weights.bin", 0)
    assert np.array_equal(session.forward([1, 17, 42, 99]).view(np.uint32), want.view(np.uint32))


def test_weights_truncated_under_the_server_is_data_loss_not_a_crash(tmp_path):
    """`cp` of a smaller file over a served model: every later Compute and FetchExpert is DATA_LOSS,
    and the server stays up (Info answers, SIGTERM is a clean exit)."""
    model = tmp_path / "model"
    shutil.copytree(MIXTRAL, model)
    server = Server(model)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = rpc.ExpertsStub(channel)
            assert len(stub.Compute(compute(layer=1, experts=[3]), timeout=10).y) == 64 * 4
            os.truncate(model / "weights.bin", 4096)   # what `cp small weights.bin` does first
            for call in (lambda: stub.Compute(compute(layer=1, experts=[3]), timeout=10),
                         lambda: list(stub.FetchExpert(pb.FetchRequest(model_hash=model_hash(MIXTRAL), layer=1,
                                                                       expert=3), timeout=10))):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.DATA_LOSS and "weights.bin" in e.value.details(), e.value
            assert stub.Info(pb.InfoRequest(), timeout=10).n_layers == 2
        assert server.proc.poll() is None
    finally:
        code = server.stop()
    assert code == 0, "".join(server.lines)


# ------------------------------------------------------------------------------- a client that never reads

def frame(kind, flags, stream, payload=b""):
    """An HTTP/2 frame (RFC 9113 4.1)."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_literal(name, value):
    """A header field as an HPACK literal without indexing, new name, no Huffman (RFC 7541 6.2.2);
    every length here is under 127, one byte."""
    name, value = name.encode(), value.encode()
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


DATA, HEADERS, SETTINGS, PING = 0, 1, 4, 6
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
INITIAL_WINDOW_SIZE = 0x4


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """converted(**config) -> a tiny mixtral with those config values, converted once."""
    from support import build

    from colibri.convert import convert

    made = {}

    def get(**config):
        key = tuple(sorted(config.items()))
        if key not in made:
            root = tmp_path_factory.mktemp("mixtral")
            build("mixtral", **config).save_pretrained(root / "hf")
            made[key] = convert(root / "hf", root / "model", progress=False)
        return made[key]
    return get


def compute_request(model_dir, layer, expert):
    hidden = colibri.Model(model_dir).config["hidden_size"]
    return pb.ComputeRequest(model_hash=model_hash(model_dir), layer=layer, experts=[expert], rows=[0, 1],
                             x=bytes(hidden * 4))


def test_fetch_expert_of_an_expert_larger_than_a_compute_message(converted):
    """Hidden size 64: a Compute message is at most 128 rows of 256 bytes, an expert 768 KiB, three
    chunks of 256 KiB: each chunk is within what the server sends."""
    model = converted(intermediate_size=1024)
    server = Server(model)
    try:
        drv = RemoteDriver(server.address, colibri.Model(model))
        assert drv.info.expert_bytes == 3 * 64 * 1024 * 4
        assert drv.fetch_expert(1, 3) == extent_bytes(model, 1, 3)
    finally:
        server.stop()


class StalledClient:
    """A raw HTTP/2 connection that sets its receive window to 0, so no reply byte can reach it, and
    opens `n` calls of `model`: FetchExpert with its request, Compute with headers and no request.
    It answers the server's SETTINGS and PINGs as any live client does, and never reads a reply."""

    def __init__(self, address, model, n):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.answered = set()   # streams the server sent headers on: a call it has taken
        self.closed = False
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                          + frame(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, 0)))
        threading.Thread(target=self._read, daemon=True).start()
        fetch = pb.FetchRequest(model_hash=model_hash(model), layer=0, expert=0).SerializeToString()
        for i in range(n):
            stream = 2 * i + 1
            method = "FetchExpert" if i % 2 == 0 else "Compute"
            block = b"".join(hpack_literal(k, v) for k, v in (
                (":method", "POST"), (":scheme", "http"), (":path", f"/colibri.remote.v1.Experts/{method}"),
                (":authority", address), ("content-type", "application/grpc"), ("te", "trailers")))
            self.sock.sendall(frame(HEADERS, END_HEADERS, stream, block))
            if method == "FetchExpert":
                self.sock.sendall(frame(DATA, END_STREAM, stream, b"\x00" + struct.pack(">I", len(fetch)) + fetch))

    def _read(self):
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    payload, buf = buf[9:9 + length], buf[9 + length:]
                    if kind == SETTINGS and not flags & ACK:
                        self.sock.sendall(frame(SETTINGS, ACK, 0))
                    elif kind == PING and not flags & ACK:
                        self.sock.sendall(frame(PING, ACK, 0, payload))
                    elif kind == HEADERS:
                        self.answered.add(stream)
        except OSError:
            pass
        self.closed = True

    def close(self):
        self.sock.close()


def test_a_client_that_never_reads_does_not_stall_the_others(converted):
    """Two connections of 16 calls each that never take a reply byte (FetchExpert) or never send
    their request (Compute): while they stay connected, another client's Info and Compute answer
    within their deadlines, again and again.  Experts of 768 KiB: three chunks, a reply that cannot
    leave at once."""
    model = converted(hidden_size=512, intermediate_size=128)
    server = Server(model)
    request = compute_request(model, 1, 3)
    attackers = []
    try:
        attackers = [StalledClient(server.address, model, 16) for _ in range(2)]
        deadline = time.monotonic() + 10   # until the server has taken the fetches (or time is up)
        while time.monotonic() < deadline and sum(len(a.answered) for a in attackers) < 16:
            time.sleep(0.05)
        with grpc.insecure_channel(server.address) as channel:
            stub = rpc.ExpertsStub(channel)
            for _ in range(3):
                assert stub.Info(pb.InfoRequest(), timeout=10).n_layers == 2
                assert len(stub.Compute(request, timeout=10).y) == len(request.x)
        assert not any(a.closed for a in attackers), "the test needs the stalled connections to stay open"
    finally:
        for a in attackers:
            a.close()
        code = server.stop()
    assert code == 0, "".join(server.lines)


# ------------------------------------------------------------------------------- bind failures

# The address space capped at 4 GiB in the command's own process, before colibri is imported: a
# preexec_fn would make subprocess fork() this process, whose gRPC (the in-process servers of other
# tests) then runs its fork handlers in the child, whose poller aborts on an fd the exec closed.
CAPPED = ("import resource, runpy; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
          "runpy.run_module('colibri', run_name='__main__', alter_sys=True)")


def run_command(*args, timeout=60):
    """The command's result; its address space capped at 4 GiB, so that one reading without a bound
    fails soon instead of taking the machine's memory."""
    return subprocess.run([sys.executable, "-c", CAPPED, *map(str, args)], cwd=TESTS, capture_output=True,
                          text=True, timeout=timeout)


def commands(tmp_path, listen, *extra):
    """serve-experts and orchestrate with the same listening options."""
    return [("serve-experts", "--model", MIXTRAL, "--listen", listen, *extra),
            ("orchestrate", "--state", tmp_path / "state.json", "--listen", listen, *extra)]


def one_clear_line(r, *words):
    """Exit 1, stderr one line that names the command and `words`, and no raw gRPC log."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "GRPC_VERBOSITY" not in r.stderr, r.stderr
    assert lines[0].startswith("colibri ") and all(w in lines[0] for w in words), r.stderr


def test_bind_failures_are_one_clear_line(tmp_path):
    with socket.socket() as taken:   # listening, as another server would be
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for cmd in commands(tmp_path, f"127.0.0.1:{port}"):
            one_clear_line(run_command(*cmd), f"127.0.0.1:{port}", "in use")
    cert, key = self_signed(tmp_path)
    for cmd in commands(tmp_path, "127.0.0.1:0", "--tls-cert", key, "--tls-key", cert):   # swapped
        one_clear_line(run_command(*cmd), "127.0.0.1:0", "--tls-cert", "private key")


# ------------------------------------------------------------------------------- token files

@pytest.mark.parametrize("kind", ["dev-zero", "large"])
def test_a_token_file_that_is_not_a_token_is_refused_at_once(tmp_path, kind):
    """/dev/zero (endless) and a 64 MiB file: refused with a clear line, without reading them whole
    (a few seconds at most; reading /dev/zero has no end)."""
    if kind == "dev-zero":
        path, words = "/dev/zero", ("/dev/zero", "not a regular file")
    else:
        path, words = tmp_path / "big", ("big", "over 4096 bytes")
        with open(path, "wb") as f:
            f.truncate(64 << 20)
    for cmd in commands(tmp_path, "127.0.0.1:0", "--token-file", path):
        one_clear_line(run_command(*cmd), *words)


@pytest.mark.parametrize("content", ["tökén\n".encode(), b"two\nlines\n"])
def test_a_token_gRPC_metadata_cannot_carry_is_refused(tmp_path, content):
    """Not printable ASCII on one line: no edge could send it as "authorization: Bearer TOKEN"."""
    path = tmp_path / "token"
    path.write_bytes(content)
    for cmd in commands(tmp_path, "127.0.0.1:0", "--token-file", path):
        one_clear_line(run_command(*cmd), "token", "printable ASCII")

"""RemoteDriver: a session's device whose experts another machine computes (`colibri serve-experts`).

    drv = RemoteDriver("cloud:50051", model, token=token, tls_ca="ca.pem", deadline_ms=200)
    s = model.session(devices=[drv], placement=table)      # table[layer, expert] = 1: on drv
    s.forward(tokens); drv.round_trips, drv.bytes_sent, drv.bytes_received

One gRPC channel, made at construction, carries every call.  Construction asks the server's Info
and fails at once with a message when the server cannot be reached or serves another model (an
edge finds out at start, not at its first token).  A layer's remote experts travel in one
Compute per forward chunk: compute() sends it, the local experts run meanwhile, sync() waits.
Any failure (the deadline, a refused or lost connection, a reply of the wrong size) raises in
sync(): the session counts an error and computes those experts locally, or fails when strict.
"""
import queue
import threading
import time
import zlib

import grpc
import numpy as np

from colibri.remote import colibri_remote_pb2 as pb
from colibri.remote import colibri_remote_pb2_grpc as rpc
from colibri.remote import model_hash


CALLER_SLACK_S = 5.0   # past a call's deadline, how long sync() waits for the caller thread's answer


class _Call:
    """A Compute on its way: the caller thread sets reply or error, then done."""
    __slots__ = ("request", "layer", "sent", "finished", "reply", "error", "done")

    def __init__(self, request, layer):
        self.request, self.layer = request, layer
        self.sent = time.perf_counter()
        self.finished, self.reply, self.error = None, None, None
        self.done = threading.Event()


class RemoteError(RuntimeError):
    """A remote call that failed or came back wrong; the message names the server and the cause."""


class WrongModel(RemoteError):
    """The server answers, but serves another model (a fleet ignores it rather than retrying it)."""


def _hex(digest):
    return digest[:6].hex() if digest else "(none)"


class RemoteDriver:
    """A Python device driver (docs/DEVICES.md) for the expert server at `target` ("host:port").

    `model`: the local colibri.Model (or its directory), whose colibri_model.json the server's must
    equal.  `token`: sent as "authorization: Bearer <token>".  `tls_ca`: a PEM file (or bytes) of
    the certificate authority to trust; TLS when given.  `deadline_ms`: each Compute's deadline
    (a call past it is a failed call).  `threshold_ms`: the latency over which the session bypasses
    it (None: the session's).  `connect_timeout_s`: for the Info call at construction.
    `bandwidth_mbit`: a bandwidth cap for fetch_expert (None: none).  `max_message_mb`: the channel's
    bound on a message either way.

    Counters (attributes): round_trips (Compute calls answered), failures, bytes_sent and
    bytes_received (the messages' serialized bytes, without HTTP/2 framing), server_ns (the
    server's compute time, summed), fetched_bytes."""

    def __init__(self, target, model, *, name="remote", token=None, tls_ca=None, deadline_ms=1000,
                 threshold_ms=None, connect_timeout_s=5.0, bandwidth_mbit=None, max_message_mb=64):
        self.name, self.target, self.threshold_ms = name, target, threshold_ms
        self.deadline = deadline_ms / 1000
        self.bandwidth_mbit = bandwidth_mbit
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        path = getattr(model, "path", model)
        self.hash = model_hash(path)
        limit = int(max_message_mb * (1 << 20))
        options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                   # after a lost server, try it again soon: the session's probes need a live channel
                   ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if tls_ca is not None:
            ca = tls_ca if isinstance(tls_ca, bytes) else open(tls_ca, "rb").read()
            self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca), options)
        else:
            self.channel = grpc.insecure_channel(target, options)
        self.stub = rpc.ExpertsStub(self.channel)
        try:
            self.info = self.stub.Info(pb.InfoRequest(), timeout=connect_timeout_s, metadata=self.metadata)
        except grpc.RpcError as e:
            self.channel.close()
            raise RemoteError(f"cannot use the expert server at {target}: {e.code().name}: {e.details()} "
                              f"(is `colibri serve-experts` running there, with this token and TLS?)") from None
        if self.info.model_hash != self.hash:
            self.channel.close()
            raise WrongModel(f"the expert server at {target} serves model {_hex(self.info.model_hash)}, not this "
                              f"one ({_hex(self.hash)}, {path}): serve the same colibri_model.json")
        self.hidden_size = self.info.hidden_size
        self.round_trips = self.failures = self.bytes_sent = self.bytes_received = 0
        self.server_ns = self.fetched_bytes = 0
        self._pending = None
        self._calls, self._caller = queue.SimpleQueue(), None   # the caller thread, started at the first call
        self._bucket = [0.0, time.perf_counter()]   # fetch_expert's token bucket: bytes left, when
        self._bucket_lock = threading.Lock()         # fetches from several threads share the cap

    def close(self):
        if self._caller is not None:
            self._calls.put(None)
            self._caller.join(timeout=self.deadline + CALLER_SLACK_S)
            self._caller = None
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def holds(self, n_layers, n_experts):
        return None   # the server holds the whole model (the hashes match)

    def compute(self, layer, experts, rows, gates, x):
        if int(rows[-1]) > self.info.max_rows:
            raise RemoteError(f"{self.target}: {int(rows[-1])} rows in one call, the server takes at most "
                              f"{self.info.max_rows} (serve-experts --batch)")
        request = pb.ComputeRequest(model_hash=self.hash, layer=layer, experts=experts.tolist(),
                                    rows=rows.tolist(), x=x.astype("<f4", copy=False).tobytes())
        if self._caller is None:
            self._caller = threading.Thread(target=self._call_loop, name=f"colibri-remote {self.target}", daemon=True)
            self._caller.start()
        call = _Call(request, layer)
        self._calls.put(call)
        self.bytes_sent += request.ByteSize()
        self._pending = call

    def _call_loop(self):
        """The caller thread: each Compute as a blocking call.  grpc's future() would start a thread
        of its own for every call made on an idle channel (its channel spin thread): 0.35 ms of the
        1.1 ms a call took in a profile of 2,000 calls of the bundled model on loopback."""
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                call.reply = self.stub.Compute(call.request, timeout=self.deadline, metadata=self.metadata)
            except grpc.RpcError as e:
                call.error = f"{e.code().name}: {e.details()}"
            except Exception as e:   # a closed channel: ValueError
                call.error = f"{type(e).__name__}: {e}"
            call.finished = time.perf_counter()
            call.done.set()

    def sync(self, y):
        if self._pending is None:
            raise RemoteError("sync() without compute()")
        call, self._pending = self._pending, None
        if not call.done.wait(self.deadline + CALLER_SLACK_S):   # the deadline ends the call: this is a bound only
            self.failures += 1
            raise RemoteError(f"{self.target}, layer {call.layer}: no answer {self.deadline + CALLER_SLACK_S:g} s "
                              f"after the call")
        if call.error is not None:
            self.failures += 1
            raise RemoteError(f"{self.target}, layer {call.layer}: {call.error}")
        reply = call.reply
        self.bytes_received += reply.ByteSize()
        if len(reply.y) != y.nbytes:
            self.failures += 1
            raise RemoteError(f"{self.target}, layer {call.layer}: a reply of {len(reply.y)} bytes, "
                              f"{y.shape[0]} rows of hidden size {y.shape[1]} are {y.nbytes}")
        y[...] = np.frombuffer(reply.y, dtype="<f4").reshape(y.shape)
        self.round_trips += 1
        self.server_ns += reply.compute_ns
        return call.finished - call.sent   # when the reply came, not when sync() looked

    def fetch_expert(self, layer, expert, *, timeout_s=None):
        """bytes: expert `expert` of `layer` as the server's weights.bin holds it (colibri.remote.
        colibri.experts.layout: its extent, or its parts of a stacked file joined), every chunk's CRC-32,
        the offsets, the total and the whole's CRC-32 checked; RemoteError otherwise.  Paced to
        `bandwidth_mbit` when set.  `timeout_s`: default 30 s plus the time the cap takes."""
        if not self.info.fetch:
            raise RemoteError(f"{self.target} does not serve expert weights")
        if timeout_s is None:
            timeout_s = 30 + (self.info.expert_bytes * 8 / (self.bandwidth_mbit * 1e6) if self.bandwidth_mbit else 0)
        stream = self.stub.FetchExpert(pb.FetchRequest(model_hash=self.hash, layer=layer, expert=expert),
                                       timeout=timeout_s, metadata=self.metadata)
        try:
            data = collect_extent(self._paced(stream), f"{self.target}, layer {layer} expert {expert}")
        except grpc.RpcError as e:
            raise RemoteError(f"{self.target}, layer {layer} expert {expert}: {e.code().name}: {e.details()}") from None
        self.fetched_bytes += len(data)
        return data

    def _paced(self, chunks):
        """The chunks, each waited for until the token bucket (bandwidth_mbit, a burst of one chunk) has its bytes."""
        for chunk in chunks:
            if self.bandwidth_mbit:
                rate = self.bandwidth_mbit * 1e6 / 8
                with self._bucket_lock:
                    left, then = self._bucket
                    now = time.perf_counter()
                    left = min(left + (now - then) * rate, len(chunk.data)) - len(chunk.data)
                    if left < 0:
                        time.sleep(-left / rate)
                        now += -left / rate
                        left = 0.0
                    self._bucket[:] = [left, now]
            yield chunk


def collect_extent(chunks, what):
    """The bytes of a FetchExpert stream, checked: contiguous offsets from 0, each chunk's CRC-32,
    one total, the last chunk's extent CRC-32 over everything.  RemoteError names what is wrong."""
    parts, size, crc, total = [], 0, 0, None
    for chunk in chunks:
        if total is None:
            total = chunk.total
        if chunk.total != total or chunk.offset != size:
            raise RemoteError(f"{what}: a chunk at offset {chunk.offset} of total {chunk.total}, "
                              f"expected offset {size} of {total}")
        if zlib.crc32(chunk.data) != chunk.crc32:
            raise RemoteError(f"{what}: the chunk at offset {chunk.offset} fails its CRC-32 "
                              f"({zlib.crc32(chunk.data):08x} != {chunk.crc32:08x})")
        parts.append(chunk.data)
        size += len(chunk.data)
        crc = zlib.crc32(chunk.data, crc)
        if size > total:
            raise RemoteError(f"{what}: {size} bytes, more than the total {total}")
        if size == total:
            if crc != chunk.extent_crc32:
                raise RemoteError(f"{what}: the extent fails its CRC-32 ({crc:08x} != {chunk.extent_crc32:08x})")
            return b"".join(parts)
    raise RemoteError(f"{what}: the stream ended at {size} of {total if total is not None else '?'} bytes")

"""The Experts service (`colibri serve-experts`): one model, one session, its experts computed for
the edges that call it and its weights served to those that fetch them.  docs/DEVICES.md.

    colibri serve-experts --model out/model --listen 127.0.0.1:50051
    colibri serve-experts --model out/model --listen 0.0.0.0:50051 --token-file tok --tls-cert c.pem --tls-key k.pem

The server is gRPC's asyncio server on one event loop thread: a call waiting on its client (a request
not sent yet, a reply the client does not read) holds a coroutine, not a thread, so no client can
take the server from the others.  Every request is checked on the loop before it reaches the core
(the core's own checks of a Compute too, Session.check_experts: a malformed call never fails the
calls computed with it); what the core refuses (COLIBRI_E_ARG) is INVALID_ARGUMENT, never a crash.

Computes are batched.  A checked Compute waits in a queue of at most `queue` calls (--queue; a
call finding it full is answered RESOURCE_EXHAUSTED at once) for the compute thread, the only one
that computes with the session (it is not thread-safe; compute_experts releases the GIL, so the loop
keeps serving meanwhile).  Each round takes the oldest queued call and the later calls of its
layer, in arrival order, while their rows fit max_rows, and computes them as one compute_experts:
each expert once, over the rows every call routes to it; each call is answered its own rows, in
its own order, and the round's compute time.  The next round again starts from the oldest call of
any layer, so a busy layer cannot starve another.  A call whose client has gone (gRPC cancels it,
at its deadline too) leaves the queue; one whose deadline has passed when its round starts is
answered DEADLINE_EXCEEDED, uncomputed.  Info and FetchExpert never wait for a Compute.  The model
is read into memory (Model(copy=True)), not mapped, so weights.bin truncated or rewritten under
the server is a DATA_LOSS answer, not a SIGBUS.
"""
import asyncio
import collections
import hmac
import ipaddress
import os
import re
import signal
import socket
import ssl
import sys
import threading
import time
import zlib
from pathlib import Path

import grpc
import numpy as np

import colibri
from colibri import experts
from colibri.remote import colibri_remote_pb2 as pb
from colibri.remote import colibri_remote_pb2_grpc as rpc
from colibri.remote import model_hash, read_token_file

CHUNK = 256 << 10       # FetchExpert's chunk
SLACK = 64 << 10        # a message's bytes besides its tensor: ids, offsets, hash, framing
DEFAULT_BATCH = 64      # the core's default prefill chunk
STREAMS_PER_CONNECTION = 16   # calls one connection may have open at once: bounds what it holds
KEEPALIVE_S = 60, 20    # ping a connection idle this long, drop it when the ping is not answered in that
DEFAULT_QUEUE = 256     # Computes waiting for the compute thread: 16 connections with all their streams open


def short(digest):
    """A hash's first 6 bytes in hex, for messages."""
    return digest[:6].hex() if digest else "(none)"


class Call:
    """A checked Compute in the queue: x (rows[-1], hidden) the request's bytes, unconverted; the
    future its coroutine awaits; the time.monotonic() its deadline passes (None: no deadline)."""

    __slots__ = ("layer", "experts", "rows", "x", "future", "deadline")

    def __init__(self, layer, experts, rows, x, future, deadline):
        self.layer, self.experts, self.rows, self.x = layer, experts, rows, x
        self.future, self.deadline = future, deadline

    @property
    def n_rows(self):
        return int(self.rows[-1])


def settle(future, answer):
    """On the loop: the call's answer, unless its coroutine has gone (cancelled)."""
    if not future.done():
        future.set_result(answer)


class ExpertsService(rpc.ExpertsServicer):
    """Compute and FetchExpert for the model at `model_dir`.  `batch`: the largest prefill chunk of
    the edges served (a call carries at most batch * top_k rows); `max_message`: bytes one message
    may take (default: what the largest call needs), fewer rows per call when smaller; `queue`:
    Computes that may wait for the compute thread (module docstring); `hold`: the routed experts it
    computes, a --hold SPEC ("0-31", "0-3,8"; None: all), the same ids in every MoE layer (a fleet's
    servers share the experts out: colibri.remote.fleet).  close() stops the thread."""

    def __init__(self, model_dir, *, kernels="auto", batch=DEFAULT_BATCH, threads=0, max_message=None, fetch=True,
                 queue=DEFAULT_QUEUE, hold=None):
        if queue < 1:
            raise ValueError(f"a queue of {queue} calls: give at least 1 (--queue)")
        if Path(model_dir).is_file():   # FetchExpert reads weights.bin's extents
            raise ValueError(f"{model_dir}: serve-experts serves a model directory: convert the GGUF first "
                             f"(colibri convert {model_dir} DIR)")
        self.model = colibri.Model(model_dir, threads=threads, copy=True)
        cfg = self.model.config
        self.hash = model_hash(model_dir)
        self.hidden = cfg["hidden_size"]
        self.hold = hold
        self.held = None if hold is None else parse_hold(hold, cfg["num_experts"])   # sorted ids, None: all
        self.holds = None if hold is None else np.isin(np.arange(cfg["num_experts"]), self.held)
        ctx = min(batch, cfg["max_position_embeddings"])   # a session's batch is at most its context
        self.session = self.model.session(ctx=ctx, batch=ctx, kernels=kernels)
        row_bytes = self.hidden * 4
        self.max_rows = ctx * cfg["top_k"]
        if max_message is not None:
            self.max_rows = min(self.max_rows, (max_message - SLACK) // row_bytes)
            if self.max_rows < 1:
                raise ValueError(f"a message of {max_message:,} bytes cannot carry one row of {row_bytes:,} "
                                 f"bytes (plus {SLACK:,} for the rest): raise --max-message")
        self.max_message = max_message or self.max_rows * row_bytes + SLACK
        self.layout = experts.layout(self.model)
        self.expert_bytes = max((sum(size for _, size, _ in parts) for parts in self.layout.values()), default=0)
        self.fetch = fetch and bool(self.layout)
        self.weights = os.open(Path(model_dir) / "weights.bin", os.O_RDONLY)
        try:
            self.model.check_file()   # the file FetchExpert reads is the one the model was read from
        except colibri.Error as e:
            os.close(self.weights)
            raise ValueError(str(e)) from None
        self.queue = queue
        self._waiting = collections.deque()   # Calls in arrival order
        self._ready = threading.Condition()   # guards _waiting, _closing and _counts
        self._closing = False
        self._counts = dict.fromkeys(("calls", "rounds", "rows", "largest_round", "refused", "dropped", "failed"), 0)
        self._thread = threading.Thread(target=self._rounds, name="colibri-experts", daemon=True)
        self._thread.start()

    def close(self):
        """Stops the compute thread once its round is done (calls still queued are answered
        UNAVAILABLE) and closes weights.bin.  A second call does nothing."""
        if self.weights is None:
            return
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join()
        os.close(self.weights)
        self.weights = None

    def stats(self):
        """The counters since the start: calls (answered with their output), rounds (compute_experts
        calls), rows (computed), largest_round (the most calls one round merged), refused (a full
        queue, or a closed service), dropped (their deadline passed or their client went before their round), failed
        (an error of their round, or queued when the service closed); queued (waiting now)."""
        with self._ready:
            return dict(self._counts, queued=len(self._waiting))

    def _changed(self):
        """None while weights.bin is the file the model was read from (the core's check), else why not."""
        try:
            self.model.check_file()
        except colibri.Error as e:
            return str(e)
        return None

    async def _check(self, digest, context):
        """FAILED_PRECONDITION for another model; DATA_LOSS once weights.bin changed under the server
        (its answers would no longer be the file's: a restart serves the new one)."""
        if digest != self.hash:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"the request is for model {short(digest)}, this server serves {short(self.hash)} "
                                f"({self.model.path})")
        changed = self._changed()
        if changed:
            await context.abort(grpc.StatusCode.DATA_LOSS, f"{changed} (restart the server to serve it)")

    async def Info(self, request, context):
        cfg = self.model.config
        return pb.InfoReply(model_hash=self.hash, n_layers=cfg["num_layers"], n_experts=cfg["num_experts"],
                            hidden_size=self.hidden, kernels=self.session.kernels, max_rows=self.max_rows,
                            expert_bytes=self.expert_bytes, fetch=self.fetch)

    async def Compute(self, request, context):
        await self._check(request.model_hash, context)
        n, rows = len(request.experts), np.array(request.rows, dtype=np.int32)
        bad = None
        if n == 0:
            bad = "no experts"
        elif len(rows) != n + 1:
            bad = f"{n} experts need {n + 1} row offsets, got {len(rows)}"
        elif not 0 < rows[-1] <= self.max_rows:
            bad = f"rows[-1] = {rows[-1]}: a call carries 1 to {self.max_rows} rows"
        elif len(request.x) != int(rows[-1]) * self.hidden * 4:
            bad = (f"x is {len(request.x)} bytes; {rows[-1]} rows of hidden size {self.hidden} in float32 "
                   f"are {int(rows[-1]) * self.hidden * 4}")
        elif self.holds is not None and (missing := [e for e in request.experts
                                                     if 0 <= e < len(self.holds) and not self.holds[e]]):
            bad = (f"expert{'s' * (len(missing) > 1)} {', '.join(map(str, missing[:8]))}"
                   f"{' ...' if len(missing) > 8 else ''} not held by this server (--hold {self.hold})")
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"layer {request.layer}: {bad}")
        experts = np.array(request.experts, dtype=np.int32)
        try:   # the core's own checks, here: a call it would refuse must not fail the others of its round
            self.session.check_experts(request.layer, experts, rows, self.hidden)
        except colibri.Error as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"layer {request.layer}: {e}")
        x = np.frombuffer(request.x, dtype="<f4").reshape(int(rows[-1]), self.hidden)
        remaining = context.time_remaining()
        call = Call(request.layer, experts, rows, x, asyncio.get_running_loop().create_future(),
                    None if remaining is None else time.monotonic() + remaining)
        with self._ready:
            taken = not self._closing and len(self._waiting) < self.queue
            if taken:
                self._waiting.append(call)
                self._ready.notify()
            else:
                self._counts["refused"] += 1
        if not taken:
            if self._closing:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.queue} calls wait already, the server's bound (serve-experts --queue "
                                f"{self.queue}): try again later")
        try:
            code, detail, y, elapsed = await call.future
        except asyncio.CancelledError:   # the client has gone (or its deadline passed): no round for it
            with self._ready:
                if call in self._waiting:
                    self._waiting.remove(call)
                    self._counts["dropped"] += 1
            raise
        if code is not None:
            await context.abort(code, f"layer {request.layer}: {detail}")
        return pb.ComputeReply(y=y, compute_ns=elapsed)

    def _rounds(self):
        """The compute thread: round after round until close(), then the calls left are refused."""
        while True:
            with self._ready:
                while not self._waiting and not self._closing:
                    self._ready.wait()
                if self._closing:
                    left, self._waiting = self._waiting, collections.deque()
                    self._counts["failed"] += len(left)
                    break
                calls = self._take()
            if not calls:   # every call queued had passed its deadline
                continue
            try:
                self._compute(calls)
            except Exception as e:   # compute_experts' error, mapped as before the queue; none may end the thread
                if isinstance(e, colibri.Error):
                    refused = e.status == "COLIBRI_E_ARG"
                else:
                    refused = isinstance(e, (ValueError, TypeError))
                code = grpc.StatusCode.INVALID_ARGUMENT if refused else grpc.StatusCode.INTERNAL
                with self._ready:
                    self._counts["failed"] += len(calls)
                for call in calls:
                    self._answer(call, code, str(e))
        for call in left:
            self._answer(call, grpc.StatusCode.UNAVAILABLE, "the server is stopping")

    def _take(self):
        """The next round, out of the queue (under its lock): the oldest call, then its layer's later
        calls in arrival order while their rows fit max_rows (the first that does not ends the round:
        a layer's calls keep their order).  A call whose deadline has passed is answered
        DEADLINE_EXCEEDED on the way, uncomputed.  The others wait for the next round."""
        now = time.monotonic()
        calls, rows, taking, left = [], 0, True, collections.deque()
        for call in self._waiting:
            if call.deadline is not None and call.deadline <= now:
                self._counts["dropped"] += 1
                self._answer(call, grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed while the call was queued")
            elif not calls or (taking and call.layer == calls[0].layer and rows + call.n_rows <= self.max_rows):
                calls.append(call)
                rows += call.n_rows
            else:
                taking = taking and call.layer != calls[0].layer
                left.append(call)
        self._waiting = left
        return calls

    def _compute(self, calls):
        """One round: the calls merged into one compute_experts, the union of their experts ascending,
        each expert's rows those of each call in call order; each call answered with its own rows of
        the output, in its own order, and the round's compute time."""
        pieces = sorted((int(e), i, int(call.rows[j]), int(call.rows[j + 1]))   # by expert, then call
                        for i, call in enumerate(calls) for j, e in enumerate(call.experts))
        experts, rows = [], [0]
        x = np.empty((sum(call.n_rows for call in calls), self.hidden), np.float32)
        for e, i, a, b in pieces:
            if not experts or experts[-1] != e:
                experts.append(e)
                rows.append(rows[-1])
            x[rows[-1]:rows[-1] + b - a] = calls[i].x[a:b]
            rows[-1] += b - a
        start = time.perf_counter_ns()
        y = self.session.compute_experts(calls[0].layer, np.array(experts, np.int32), np.array(rows, np.int32), x)
        elapsed = time.perf_counter_ns() - start   # the GIL is released meanwhile
        outs = [np.empty((call.n_rows, self.hidden), "<f4") for call in calls]
        at = 0
        for e, i, a, b in pieces:
            outs[i][a:b] = y[at:at + b - a]
            at += b - a
        with self._ready:
            c = self._counts
            c["calls"] += len(calls)
            c["rounds"] += 1
            c["rows"] += len(x)
            c["largest_round"] = max(c["largest_round"], len(calls))
        for call, out in zip(calls, outs):
            self._answer(call, None, None, out.tobytes(), elapsed)

    @staticmethod
    def _answer(call, code, detail, y=b"", elapsed=0):
        """From any thread: the call's answer, (code, detail) for an error, else (None, None, y, ns)."""
        call.future.get_loop().call_soon_threadsafe(settle, call.future, (code, detail, y, elapsed))

    async def FetchExpert(self, request, context):
        await self._check(request.model_hash, context)
        if not self.fetch:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this server does not serve expert weights "
                                "(serve-experts --no-fetch, or a model without routed experts)")
        n_experts = self.model.config["num_experts"]
        if request.layer not in self.layout or not 0 <= request.expert < n_experts:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"no expert {request.expert} in layer {request.layer}: the layers with routed "
                                f"experts are {sorted(self.layout)}, each of {n_experts} experts")
        parts = [(offset + request.expert * step, size) for offset, size, step in self.layout[request.layer]]
        total = sum(size for _, size in parts)
        done, crc = 0, 0
        for offset, size in parts:
            for start in range(0, size, CHUNK):
                data = os.pread(self.weights, min(CHUNK, size - start), offset + start)
                changed = self._changed()   # after the read: no byte of a changed file is sent as the model's
                if changed or len(data) != min(CHUNK, size - start):
                    await context.abort(grpc.StatusCode.DATA_LOSS, f"{changed or 'weights.bin is short'} (restart "
                                        "the server to serve it)")
                crc = zlib.crc32(data, crc)
                last = done + len(data) == total
                yield pb.WeightChunk(offset=done, data=data, crc32=zlib.crc32(data), total=total,
                                     extent_crc32=crc if last else 0)
                done += len(data)


class TokenCheck(grpc.ServerInterceptor):
    """UNAUTHENTICATED for any call whose metadata lacks "authorization: Bearer <token>" (gRPC's
    thread-pool server; AsyncTokenCheck is the same check for the asyncio server)."""

    def __init__(self, token):
        self.expected = f"Bearer {token}".encode()

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
        self.refusals = {False: grpc.unary_unary_rpc_method_handler(refuse),
                         True: grpc.unary_stream_rpc_method_handler(refuse)}

    def authorized(self, details):
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        return hmac.compare_digest(given.encode(), self.expected)

    def intercept_service(self, continuation, details):
        if self.authorized(details):
            return continuation(details)
        return self.refusals[details.method.endswith("/FetchExpert")]


REFUSAL = "this server needs its token: metadata \"authorization: Bearer <token>\""


class AsyncTokenCheck(grpc.aio.ServerInterceptor):
    def __init__(self, token):
        self.check = TokenCheck(token)

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
        self.refusals = {False: grpc.unary_unary_rpc_method_handler(refuse),
                         True: grpc.unary_stream_rpc_method_handler(refuse)}

    async def intercept_service(self, continuation, details):
        if self.check.authorized(details):
            return await continuation(details)
        return self.refusals[details.method.endswith("/FetchExpert")]


def parse_hold(spec, n_experts):
    """Sorted expert ids of a --hold SPEC: comma-separated ids and ranges A-B ("0-31", "0-3,8,12-15"),
    each within the model's `n_experts`.  ValueError naming the malformed part or the id out of range."""
    ids = set()
    for part in str(spec).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part, re.ASCII)
        if m is None:
            raise ValueError(f"--hold {spec}: {part.strip()!r} is not an expert id or a range A-B "
                             f"(e.g. --hold 0-31 or 0-3,8,12-15)")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if first > last:
            raise ValueError(f"--hold {spec}: the range {part.strip()} runs backwards")
        if last >= n_experts:
            raise ValueError(f"--hold {spec}: expert {last} is past the model's {n_experts} experts per layer "
                             f"(ids 0 to {n_experts - 1})")
        ids.update(range(first, last + 1))
    return sorted(ids)


def parse_listen(text):
    """(host, port) of HOST:PORT, [IPv6]:PORT, :PORT or PORT (host: 127.0.0.1)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {text!r}: give HOST:PORT (port 0: any free port)")
    return host, int(port)


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def event_loop():
    """The asyncio loop every expert server of this process runs on, in a daemon thread (gRPC's
    asyncio objects belong to the loop they were made on: one loop serves them all)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="colibri-serve", daemon=True).start()
    return _loop


_loop, _loop_lock = None, threading.Lock()


class Served:
    """A started server on event_loop(); stop(grace) ends it (calls in flight get `grace` seconds)
    and returns an Event set once it has stopped, as grpc.Server.stop does."""

    def __init__(self, server):
        self.server = server

    def stop(self, grace=None):
        stopped = threading.Event()
        asyncio.run_coroutine_threadsafe(self.server.stop(grace), event_loop()).add_done_callback(
            lambda _: stopped.set())
        return stopped


def start(model_dir, listen="127.0.0.1:50051", *, token=None, tls_cert=None, tls_key=None, insecure=False,
          kernels="auto", batch=DEFAULT_BATCH, threads=0, max_message=None, fetch=True, queue=DEFAULT_QUEUE,
          hold=None):
    """(Served, ExpertsService, "host:port" bound); the caller closes the service once the server has
    stopped.  ValueError for an unsafe or malformed setup
    (a non-loopback address needs a token and TLS unless `insecure`) or an address it cannot bind."""
    host, port = parse_listen(listen)
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    if not is_loopback(host) and not (token and tls_cert) and not insecure:
        raise ValueError(f"--listen {listen}: a non-loopback address is reachable by other machines, so it needs "
                         f"both a token (--token or --token-file) and TLS (--tls-cert, --tls-key); "
                         f"--insecure serves it without them")
    creds = check_listen(host, port, tls_cert, tls_key)   # before the model and the gRPC server: fails at once
    service = ExpertsService(model_dir, kernels=kernels, batch=batch, threads=threads, max_message=max_message,
                             fetch=fetch, queue=queue, hold=hold)
    options = [("grpc.max_receive_message_length", service.max_message),
               ("grpc.max_send_message_length", max(service.max_message, CHUNK + SLACK)),   # a FetchExpert chunk
               ("grpc.so_reuseport", 0),   # a second server on a taken port fails instead of sharing it
               ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
               ("grpc.keepalive_time_ms", KEEPALIVE_S[0] * 1000),
               ("grpc.keepalive_timeout_ms", KEEPALIVE_S[1] * 1000)]

    async def serve():
        server = grpc.aio.server(options=options, interceptors=[AsyncTokenCheck(token)] if token else [])
        rpc.add_ExpertsServicer_to_server(service, server)
        address, bound = bind(server, host, port, creds)
        await server.start()
        return server, address, bound

    try:
        server, address, bound = asyncio.run_coroutine_threadsafe(serve(), event_loop()).result()
    except ValueError:
        service.close()
        raise
    return Served(server), service, address.rsplit(":", 1)[0] + f":{bound}"


def probe_port(host, port):
    """ValueError naming the address and the cause when (host, port) cannot be listened on.  Called
    before a gRPC server exists too: one made and dropped at exit races its own poller thread,
    which may abort the process ("epoll_wait error: Bad file descriptor") instead of the clear
    line."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:   # as gRPC binds: SO_REUSEADDR, no SO_REUSEPORT
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        why = e.strerror or str(e)   # "Address already in use", "Cannot assign requested address"
        raise ValueError(f"cannot listen on {address}: {why}") from None


def check_listen(host, port, tls_cert=None, tls_key=None):
    """The gRPC credentials to listen with (None: no TLS), after checking what gRPC would only log
    when asked: the certificate and key are a pair, and (host, port) can be listened on.
    ValueError naming the address and the cause.  Called before any gRPC server exists (probe_port
    says why)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    creds = None
    if tls_cert:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tls_cert, tls_key)
        except ssl.SSLError as e:
            raise ValueError(f"cannot serve TLS on {address}: --tls-cert {tls_cert} and --tls-key {tls_key} are not "
                             f"a certificate (PEM) and its private key ({e.reason or e})") from None
        creds = grpc.ssl_server_credentials([(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])
    probe_port(host, port)
    return creds


def bind(server, host, port, creds=None):
    """Adds the listening port to a grpc server (threads or asyncio), TLS when given check_listen's
    credentials: (address, port bound).  ValueError when the port was taken since it was checked."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError:   # gRPC 1.5x+: raised where older versions returned 0
        bound = 0
    if not bound:
        raise ValueError(f"cannot listen on {address} (taken since it was tried, or not an address of this machine)")
    return address, bound


def main(args):
    """`colibri serve-experts`: serve until SIGTERM or SIGINT; with --etcd, announced in etcd meanwhile
    (colibri.remote.fleet.Announcer) and the announcement revoked first at the stop."""
    from colibri.remote.etcd import EtcdError
    from colibri.remote.fleet import Announcer, advertised_address

    try:
        token = read_token_file(args.token_file) if args.token_file else args.token
        if args.etcd:   # checked before the model is read
            from colibri.remote.etcd import Etcd
            store = Etcd(args.etcd)
            advertised_address(*parse_listen(args.listen), args.advertise)
        elif args.advertise:
            raise ValueError(f"--advertise {args.advertise} is the address announced in etcd: give --etcd too")
        server, service, address = start(
            args.model, args.listen, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
            insecure=args.insecure, kernels=args.kernels, batch=args.batch, threads=args.threads,
            max_message=None if args.max_message is None else int(args.max_message * (1 << 20)),
            fetch=not args.no_fetch, queue=args.queue, hold=args.hold)
    except (ValueError, OSError) as e:
        raise SystemExit(f"colibri serve-experts: {e}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    announcer = None
    if args.etcd:
        try:
            advertised = advertised_address(*parse_listen(address), args.advertise)
            announcer = Announcer.for_service(store, args.etcd_prefix, advertised, service, args.lease_ttl)
        except EtcdError as e:
            server.stop(0).wait()
            service.close()
            raise SystemExit(f"colibri serve-experts: cannot announce this server in etcd: {e}")
    print(f"colibri serve-experts: {address} serving {service.model.path} (model {short(service.hash)}, "
          f"kernels {service.session.kernels}, max_rows {service.max_rows}, queue {service.queue}, "
          f"{'TLS' if args.tls_cert else 'no TLS'}, {'token' if token else 'no token'}"
          f"{', fetch' if service.fetch else ''}{f', experts {args.hold}' if args.hold is not None else ''})"
          f"{f'; announced as {announcer.key} (lease {args.lease_ttl} s)' if announcer else ''}", flush=True)
    while not stop.wait(3600):
        pass
    if announcer is not None:
        try:
            announcer.close(revoke=True)   # the edges stop calling before the calls in flight are finished
        except EtcdError as e:
            print(f"colibri serve-experts: the announcement stays until its lease expires: {e}", file=sys.stderr)
    server.stop(grace=1).wait()
    service.close()
    counts = ", ".join(f"{k} {v}" for k, v in service.stats().items() if k != "queued")
    print(f"colibri serve-experts: stopped ({counts})", flush=True)
    return 0

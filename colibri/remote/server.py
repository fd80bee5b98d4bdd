"""The Experts service (`colibri serve-experts`): one model, one session, its experts computed for
the edges that call it and its weights served to those that fetch them.  docs/DEVICES.md.

    colibri serve-experts --model out/model --listen 127.0.0.1:50051
    colibri serve-experts --model out/model --listen 0.0.0.0:50051 --token-file tok --tls-cert c.pem --tls-key k.pem

The server is gRPC's asyncio server on one event loop thread: a call waiting on its client (a request
not sent yet, a reply the client does not read) holds a coroutine, not a thread, so no client can
take the server from the others.  The session is not thread-safe: Computes run one at a time on the
loop's thread, in the order they arrive (handing them to another thread cost a millisecond a call;
Info and FetchExpert wait at most for the Compute running).  Every request is checked before it reaches the core; what
the core refuses (COLIBRI_E_ARG) is INVALID_ARGUMENT too, never a crash.  The model is read into
memory (Model(copy=True)), not mapped, so weights.bin truncated or rewritten under the server is a
DATA_LOSS answer, not a SIGBUS.
"""
import asyncio
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


def short(digest):
    """A hash's first 6 bytes in hex, for messages."""
    return digest[:6].hex() if digest else "(none)"


class ExpertsService(rpc.ExpertsServicer):
    """Compute and FetchExpert for the model at `model_dir`.  `batch`: the largest prefill chunk of
    the edges served (a call carries at most batch * top_k rows); `max_message`: bytes one message
    may take (default: what the largest call needs), fewer rows per call when smaller; `hold`: the
    routed experts it computes, a --hold SPEC ("0-31", "0-3,8"; None: all), the same ids in every
    MoE layer (a fleet's servers share the experts out: colibri.remote.fleet)."""

    def __init__(self, model_dir, *, kernels="auto", batch=DEFAULT_BATCH, threads=0, max_message=None, fetch=True,
                 hold=None):
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
            self.close()
            raise ValueError(str(e)) from None

    def close(self):
        os.close(self.weights)

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
        x = np.frombuffer(request.x, dtype="<f4").reshape(int(rows[-1]), self.hidden)
        x = x.astype(np.float32)   # a writable copy in native order: compute_experts takes no read-only buffer
        experts = np.array(request.experts, dtype=np.int32)
        try:
            start = time.perf_counter_ns()
            y = self.session.compute_experts(request.layer, experts, rows, x)   # the GIL is released meanwhile
            elapsed = time.perf_counter_ns() - start
        except colibri.Error as e:
            code = grpc.StatusCode.INVALID_ARGUMENT if e.status == "COLIBRI_E_ARG" else grpc.StatusCode.INTERNAL
            await context.abort(code, f"layer {request.layer}: {e}")
        except (ValueError, TypeError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"layer {request.layer}: {e}")
        return pb.ComputeReply(y=y.astype("<f4", copy=False).tobytes(), compute_ns=elapsed)

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
          kernels="auto", batch=DEFAULT_BATCH, threads=0, max_message=None, fetch=True, hold=None):
    """(Served, ExpertsService, "host:port" bound).  ValueError for an unsafe or malformed setup
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
                             fetch=fetch, hold=hold)
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
            fetch=not args.no_fetch, hold=args.hold)
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
          f"kernels {service.session.kernels}, max_rows {service.max_rows}, "
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
    return 0

"""The Experts service (`colibri serve-experts`): one model, one session, its experts computed for
the edges that call it and its weights served to those that fetch them.  docs/DEVICES.md.

    colibri serve-experts --model out/model --listen 127.0.0.1:50051
    colibri serve-experts --model out/model --listen 0.0.0.0:50051 --token-file tok --tls-cert c.pem --tls-key k.pem

The session is not thread-safe: requests compute one at a time under a lock, in the order gRPC's
workers take them.  Every request is checked before it reaches the core; what the core refuses
(COLIBRI_E_ARG) is INVALID_ARGUMENT too, never a crash.
"""
import hmac
import ipaddress
import os
import signal
import threading
import time
import zlib
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np

import colibri
from colibri.remote import colibri_remote_pb2 as pb
from colibri.remote import colibri_remote_pb2_grpc as rpc
from colibri.remote import expert_layout, model_hash

CHUNK = 256 << 10       # FetchExpert's chunk
SLACK = 64 << 10        # a message's bytes besides its tensor: ids, offsets, hash, framing
DEFAULT_BATCH = 64      # the core's default prefill chunk


def short(digest):
    """A hash's first 6 bytes in hex, for messages."""
    return digest[:6].hex() if digest else "(none)"


class ExpertsService(rpc.ExpertsServicer):
    """Compute and FetchExpert for the model at `model_dir`.  `batch`: the largest prefill chunk of
    the edges served (a call carries at most batch * top_k rows); `max_message`: bytes one message
    may take (default: what the largest call needs), fewer rows per call when smaller."""

    def __init__(self, model_dir, *, kernels="auto", batch=DEFAULT_BATCH, threads=0, max_message=None, fetch=True):
        self.model = colibri.Model(model_dir, threads=threads)
        cfg = self.model.config
        self.hash = model_hash(model_dir)
        self.hidden = cfg["hidden_size"]
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
        self.layout = expert_layout(self.model)
        self.expert_bytes = max((sum(size for _, size, _ in parts) for parts in self.layout.values()), default=0)
        self.fetch = fetch and bool(self.layout)
        self.weights = os.open(Path(model_dir) / "weights.bin", os.O_RDONLY)
        self.lock = threading.Lock()

    def close(self):
        os.close(self.weights)

    def _check_model(self, digest, context):
        if digest != self.hash:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"the request is for model {short(digest)}, this server serves {short(self.hash)} "
                          f"({self.model.path})")

    def Info(self, request, context):
        cfg = self.model.config
        return pb.InfoReply(model_hash=self.hash, n_layers=cfg["num_layers"], n_experts=cfg["num_experts"],
                            hidden_size=self.hidden, kernels=self.session.kernels, max_rows=self.max_rows,
                            expert_bytes=self.expert_bytes, fetch=self.fetch)

    def Compute(self, request, context):
        self._check_model(request.model_hash, context)
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
        if bad:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"layer {request.layer}: {bad}")
        x = np.frombuffer(request.x, dtype="<f4").reshape(int(rows[-1]), self.hidden)
        x = x.astype(np.float32)   # a writable copy in native order: compute_experts takes no read-only buffer
        experts = np.array(request.experts, dtype=np.int32)
        with self.lock:
            start = time.perf_counter_ns()
            try:
                y = self.session.compute_experts(request.layer, experts, rows, x)
            except colibri.Error as e:
                code = grpc.StatusCode.INVALID_ARGUMENT if e.status == "COLIBRI_E_ARG" else grpc.StatusCode.INTERNAL
                context.abort(code, f"layer {request.layer}: {e}")
            except (ValueError, TypeError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"layer {request.layer}: {e}")
            elapsed = time.perf_counter_ns() - start
        return pb.ComputeReply(y=y.astype("<f4", copy=False).tobytes(), compute_ns=elapsed)

    def FetchExpert(self, request, context):
        self._check_model(request.model_hash, context)
        if not self.fetch:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "this server does not serve expert weights "
                          "(serve-experts --no-fetch, or a model without routed experts)")
        n_experts = self.model.config["num_experts"]
        if request.layer not in self.layout or not 0 <= request.expert < n_experts:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"no expert {request.expert} in layer {request.layer}: the layers with routed experts "
                          f"are {sorted(self.layout)}, each of {n_experts} experts")
        parts = [(offset + request.expert * step, size) for offset, size, step in self.layout[request.layer]]
        total = sum(size for _, size in parts)
        done, crc = 0, 0
        for offset, size in parts:
            for start in range(0, size, CHUNK):
                data = os.pread(self.weights, min(CHUNK, size - start), offset + start)
                if len(data) != min(CHUNK, size - start):
                    context.abort(grpc.StatusCode.DATA_LOSS, f"weights.bin ends before byte {offset + size:,}")
                crc = zlib.crc32(data, crc)
                last = done + len(data) == total
                yield pb.WeightChunk(offset=done, data=data, crc32=zlib.crc32(data), total=total,
                                     extent_crc32=crc if last else 0)
                done += len(data)


class TokenCheck(grpc.ServerInterceptor):
    """UNAUTHENTICATED for any call whose metadata lacks "authorization: Bearer <token>"."""

    def __init__(self, token):
        self.expected = f"Bearer {token}".encode()

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "this server needs its token: "
                          "metadata \"authorization: Bearer <token>\"")
        self.refusals = {False: grpc.unary_unary_rpc_method_handler(refuse),
                         True: grpc.unary_stream_rpc_method_handler(refuse)}

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(given.encode(), self.expected):
            return continuation(details)
        return self.refusals[details.method.endswith("/FetchExpert")]


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


def start(model_dir, listen="127.0.0.1:50051", *, token=None, tls_cert=None, tls_key=None, insecure=False,
          kernels="auto", batch=DEFAULT_BATCH, threads=0, max_message=None, fetch=True, workers=8):
    """(grpc.Server started, ExpertsService, "host:port" bound).  ValueError for an unsafe or
    malformed setup: a non-loopback address needs a token and TLS unless `insecure`."""
    host, port = parse_listen(listen)
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    if not is_loopback(host) and not (token and tls_cert) and not insecure:
        raise ValueError(f"--listen {listen}: a non-loopback address is reachable by other machines, so it needs "
                         f"both a token (--token or --token-file) and TLS (--tls-cert, --tls-key); "
                         f"--insecure serves it without them")
    service = ExpertsService(model_dir, kernels=kernels, batch=batch, threads=threads, max_message=max_message,
                             fetch=fetch)
    options = [("grpc.max_receive_message_length", service.max_message),
               ("grpc.max_send_message_length", service.max_message),
               ("grpc.so_reuseport", 0)]   # a second server on a taken port fails instead of sharing it
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=options,
                         interceptors=[TokenCheck(token)] if token else [])
    rpc.add_ExpertsServicer_to_server(service, server)
    try:
        address, bound = bind(server, host, port, tls_cert, tls_key)
    except ValueError:
        service.close()
        raise
    server.start()
    return server, service, address.rsplit(":", 1)[0] + f":{bound}"


def bind(server, host, port, tls_cert=None, tls_key=None):
    """Adds the listening port to a grpc server, TLS when given a certificate: (address, port bound)."""
    import grpc

    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls_cert:
        creds = grpc.ssl_server_credentials([(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])
        bound = server.add_secure_port(address, creds)
    else:
        bound = server.add_insecure_port(address)
    if not bound:
        raise ValueError(f"cannot listen on {address} (in use, or not an address of this machine)")
    return address, bound


def main(args):
    """`colibri serve-experts`: serve until SIGTERM or SIGINT."""
    try:
        token = Path(args.token_file).read_text().strip() if args.token_file else args.token
        if args.token_file and not token:
            raise ValueError(f"{args.token_file} is empty")
        server, service, address = start(
            args.model, args.listen, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
            insecure=args.insecure, kernels=args.kernels, batch=args.batch, threads=args.threads,
            max_message=None if args.max_message is None else int(args.max_message * (1 << 20)),
            fetch=not args.no_fetch)
    except (ValueError, OSError) as e:
        raise SystemExit(f"colibri serve-experts: {e}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"colibri serve-experts: {address} serving {service.model.path} (model {short(service.hash)}, "
          f"kernels {service.session.kernels}, max_rows {service.max_rows}, "
          f"{'TLS' if args.tls_cert else 'no TLS'}, {'token' if token else 'no token'}"
          f"{', fetch' if service.fetch else ''})", flush=True)
    while not stop.wait(3600):
        pass
    server.stop(grace=1).wait()
    service.close()
    return 0

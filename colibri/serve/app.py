"""The ASGI app (starlette) and its server (uvicorn): OpenAI's routes over the scheduler.

    GET  /health               {"status": "ok"}; 503 while the session is being made
    GET  /metrics              Prometheus text
    GET  /v1/models            the one model
    POST /v1/completions       a prompt (text or token ids) continued
    POST /v1/chat/completions  messages through the model's chat template
"""
import asyncio
import contextlib
import hmac
import json
import secrets
import signal
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from colibri.serve import schema
from colibri.serve.metrics import Metrics
from colibri.serve.scheduler import Job, Scheduler, open_batch
from colibri.serve.schema import ApiError

ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions")
OPEN_ENDPOINTS = ("/health",)   # answered without the API key: a load balancer's probe


def create_app(model, scheduler, metrics, *, model_id, api_keys=(), timeout=None):
    """The app over `scheduler` (started and closed with the app's lifespan).  `api_keys`: the
    Bearer tokens taken (none: no auth); `timeout`: seconds from a request's arrival to its end."""
    created = int(time.time())
    templates = None   # the model's chat templates, read at the first chat request

    def render(messages):
        nonlocal templates
        if templates is None:
            from colibri import chat
            templates = chat.read(model.directory)
        text = templates.render(messages, add_generation_prompt=True)
        return model.tokenize(text, add_bos=not templates.writes_bos())

    async def health(request):
        if scheduler.ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "error" if scheduler.load_error else "loading"}, status_code=503)

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                                         "owned_by": "colibri"}]})

    async def prometheus(request):
        gauges = {"colibri_queue_depth": ("Requests waiting for a slot.", scheduler.queue_depth()),
                  "colibri_slots_in_use": ("Sequence slots (KV caches) holding a running request.",
                                           scheduler.slots_in_use()),
                  "colibri_slots": ("Sequence slots of the session (--parallel).", scheduler.n_seq)}
        return PlainTextResponse(metrics.text(gauges, scheduler.cache_stats), media_type="text/plain; version=0.0.4")

    async def completions(request):
        return await generate(request, chat=False)

    async def chat_completions(request):
        return await generate(request, chat=True)

    async def generate(request, chat):
        if not scheduler.ready:
            raise ApiError("the model is loading", status=503, type="server_error", code="loading",
                           headers={"Retry-After": "1"})
        body = schema.parse_json(await request.body())
        if chat:
            req = schema.chat(body, render, model.vocab_size)
        else:
            req = schema.completion(body, model.tokenize, model.vocab_size)
        field = "messages" if chat else "prompt"
        if len(req.prompt) > scheduler.n_ctx:
            raise ApiError(f"'{field}' is {len(req.prompt)} tokens, longer than the context of {scheduler.n_ctx} "
                           f"tokens (--ctx)", field, code="context_length_exceeded")
        if req.max_tokens is None:   # a chat reply without a limit: until it ends or the context is full
            req.max_tokens = scheduler.n_ctx
        job = Job(req, time.monotonic() + timeout if timeout else None)
        scheduler.submit(job)
        watcher = asyncio.create_task(_leaves(request.receive, scheduler, job))
        try:
            first = await job.events.get()
            if first[0] == "error":
                raise first[1]
        except BaseException:
            watcher.cancel()
            scheduler.cancel(job)
            raise
        reply = Reply(chat, model_id, req, reused=first[1])
        if req.stream:
            return StreamingResponse(_events(job, reply, scheduler, watcher), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            pieces = []
            while True:
                event = await job.events.get()
                if event[0] == "error":
                    raise event[1]
                _, text, finish, generated = event
                pieces.append(text)
                if finish is not None:
                    return JSONResponse(reply.whole("".join(pieces), finish, generated))
        finally:
            watcher.cancel()
            scheduler.cancel(job)   # nothing to do once it finished; frees its slot when it did not

    @contextlib.asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        yield
        scheduler.close()

    routes = [Route("/health", health), Route("/metrics", prometheus), Route("/v1/models", models),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error})
    return _Gate(app, metrics, tuple(api_keys))


class Reply:
    """A request's answer in OpenAI's objects: whole, or as stream chunks."""

    def __init__(self, chat, model_id, req, reused):
        self.chat, self.model_id, self.req, self.reused = chat, model_id, req, reused
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def usage(self, generated):
        n = len(self.req.prompt)
        return {"prompt_tokens": n, "completion_tokens": generated, "total_tokens": n + generated,
                "prompt_tokens_details": {"cached_tokens": self.reused}}

    def _object(self, kind, choices):
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_id, "choices": choices}

    def whole(self, text, finish, generated):
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
            body = self._object("chat.completion", [choice])
        else:
            body = self._object("text_completion", [{"index": 0, "text": text, "logprobs": None,
                                                     "finish_reason": finish}])
        body["usage"] = self.usage(generated)
        return body

    def chunk(self, text=None, finish=None, role=False):
        """One chunk: text (chat: a delta with the role first, then content; {} with the finish)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
            body = self._object("chat.completion.chunk", [{"index": 0, "delta": delta, "logprobs": None,
                                                           "finish_reason": finish}])
        else:
            body = self._object("text_completion", [{"index": 0, "text": text or "", "logprobs": None,
                                                     "finish_reason": finish}])
        if self.req.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, generated):
        body = self._object("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = self.usage(generated)
        return body


def _sse(body):
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _events(job, reply, scheduler, watcher):
    """The stream of server-sent events: OpenAI's chunks, then `data: [DONE]`.  A client that
    leaves cancels this generator (starlette listens for the disconnect): its slot is freed."""
    try:
        if reply.chat:
            yield _sse(reply.chunk(role=True))
        while True:
            event = await job.events.get()
            if event[0] == "error":   # the status is sent: the error goes as an event, as OpenAI's streams do
                yield _sse(event[1].body())
                return
            _, text, finish, generated = event
            if text:
                yield _sse(reply.chunk(text))
            if finish is not None:
                yield _sse(reply.chunk(finish=finish))
                if reply.req.include_usage:
                    yield _sse(reply.usage_chunk(generated))
                yield "data: [DONE]\n\n"
                return
    finally:
        watcher.cancel()
        scheduler.cancel(job)


async def _leaves(receive, scheduler, job):
    """Waits for the client to disconnect (the request's body is read: only that comes now)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scheduler.cancel(job)
    # what waits for the answer ends (a stream has ended already: starlette saw the disconnect too)
    job.events.put_nowait(("error", ApiError("the client left", status=499, code="client_closed")))


async def _api_error(request, e):
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _http_error(request, e):   # starlette's own: 404, 405
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    return JSONResponse({"error": {"message": f"{request.method} {request.url.path}: {e.detail}", "type": kind,
                                   "param": None, "code": None}}, status_code=e.status_code, headers=e.headers)


async def _server_error(request, e):   # a bug: the client gets no traceback (the log has it)
    return JSONResponse({"error": {"message": "internal server error", "type": "server_error", "param": None,
                                   "code": None}}, status_code=500)


class _Gate:
    """ASGI middleware around the app: the API key (Bearer, compared in constant time) and each
    answer counted by endpoint and status."""

    def __init__(self, app, metrics, api_keys):
        self.app, self.metrics, self.api_keys = app, metrics, [k.encode() for k in api_keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = None

        async def counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope["path"]
        try:
            if self.api_keys and path not in OPEN_ENDPOINTS and not self._authorized(scope):
                e = ApiError("a valid API key is needed: Authorization: Bearer KEY", status=401, code="invalid_api_key",
                             headers={"WWW-Authenticate": "Bearer"})
                await JSONResponse(e.body(), status_code=401, headers=e.headers)(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:   # 499: the client left before an answer began (nginx's code)
            self.metrics.request(path if path in ENDPOINTS else "other", status or 499)

    def _authorized(self, scope):
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        ok = False
        for key in self.api_keys:   # every key compared: the time does not tell which one nearly matched
            ok |= hmac.compare_digest(token.strip(), key)
        return scheme.lower() == b"bearer" and ok


def serve(model, *, host, port, parallel, queue, timeout, grace, api_keys, model_id, session_options):
    """Runs the server until SIGTERM or SIGINT: then it stops accepting, lets the running requests
    finish for up to `grace` seconds, and returns.  Raises the error that kept the session from
    being made."""
    metrics = Metrics()
    scheduler = Scheduler(lambda: open_batch(model, parallel, **session_options), parallel, queue, metrics)
    app = create_app(model, scheduler, metrics, model_id=model_id, api_keys=api_keys, timeout=timeout)
    server = _Server(uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=grace, access_log=False,
                                    log_level="info", lifespan="on"))
    scheduler.on_fatal = lambda: setattr(server, "should_exit", True)
    server.run()
    if scheduler.load_error is not None:
        raise scheduler.load_error


class _Server(uvicorn.Server):
    """uvicorn's server without its raising the signal again once it has stopped (which would end
    the process by SIGTERM): a graceful stop exits 0."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

"""The scheduler: one thread owns the session and its colibri.Batch (a session is not shared
between threads).  Each turn it takes the requests waiting for a slot into the free ones
(Batch.start computes nothing), ends those whose client left or whose deadline passed, and calls
Batch.step() once for every running request together (the core computes without the GIL: the
event loop serves HTTP meanwhile).  Each request's text reaches its asyncio queue through
loop.call_soon_threadsafe, as events:

    ("started", reused)                       in a slot; `reused` prompt tokens kept from the slot's cache
    ("text", text, finish, generated)         a step's text ('' possible); finish None, or OpenAI's
                                              finish_reason ("stop", "length") on the last event
    ("error", ApiError)                       it cannot start, or the core failed (the last event)
"""
import asyncio
import collections
import threading
import time

import colibri
from colibri.serve.schema import ApiError

# Batch.step's finish -> OpenAI's finish_reason: an end id or a stop string is "stop", the token
# limit or a full context "length" (as OpenAI, llama.cpp's server and vLLM report both)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context_full": "length"}
DEADLINE_FINISH = "length"   # a deadline reached mid-generation: what came so far, as llama.cpp's server's time limit


def open_batch(model, n_seq, **session_options):
    """(batch, session): colibri.Batch over a session of `n_seq` sequence slots."""
    session = model.session(n_seq=n_seq, **session_options)
    return colibri.Batch(session), session


class Job:
    """One request between the event loop (which made it) and the scheduler thread."""

    def __init__(self, request, deadline=None):
        self.request = request          # schema.Request
        self.deadline = deadline        # time.monotonic() after which it ends; None: none
        self.loop = asyncio.get_running_loop()
        self.events = asyncio.Queue()
        self.cancelled = False          # its client left: the scheduler frees its slot
        self.generated = 0              # the scheduler thread's count

    def send(self, *event):
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:   # the loop has closed: the server is gone, and the client with it
            pass


class Scheduler:
    def __init__(self, open_batch, n_seq, queue_limit, metrics, on_fatal=None):
        self.open_batch = open_batch    # () -> (batch, session), called in the thread
        self.n_seq, self.queue_limit, self.metrics = n_seq, queue_limit, metrics
        self.on_fatal = on_fatal        # called from the thread when the session cannot be made
        self.ready = False
        self.load_error = None
        self.n_ctx = None
        self.session = None
        self.cache_stats = None         # the expert cache's counters after the last step (streaming experts)
        self._cond = threading.Condition()
        self._waiting = collections.deque()        # jobs without a slot, oldest first
        self._free = list(range(n_seq))[::-1]      # free slots; the last freed is taken first
        self._running = {}                         # seq -> job: the thread's alone
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="colibri-scheduler", daemon=True)

    # ---- the event loop's side

    def start(self):
        self._thread.start()

    def close(self, timeout=10.0):
        """Ends every request still in the scheduler and the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def submit(self, job):
        """Queues `job`; ApiError 429 (with Retry-After) when Q requests already wait for a slot."""
        with self._cond:
            if self._closing:
                raise ApiError("the server is shutting down", status=503, type="server_error", code="shutting_down")
            if len(self._waiting) >= self.queue_limit + len(self._free):
                raise ApiError(f"the server is busy: {self.n_seq} requests running and {self.queue_limit} waiting; "
                               "retry later", status=429, type="requests", code="rate_limit_exceeded",
                               headers={"Retry-After": "1"})
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job):
        """The client left: a waiting job is dropped, a running one ends at the next step."""
        with self._cond:
            job.cancelled = True
            if job in self._waiting:
                self._waiting.remove(job)
            self._cond.notify()

    def queue_depth(self):
        return len(self._waiting)

    def slots_in_use(self):
        return self.n_seq - len(self._free)

    # ---- the thread

    def _run(self):
        try:
            self.batch, self.session = self.open_batch()
        except Exception as e:   # the session's options refused, an arena too large: the server cannot serve
            self.load_error = e
            if self.on_fatal:
                self.on_fatal()
            return
        self.n_ctx = self.session.n_ctx
        self.ready = True
        while True:
            with self._cond:
                while not (self._waiting or self._running or self._closing):
                    self._cond.wait()
                if self._closing:
                    break
                now = time.monotonic()
                expired = [job for job in self._waiting if _passed(job, now)]
                for job in expired:
                    self._waiting.remove(job)
                admitted = []
                while self._waiting and self._free:
                    job = self._waiting.popleft()
                    seq = self._slot_for(job.request.prompt)
                    self._free.remove(seq)
                    admitted.append((seq, job))
            for job in expired:
                job.send("error", ApiError("the request's deadline passed before a slot was free", status=503,
                                           type="server_error", code="timeout", headers={"Retry-After": "1"}))
            for seq, job in admitted:
                self._start(seq, job)
            for seq, job in list(self._running.items()):
                if job.cancelled or _passed(job, now):
                    self._end(seq)
                    if not job.cancelled:
                        job.send("text", "", DEADLINE_FINISH, job.generated)
            if self._running:
                self._step()
        for seq in list(self._running):
            self._end(seq)

    def _slot_for(self, prompt):
        """The free slot whose cache holds the longest prefix of `prompt` when that prefix is at least
        half of what the slot or the prompt holds (a system prompt, an earlier turn: Batch.start keeps
        it); else an empty slot, else the one freed longest ago, so that a slot's cache outlives the
        requests that could not use it."""
        held = {seq: self.session.seq_tokens(seq) for seq in self._free}
        shared = {seq: next((i for i, (a, b) in enumerate(zip(held[seq], prompt)) if a != b),
                            min(len(held[seq]), len(prompt))) for seq in self._free}
        best = max(reversed(self._free), key=shared.get)   # the last freed among equals
        if shared[best] and 2 * shared[best] >= min(len(held[best]), len(prompt)):
            return best
        return next((seq for seq in self._free if not held[seq]), self._free[0])

    def _start(self, seq, job):
        try:
            reused = self.batch.start(seq, job.request.prompt, **job.request.start_options())
        except (ValueError, colibri.Error) as e:   # what the core refuses: stop strings, a prompt without room
            self._release(seq)
            job.send("error", ApiError(str(e), "stop" if "stop" in str(e) else None))
            return
        self._running[seq] = job
        self.metrics.tokens(prompt=len(job.request.prompt))
        job.send("started", reused)

    def _step(self):
        t0 = time.perf_counter()
        try:
            produced = self.batch.step()
        except colibri.Error as e:   # a core failure (a streamed expert's read, a device): those running end
            for seq, job in list(self._running.items()):
                self._end(seq)
                job.send("error", ApiError(f"the model failed: {e}", status=500, type="server_error"))
            return
        self.metrics.step(time.perf_counter() - t0)
        n_tokens = 0
        for seq, token, text, finish in produced:
            job = self._running[seq]
            if token is not None and token >= 0:
                job.generated += 1
                n_tokens += 1
            if finish is not None:
                del self._running[seq]
                self._release(seq)
            job.send("text", text, FINISH_REASONS.get(finish, finish), job.generated)
        self.metrics.tokens(generated=n_tokens)
        if self.session.expert_budget:
            self.cache_stats = self.session.expert_cache_stats()

    def _end(self, seq):
        self.batch.cancel(seq)
        del self._running[seq]
        self._release(seq)

    def _release(self, seq):
        with self._cond:
            self._free.append(seq)


def _passed(job, now):
    return job.deadline is not None and now >= job.deadline

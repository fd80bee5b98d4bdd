"""`colibri serve` as a subprocess on a free port, spoken to with the official openai client, httpx
and curl: every text and usage count is checked against a Session of the same model run alone
(Session.stream_text: the core's generation and text stream), with the same kernels, in strict
mode unless COLIBRI_KERNELS names others (the reference kernels: each sequence's text is then the
one it has alone, however many run beside it).  The model is the bundled one with a chat template
in its style and room for 8192 positions, so that a generation can run long enough to be cut,
left or outlived by a signal."""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

import colibri
from colibri import chat
from colibri.demo import MODEL_DIR

openai = pytest.importorskip("openai")

TEMPLATE = ("{%- for m in messages %}{{ m.role | upper }}:\n{{ m.content }}\n\n{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}")
CTX = 8192
KERNELS = os.environ.get("COLIBRI_KERNELS", "reference")   # strict mode unless the run names others
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo,", "KING HENRY:", "First Citizen:\nBefore we proceed", "HAMLET:\nTo be",
           "OTHELLO:", "LADY MACBETH:\nOut,", "PROSPERO:", "FALSTAFF:", "VIOLA:\nI left", "BRUTUS:",
           "PORTIA:\nThe quality", "LEAR:\nBlow, winds,", "PUCK:", "IAGO:", "CORIOLANUS:\nYou common cry"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The bundled model with a chat template and 8192 positions (RoPE takes any)."""
    out = tmp_path_factory.mktemp("serve-model")
    doc = json.loads((MODEL_DIR / "colibri_model.json").read_text())
    doc["hparams"]["max_position_embeddings"] = CTX
    (out / "colibri_model.json").write_text(json.dumps(doc))
    for name in ("weights.bin", "tokenizer.json"):
        os.symlink(MODEL_DIR / name, out / name)
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


class Reference:
    """What a Session of the same model gives alone: the text, the tokens generated, the finish."""

    def __init__(self, model_dir, kernels=KERNELS):
        self.model = colibri.Model(model_dir)
        self.session = self.model.session(ctx=CTX, kernels=kernels)
        self.add_bos = not chat.read(model_dir).writes_bos()

    def chat_ids(self, messages):
        return self.model.tokenize(self.model.apply_chat_template(messages), add_bos=self.add_bos)

    def run(self, ids, max_tokens, stop=(), temperature=0.0, **sampling):
        self.session.reset()
        text = "".join(self.session.stream_text(ids, stop=stop, max_tokens=max_tokens, temperature=temperature,
                                                **sampling))
        finish = {"eos": "stop", "stop": "stop", "max_tokens": "length",
                  "context_full": "length"}[self.session.stop_reason]
        return text, len(self.session.tokens) - len(ids), finish


@pytest.fixture(scope="module")
def ref(model_dir):
    return Reference(model_dir)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`colibri serve --model DIR FLAGS` (the installed colibri), up once /health answers 200."""

    def __init__(self, model_dir, tmp_path, *flags, wait=True, kernels=KERNELS):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"serve-{self.port}.log"
        env = {**os.environ, "COLIBRI_KERNELS": kernels}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "colibri", "serve", "--model", str(model_dir),
                                          "--port", str(self.port), "--ctx", str(CTX), *map(str, flags)],
                                         cwd="/", env=env, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"colibri serve exited {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"colibri serve not healthy within {timeout} s: {self.output()}")

    def output(self):
        return self.log.read_text(errors="replace")

    def client(self, **kwargs):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kwargs.pop("api_key", "none"), max_retries=0,
                             **kwargs)

    def metrics(self, **headers):
        """{name or name{labels}: value} of /metrics."""
        text = httpx.get(f"{self.url}/metrics", headers=headers, timeout=10).text
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.MULTILINE)}

    def wait_metric(self, name, want, timeout=30):
        deadline = time.monotonic() + timeout
        while (value := self.metrics().get(name)) != want:
            assert time.monotonic() < deadline, f"{name} stays {value}, not {want}"
            time.sleep(0.02)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"colibri serve did not stop on SIGTERM: {self.output()}")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    s = Server(model_dir, tmp_path_factory.mktemp("serve"), "--parallel", 8, "--queue", 64)
    yield s
    t0 = time.monotonic()
    assert s.stop() == 0, s.output()
    assert time.monotonic() - t0 < 10, "a request's handler outlived its client (the grace is 30 s)"


def sse_events(response):
    """The `data:` payloads of a server-sent event stream, [DONE] included."""
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


# ---------------------------------------------------------------------------------------- answers

def test_completion_text_and_usage_are_a_sessions(server, ref, model_dir):
    ids = ref.model.tokenize("ROMEO:")
    text, generated, finish = ref.run(ids, 24)
    r = server.client().completions.create(model="shakespeare", prompt="ROMEO:", max_tokens=24, temperature=0)
    assert r.object == "text_completion" and r.model == model_dir.name
    assert r.choices[0].text == text and r.choices[0].finish_reason == finish
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
        (len(ids), generated, len(ids) + generated)
    # token ids as the prompt: the same
    r = server.client().completions.create(model="shakespeare", prompt=list(ids), max_tokens=24, temperature=0)
    assert r.choices[0].text == text and r.usage.prompt_tokens == len(ids)


def test_completion_streamed_with_usage(server, ref):
    ids = ref.model.tokenize("JULIET:")
    text, generated, finish = ref.run(ids, 32)
    chunks = list(server.client().completions.create(model="shakespeare", prompt="JULIET:", max_tokens=32,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == generated
    assert chunks[-1].usage.prompt_tokens == len(ids) and all(c.usage is None for c in chunks[:-1])


def test_sampling_with_a_seed_is_a_sessions(server, ref):
    ids = ref.model.tokenize("HAMLET:")
    text, _, _ = ref.run(ids, 40, temperature=0.9, top_p=0.9, seed=1234)
    for _ in range(2):
        r = server.client().completions.create(model="m", prompt="HAMLET:", max_tokens=40, temperature=0.9,
                                               top_p=0.9, seed=1234)
        assert r.choices[0].text == text


def test_the_extensions_llama_servers_clients_send(server, ref):
    """top_k, min_p, repeat_penalty and ignore_eos (llama.cpp's server and vLLM take them beside OpenAI's
    fields): the Session's text with the same options; ignore_eos runs to max_tokens."""
    ids = ref.model.tokenize("PUCK:")
    options = dict(temperature=0.8, top_k=20, min_p=0.05, repeat_penalty=1.3, seed=7)
    text, generated, finish = ref.run(ids, 48, stop_at_eos=False, **options)
    r = server.client().completions.create(model="m", prompt="PUCK:", max_tokens=48, temperature=0.8, seed=7,
                                           extra_body={"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.3,
                                                       "ignore_eos": True})
    assert r.choices[0].text == text and r.usage.completion_tokens == generated == 48 and finish == "length"


def test_a_shared_prompt_prefix_is_computed_once(model_dir, tmp_path, ref):
    """A request is put in the free slot whose cache holds the longest prefix of its prompt, however
    many requests ran since (usage.prompt_tokens_details.cached_tokens), and answers what it answers
    alone."""
    s = Server(model_dir, tmp_path, "--parallel", 2)
    try:
        system = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
        client = s.client()
        client.completions.create(model="m", prompt=system + "\nJULIET:", max_tokens=4, temperature=0)
        client.completions.create(model="m", prompt="HAMLET:", max_tokens=4, temperature=0)   # the other slot, freed last
        prompt = system + "\nMERCUTIO:"
        ids, shared = ref.model.tokenize(prompt), ref.model.tokenize(system + "\nJULIET:")
        common = next(i for i, (a, b) in enumerate(zip(ids, shared)) if a != b)
        text, _, _ = ref.run(ids, 16)
        r = client.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens == common > 20 and r.choices[0].text == text
    finally:
        assert s.stop() == 0, s.output()


def test_chat_plain_and_streamed(server, ref):
    messages = [{"role": "system", "content": "Speak as the Prince."}, {"role": "user", "content": "Who goes there?"}]
    ids = ref.chat_ids(messages)
    text, generated, finish = ref.run(ids, 40)
    r = server.client().chat.completions.create(model="shakespeare", messages=messages, max_tokens=40, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == finish
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), generated)
    r = server.client().chat.completions.create(model="shakespeare", messages=messages, max_completion_tokens=40,
                                                temperature=0)
    assert r.choices[0].message.content == text

    # the stream's frames as OpenAI sends them: the role first, then content, the finish, [DONE]
    body = {"model": "shakespeare", "messages": messages, "max_tokens": 40, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and deltas[-1] == {}
    assert "".join(d.get("content", "") for d in deltas) == text
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [finish]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings(server, ref, stream):
    ids = ref.model.tokenize("ROMEO:")
    whole, _, _ = ref.run(ids, 48)
    stop = [whole[len(whole) // 2: len(whole) // 2 + 3], "\u2603never"]   # one the greedy text reaches
    text, generated, finish = ref.run(ids, 48, stop=stop)
    assert finish == "stop" and len(text) < len(whole)
    r = server.client().completions.create(model="m", prompt="ROMEO:", max_tokens=48, temperature=0, stop=stop,
                                           stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}))
    if stream:
        chunks = list(r)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].usage.completion_tokens == generated
    else:
        assert r.choices[0].text == text and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == generated


def test_sixteen_concurrent_clients_each_get_their_run_alone(server, ref):
    sixteen_clients(server, ref)


def test_sixteen_clients_with_the_avx2_kernels(model_dir, tmp_path):
    """The same with the AVX2 kernels (the machines CI runs on have them, or AVX-512 beside them)."""
    if not colibri.kernel_variants().get("avx2"):
        pytest.skip("this CPU does not run the avx2 kernels")
    s = Server(model_dir, tmp_path, "--parallel", 8, kernels="avx2")
    try:
        sixteen_clients(s, Reference(model_dir, kernels="avx2"))
    finally:
        assert s.stop() == 0, s.output()


def sixteen_clients(server, ref):
    """16 clients at once, half streamed: each answer is its prompt's run alone."""
    expected = [ref.run(ref.model.tokenize(p), 48) for p in PROMPTS]

    def ask(i):
        client = server.client()
        if i % 2:
            r = client.completions.create(model="m", prompt=PROMPTS[i], max_tokens=48, temperature=0)
            return r.choices[0].text, r.usage.completion_tokens
        chunks = list(client.completions.create(model="m", prompt=PROMPTS[i], max_tokens=48, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, range(len(PROMPTS))))
    assert answers == [(text, generated) for text, generated, _ in expected]


def test_curl(server, ref):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl")
    text, _, _ = ref.run(ref.model.tokenize("PUCK:"), 16)
    out = subprocess.run([curl, "-sS", f"{server.url}/v1/completions", "-H", "Content-Type: application/json",
                          "-d", json.dumps({"prompt": "PUCK:", "max_tokens": 16, "temperature": 0})],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out)["choices"][0]["text"] == text


def test_models_health_and_metrics(server, model_dir):
    assert [m.id for m in server.client().models.list().data] == [model_dir.name]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    before = server.metrics()
    r = server.client().completions.create(model="m", prompt="IAGO:", max_tokens=5, temperature=0)
    after = server.metrics()
    assert after['colibri_requests_total{endpoint="/v1/completions",status="200"}'] == \
        before.get('colibri_requests_total{endpoint="/v1/completions",status="200"}', 0) + 1
    assert after["colibri_generated_tokens_total"] - before["colibri_generated_tokens_total"] == r.usage.completion_tokens
    assert after["colibri_prompt_tokens_total"] - before["colibri_prompt_tokens_total"] == r.usage.prompt_tokens
    assert after["colibri_slots"] == 8 and after["colibri_slots_in_use"] == 0 and after["colibri_queue_depth"] == 0
    assert after['colibri_decode_step_seconds_bucket{le="+Inf"}'] == after["colibri_decode_step_seconds_count"] > 0


# ---------------------------------------------------------------------------------------- stress

def test_a_client_that_leaves_frees_its_slot(server):
    n = CTX - 100   # far more than can come before the client leaves
    before = server.metrics()["colibri_generated_tokens_total"]
    body = {"prompt": "ROMEO:", "max_tokens": n, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert server.metrics()["colibri_slots_in_use"] == 1
    server.wait_metric("colibri_slots_in_use", 0)
    # the generation ended when the client left, far before its max_tokens
    assert server.metrics()["colibri_generated_tokens_total"] - before < n

    # one waiting for a whole answer, leaving before it comes
    before = server.metrics()["colibri_generated_tokens_total"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, timeout=0.5)
    server.wait_metric("colibri_slots_in_use", 0)
    assert server.metrics()["colibri_generated_tokens_total"] - before < n
    server.wait_metric('colibri_requests_total{endpoint="/v1/completions",status="499"}', 1)


def test_400s_name_the_field(server):
    def post(path, content):
        r = httpx.post(f"{server.url}{path}", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        return error

    assert post("/v1/completions", b'{"prompt": "x", ')["code"] == "invalid_json"
    assert post("/v1/completions", b'\xff\xfe')["code"] == "invalid_json"
    assert post("/v1/completions", b'[1, 2]')["code"] == "invalid_json"
    assert post("/v1/completions", b'{"prompt": "x", "temperature": NaN}')["code"] == "invalid_json"
    for field, value in [("temperature", "hot"), ("max_tokens", 1.5), ("stream", "yes"), ("seed", True),
                         ("top_p", 1.5), ("n", 2), ("max_tokens", 0), ("stop", 7), ("logit_bias", {"x": 1}),
                         ("echo", True)]:
        error = post("/v1/completions", json.dumps({"prompt": "x", field: value}))
        assert error["param"] == field and f"'{field}'" in error["message"], error
    assert post("/v1/completions", json.dumps({"prompt": {"text": "x"}}))["param"] == "prompt"
    assert post("/v1/completions", json.dumps({"prompt": [5, 1 << 40]}))["param"] == "prompt"

    # the core's limit on stop strings (colibri.h's COLIBRI_MAX_STOPS: 16)
    assert "stop" in post("/v1/completions", json.dumps({"prompt": "x", "stop": [f"s{i}" for i in range(17)]}))["message"]
    # a prompt longer than the context: both lengths named
    error = post("/v1/completions", json.dumps({"prompt": [65] * (CTX + 1)}))
    assert error["param"] == "prompt" and str(CTX + 1) in error["message"] and str(CTX) in error["message"]
    assert error["code"] == "context_length_exceeded"

    chat = "/v1/chat/completions"
    assert post(chat, json.dumps({"messages": [{"role": "wizard", "content": "x"}]}))["param"] == "messages[0].role"
    assert post(chat, json.dumps({"messages": []}))["param"] == "messages"
    assert post(chat, json.dumps({"messages": [{"role": "user", "content": 3}]}))["param"] == "messages[0].content"
    assert post(chat, json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}))["param"] == "n"

    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{server.url}/v1/completions").status_code == 405


def post_until_closed(client, url, body):
    try:
        client.post(url, json=body)
    except httpx.TransportError:   # the test closed the client
        pass


def test_a_full_queue_answers_429_with_retry_after(model_dir, tmp_path):
    s = Server(model_dir, tmp_path, "--parallel", 1, "--queue", 1)
    try:
        body = {"prompt": "ROMEO:", "max_tokens": CTX - 100, "temperature": 0, "stream": True}
        with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
            with a.stream("POST", f"{s.url}/v1/completions", json=body) as running:
                lines = running.iter_lines()   # held: a dropped iterator closes the connection
                next(line for line in lines if line.startswith("data: "))   # in the slot
                waiting = threading.Thread(target=post_until_closed, args=(b, f"{s.url}/v1/completions", body),
                                           daemon=True)
                waiting.start()
                s.wait_metric("colibri_queue_depth", 1)
                r = httpx.post(f"{s.url}/v1/completions", json=body)
                assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
                with pytest.raises(openai.RateLimitError):
                    s.client().completions.create(model="m", prompt="x", max_tokens=1)
            b.close()   # the waiting one leaves too
        s.wait_metric("colibri_slots_in_use", 0)
        s.wait_metric("colibri_queue_depth", 0)
        assert s.metrics()['colibri_requests_total{endpoint="/v1/completions",status="429"}'] == 2
    finally:
        assert s.stop() == 0, s.output()


def test_a_deadline_ends_a_generation_with_what_it_has(model_dir, tmp_path, ref):
    s = Server(model_dir, tmp_path, "--parallel", 1, "--timeout", 1)
    try:
        r = s.client().completions.create(model="m", prompt="ROMEO:", max_tokens=CTX - 100, temperature=0)
        assert r.choices[0].finish_reason == "length" and 0 < r.usage.completion_tokens < CTX - 100
        text, _, _ = ref.run(ref.model.tokenize("ROMEO:"), r.usage.completion_tokens)
        assert r.choices[0].text == text
    finally:
        assert s.stop() == 0, s.output()


def test_api_key(model_dir, tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("\nsecret-one\nsecret-two\n")
    s = Server(model_dir, tmp_path, "--api-key-file", key_file)
    try:
        body = {"prompt": "x", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic secret-one"},
                        {"Authorization": "Bearer secret-on"}):
            r = httpx.post(f"{s.url}/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        assert httpx.get(f"{s.url}/health").status_code == 200   # a load balancer's probe needs no key
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").completions.create(model="m", prompt="x", max_tokens=2)
        for key in ("secret-one", "secret-two"):
            assert s.client(api_key=key).completions.create(model="m", prompt="x", max_tokens=2).usage.completion_tokens == 2
    finally:
        assert s.stop() == 0, s.output()


def test_off_loopback_it_refuses_to_start_without_a_key(model_dir, tmp_path):
    r = subprocess.run([sys.executable, "-m", "colibri", "serve", "--model", str(model_dir), "--host", "0.0.0.0",
                        "--port", str(free_port())], cwd="/", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--api-key-file" in r.stderr and "--insecure" in r.stderr


def test_sigterm_finishes_the_running_request_and_exits_0(model_dir, tmp_path):
    s = Server(model_dir, tmp_path, "--parallel", 2)
    n = 1000   # long enough to be mid-stream when the signal comes
    body = {"prompt": "ROMEO:", "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert s.metrics()["colibri_slots_in_use"] == 1   # running when the signal comes
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):   # no longer accepting
            httpx.get(f"{s.url}/health")
        events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-3])["choices"][0]["finish_reason"] == "length"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == n   # all of it, after the signal
    assert s.proc.wait(60) == 0, s.output()


def test_sigterm_ends_what_outlives_the_grace_and_exits_0(model_dir, tmp_path):
    s = Server(model_dir, tmp_path, "--grace", 0.5)
    body = {"prompt": "ROMEO:", "max_tokens": CTX - 100, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 0, s.output()
        assert time.monotonic() - t0 < 10   # the grace, not the generation's end


def test_streamed_experts_give_the_same_text_and_their_cache_counters(model_dir, tmp_path, ref):
    s = Server(model_dir, tmp_path, "--parallel", 1, "--expert-budget", "50%")
    try:
        text, _, _ = ref.run(ref.model.tokenize("ROMEO:"), 24)
        r = s.client().completions.create(model="m", prompt="ROMEO:", max_tokens=24, temperature=0)
        assert r.choices[0].text == text
        m = s.metrics()
        hits, misses = m["colibri_expert_cache_hits_total"], m["colibri_expert_cache_misses_total"]
        assert misses > 0 and m["colibri_expert_cache_hit_ratio"] == hits / (hits + misses)
    finally:
        assert s.stop() == 0, s.output()

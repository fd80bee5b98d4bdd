"""The OpenAI requests checked into a plain Request: types and ranges as OpenAI's API documents
them, every error an ApiError naming its field (OpenAI's `param`).  What the core decides (the
stop strings' limits, a prompt's room in the context) the core checks when the request starts."""
import json
import math
from dataclasses import dataclass

# The roles OpenAI's chat API takes ("developer" is the newer name of "system").
ROLES = ("system", "developer", "user", "assistant", "tool")
# Fields of the API whose meaning this server does not give: accepted only at these values (their
# defaults), else a 400 that names the field rather than an answer that quietly ignores it.
UNSUPPORTED = {"tools": (None, []), "functions": (None, []), "logprobs": (None, False), "top_logprobs": (None, 0),
               "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
               "response_format": (None, {"type": "text"})}
COMPLETION_MAX_TOKENS = 16   # OpenAI's default for /v1/completions; a chat reply runs to its end


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message, param=None, status=400, type="invalid_request_error", code=None, headers=None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code
        self.headers = headers or {}

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Request:
    """What the scheduler runs: the prompt's ids and Batch.start's options."""
    prompt: list                  # token ids
    max_tokens: int
    temperature: float
    top_p: float
    seed: object                  # int, or None: a random one
    stop: tuple
    presence_penalty: float
    frequency_penalty: float
    logit_bias: object            # {id: bias} or None
    top_k: int                    # the extensions llama.cpp's server and vLLM accept beside OpenAI's fields
    min_p: float
    repeat_penalty: float
    ignore_eos: bool              # generate past the model's end ids (benchmarks: a fixed output length)
    stream: bool
    include_usage: bool

    def start_options(self):
        """Batch.start's keyword arguments."""
        return dict(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                    stop=self.stop, presence_penalty=self.presence_penalty,
                    frequency_penalty=self.frequency_penalty, logit_bias=self.logit_bias, top_k=self.top_k,
                    min_p=self.min_p, repeat_penalty=self.repeat_penalty, stop_at_eos=not self.ignore_eos)


def parse_json(raw):
    """The body as JSON (an object), NaN and Infinity refused as JSON itself refuses them."""
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")
    try:
        body = json.loads(raw, parse_constant=no_constant)
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError is a ValueError
        raise ApiError(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(f"the body must be a JSON object, not {_json_type(body)}", code="invalid_json")
    return body


def completion(body, tokenize, vocab_size):
    """/v1/completions: `prompt` a string (tokenize(text) -> ids) or a list of token ids, or a
    list of one of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]   # a batch of one prompt
    if isinstance(prompt, str):
        try:
            ids = list(tokenize(prompt))
        except ValueError as e:   # a lone surrogate, say
            raise ApiError(f"'prompt' cannot be encoded: {e}", "prompt") from None
    elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ApiError(f"'prompt': token id {bad[0]} is outside the vocabulary [0, {vocab_size})", "prompt")
        ids = prompt
    elif isinstance(prompt, list):
        raise ApiError("'prompt' must be a string or a list of token ids; one prompt per request", "prompt")
    else:
        raise ApiError(f"'prompt' must be a string or a list of token ids, not {_json_type(prompt)}", "prompt")
    if not ids:
        raise ApiError("'prompt' is empty", "prompt")
    return _common(body, ids, vocab_size, default_max_tokens=COMPLETION_MAX_TOKENS, token_field="max_tokens")


def chat(body, render, vocab_size):
    """/v1/chat/completions: `messages` checked, then render(messages) -> the prompt's ids (the
    model's chat template, tokenized)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(f"'messages' must be a non-empty array, not {_json_type(messages)}", "messages")
    clean = [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    try:
        ids = list(render(clean))
    except ValueError as e:   # the template's own refusal (ChatTemplateError), or text it cannot encode
        raise ApiError(f"'messages': {e}", "messages") from None
    token_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _common(body, ids, vocab_size, default_max_tokens=None, token_field=token_field)


def _message(m, where):
    if not isinstance(m, dict):
        raise ApiError(f"'{where}' must be an object with 'role' and 'content', not {_json_type(m)}", where)
    role = m.get("role")
    if role not in ROLES:
        raise ApiError(f"'{where}.role': unknown role {role!r}; one of {', '.join(ROLES)}", f"{where}.role")
    content = m.get("content")
    if isinstance(content, list):   # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(f"'{where}.content[{j}]': only text parts ({{\"type\": \"text\", \"text\": ...}})",
                               f"{where}.content[{j}]")
            texts.append(part["text"])
        content = "\n".join(texts)
    elif not (isinstance(content, str) or (content is None and role == "assistant")):
        raise ApiError(f"'{where}.content' must be a string or an array of text parts, not {_json_type(content)}",
                       f"{where}.content")
    out = {"role": role, "content": content or ""}
    if m.get("name") is not None:
        out["name"] = _typed(m, "name", str, "a string", where=where)
    return out


def _common(body, ids, vocab_size, default_max_tokens, token_field):
    for name, accepted in UNSUPPORTED.items():
        if body.get(name) not in accepted:
            raise ApiError(f"'{name}' is not supported by this server", name, code="unsupported")
    _typed(body, "model", str, "a string")
    n = _typed(body, "n", int, "an integer", 1)
    if n != 1:
        raise ApiError(f"'n' must be 1 (one choice per request), not {n}", "n")
    max_tokens = _typed(body, token_field, int, "an integer", default_max_tokens)
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(f"'{token_field}' must be at least 1, not {max_tokens}", token_field)
    seed = _typed(body, "seed", int, "an integer")
    if seed is not None and not 0 <= seed < 2 ** 64:
        raise ApiError(f"'seed' must lie in [0, 2^64), not {seed}", "seed")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    elif stop is not None:
        raise ApiError(f"'stop' must be a string or an array of strings, not {_json_type(stop)}", "stop")
    stream = _typed(body, "stream", bool, "a boolean", False)
    options = _typed(body, "stream_options", dict, "an object", {})
    include_usage = _typed(options, "include_usage", bool, "a boolean", False, where="stream_options")
    top_k = _typed(body, "top_k", int, "an integer", 0)
    if top_k < 0:
        raise ApiError(f"'top_k' must be at least 0 (0: off), not {top_k}", "top_k")
    return Request(prompt=ids, max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, 0, 2),
                   top_p=_number(body, "top_p", 1.0, 0, 1), seed=seed, stop=stop or (),
                   presence_penalty=_number(body, "presence_penalty", 0.0, -2, 2),
                   frequency_penalty=_number(body, "frequency_penalty", 0.0, -2, 2),
                   logit_bias=_logit_bias(body, vocab_size), top_k=top_k, min_p=_number(body, "min_p", 0.0, 0, 1),
                   repeat_penalty=_number(body, "repeat_penalty", 1.0, 0, 10),
                   ignore_eos=_typed(body, "ignore_eos", bool, "a boolean", False),
                   stream=stream, include_usage=include_usage)


def _logit_bias(body, vocab_size):
    """{"id": bias} (JSON keys are strings), each bias in OpenAI's [-100, 100]."""
    given = _typed(body, "logit_bias", dict, "an object")
    if not given:
        return None
    bias = {}
    for key, value in given.items():
        try:
            token = int(key)
        except ValueError:
            raise ApiError(f"'logit_bias': key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab_size:
            raise ApiError(f"'logit_bias': token id {token} is outside the vocabulary [0, {vocab_size})", "logit_bias")
        if not (_is_number(value) and -100 <= value <= 100):
            raise ApiError(f"'logit_bias': the bias of {key} must be a number in [-100, 100]", "logit_bias")
        bias[token] = float(value)
    return bias


def _number(body, name, default, lo, hi):
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise ApiError(f"'{name}' must be a number, not {_json_type(value)}", name)
    if not lo <= value <= hi:
        raise ApiError(f"'{name}' must lie in [{lo}, {hi}], not {value}", name)
    return float(value)


def _typed(body, name, kind, what, default=None, where=None):
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        field = f"{where}.{name}" if where else name
        raise ApiError(f"'{field}' must be {what}, not {_json_type(value)}", field)
    return value


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _json_type(value):
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)

"""Chat templates: read from a checkpoint or a GGUF file, stored with the model, rendered as transformers renders them.

A model directory holds its templates as Jinja files beside colibri_model.json, and the special
tokens' text they read (bos_token, eos_token, ...) in special_tokens.json:

    chat_template.jinja          the model's own template ("default")
    chat_template.NAME.jinja     a named one (e.g. "tool_use")
    special_tokens.json          {"bos_token": "<s>", "eos_token": "</s>", ...}

    import colibri
    model = colibri.Model("qwen3.colibri")
    text = model.apply_chat_template([{"role": "user", "content": "Hi"}], enable_thinking=False)

A template is code from the model's author: it runs in jinja2's immutable sandbox, with the globals
and filters transformers gives it (raise_exception, tojson, strftime_now, loop controls), so the
text is the one transformers' apply_chat_template(..., tokenize=False) writes for the same
template, messages and arguments.
"""

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

TEMPLATE_FILE = "chat_template.jinja"
NAMED_TEMPLATE = "chat_template.{}.jinja"
TOKENS_FILE = "special_tokens.json"
DEFAULT = "default"
# the special tokens transformers passes to every template, by the names templates read them under
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# GGUF keys of those tokens' ids (tokenizer.ggml.<kind>_token_id)
GGUF_TOKEN_IDS = {name: f"tokenizer.ggml.{name.removesuffix('_token')}_token_id" for name in SPECIAL_TOKENS}
GGUF_TOKEN_IDS["sep_token"] = "tokenizer.ggml.seperator_token_id"   # llama.cpp's spelling
GGUF_TOKEN_IDS["pad_token"] = "tokenizer.ggml.padding_token_id"


class ChatTemplateError(ValueError):
    """A model without a template, a template that does not compile, or one that refused the messages."""


class ChatTemplates:
    """A model's chat templates ({name: Jinja text}; DEFAULT is the model's own) and the special
    tokens' text they read ({"bos_token": "<s>", ...})."""

    def __init__(self, templates, tokens, source=""):
        self.templates, self.tokens, self.source = dict(templates), dict(tokens), source

    def __bool__(self):
        return bool(self.templates)

    def __repr__(self):
        return f"ChatTemplates({sorted(self.templates)}, {self.tokens}, source={self.source!r})"

    def template(self, template=None, tools=None):
        """The Jinja text to render: `template` is a name of this model's templates or a template's
        text; None picks "tool_use" when there are tools and the model has one, else the default
        (transformers' choice)."""
        if template is not None:
            return self.templates.get(template, template)
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if DEFAULT in self.templates:
            return self.templates[DEFAULT]
        if self.templates:
            raise ChatTemplateError(f"{self.source or 'the model'}: its chat templates ({', '.join(sorted(self.templates))}) "
                                    f"have no default: give template=NAME")
        raise ChatTemplateError(f"{self.source or 'the model'}: no chat template (looked for {TEMPLATE_FILE} and "
                                f"{NAMED_TEMPLATE.format('NAME')} in a model directory, the tokenizer.chat_template "
                                f"metadata in a GGUF file); give template=TEXT, or reconvert from a checkpoint whose "
                                f"tokenizer_config.json has a chat_template")

    def render(self, messages, add_generation_prompt=True, tools=None, documents=None, template=None, **kwargs):
        """The conversation `messages` ([{"role": ..., "content": ...}, ...]) as the template writes
        it. `tools`: JSON schemas of functions; `documents`: [{"title", "text"}]; other keyword
        arguments (enable_thinking=False, ...) are passed to the template, and override the
        special tokens' text of the same names."""
        return render(self.template(template, tools), messages, add_generation_prompt=add_generation_prompt,
                      tools=tools, documents=documents, **{**self.tokens, **kwargs})

    def writes_bos(self, template=None):
        """Whether the template starts a conversation with bos_token itself (then its text is to be
        tokenized without adding BOS); False for a model without a bos_token text."""
        bos = self.tokens.get("bos_token")
        if not bos:
            return False
        return self.render([{"role": "user", "content": "x"}], template=template).startswith(bos)


# ------------------------------------------------------------------------------------------ rendering

def render(template, messages, add_generation_prompt=True, tools=None, documents=None, **kwargs):
    """The Jinja text `template` rendered for `messages`, as transformers' apply_chat_template(...,
    tokenize=False) renders it: a message's keys whose value is None are dropped, reasoning given as
    `thinking` or `reasoning` is also passed as `reasoning_content` (and the other way), and
    everything the template sees is rebuilt from plain JSON values. Raises ChatTemplateError
    naming the template's own message when it calls raise_exception."""
    import jinja2

    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("give the conversation as a non-empty list of {\"role\", \"content\"} messages")
    chat = []
    for message in messages:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"a message is a dict with \"role\" and \"content\", not {message!r:.60}")
        chat.append(_with_reasoning_names(_plain({k: v for k, v in message.items() if v is not None})))
    for tool in tools or ():
        if not isinstance(tool, dict):
            raise ChatTemplateError(f"a tool is given as its JSON schema (a dict), not {tool!r:.60}")
    for document in documents or ():
        if not isinstance(document, dict):
            raise ChatTemplateError(f"a document is a dict with \"title\" and \"text\", not {document!r:.60}")
    try:
        return _compiled(template).render(messages=chat, tools=_plain(tools), documents=_plain(documents),
                                          add_generation_prompt=add_generation_prompt, **_plain(kwargs))
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template: {e}") from e


REASONING_NAMES = ("reasoning_content", "thinking", "reasoning")   # the first is the one templates read


def _with_reasoning_names(message):
    reasoning = next((message[k] for k in REASONING_NAMES if message.get(k) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value):
    """`value` rebuilt from JSON's types (str, int, float, bool, None, dict, list): the sandbox sees
    no object with methods of its own; anything else becomes a placeholder naming its type."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (bool, str, int, float):   # subclasses (enums, numpy scalars) as their base type
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):   # a named tuple too: a plain one
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return _plain(value.item())   # a numpy scalar
    return f"<{type(value).__name__}>"


@lru_cache(maxsize=16)
def _compiled(template):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e.message} (line {e.lineno})") from None


def _raise_exception(message):
    import jinja2

    raise jinja2.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # not jinja2's own tojson, which escapes HTML characters: the text the model was trained on
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


# -------------------------------------------------------------------------------- reading the sources

def from_hf(src_dir):
    """The chat templates of a Hugging Face checkpoint directory: tokenizer_config.json's
    chat_template (a text, or a list of {"name", "template"}), chat_template.jinja and
    additional_chat_templates/NAME.jinja beside it (which take precedence, as in transformers), and
    the special tokens' text from tokenizer_config.json (else special_tokens_map.json)."""
    src_dir = Path(src_dir)
    config = _json_object(src_dir / "tokenizer_config.json")
    templates = {}
    given = config.get("chat_template")
    if isinstance(given, str):
        templates[DEFAULT] = given
    elif isinstance(given, list):
        for item in given:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)):
                raise ValueError(f"{src_dir / 'tokenizer_config.json'}: chat_template holds {item!r:.60}, not "
                                 f"{{\"name\", \"template\"}}")
            templates[item["name"]] = item["template"]
    if (src_dir / TEMPLATE_FILE).is_file():
        templates[DEFAULT] = (src_dir / TEMPLATE_FILE).read_bytes().decode("utf-8")
    for path in sorted((src_dir / "additional_chat_templates").glob("*.jinja")):
        templates[path.stem] = path.read_bytes().decode("utf-8")
    tokens = {}
    for source in (config, _json_object(src_dir / "special_tokens_map.json")):
        for name in SPECIAL_TOKENS:
            text = _token_text(source.get(name))
            if text is not None:
                tokens.setdefault(name, text)
    return ChatTemplates(templates, tokens, str(src_dir))


def _json_object(path):
    if not path.is_file():
        return {}
    doc = json.loads(path.read_bytes().decode("utf-8"))
    return doc if isinstance(doc, dict) else {}


def _token_text(value):
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def from_gguf_metadata(meta, source="the GGUF file"):
    """The chat templates of a GGUF file from its metadata ({key: value}, strings decoded, arrays
    as lists): tokenizer.chat_template, tokenizer.chat_template.NAME for each name in
    tokenizer.chat_templates, and the special tokens' text (tokenizer.ggml.tokens at the
    tokenizer.ggml.bos_token_id, ... ids)."""
    templates = {}
    if isinstance(meta.get("tokenizer.chat_template"), str):
        templates[DEFAULT] = meta["tokenizer.chat_template"]
    prefix = "tokenizer.chat_template."
    for key, value in meta.items():
        if key.startswith(prefix) and isinstance(value, str) and key[len(prefix):]:
            templates[key[len(prefix):]] = value
    vocab = meta.get("tokenizer.ggml.tokens")
    tokens = {}
    for name, key in GGUF_TOKEN_IDS.items():
        token_id = meta.get(key)
        if isinstance(vocab, list) and type(token_id) is int and 0 <= token_id < len(vocab) \
                and isinstance(vocab[token_id], str):
            tokens[name] = vocab[token_id]
    return ChatTemplates(templates, tokens, source)


# ---------------------------------------------------------------------------- a model's stored copy

def write(chat, out_dir):
    """Store `chat` in the model directory `out_dir` (the files named in this module's docstring);
    a model without templates gets none of them."""
    if not chat:
        return
    out_dir = Path(out_dir)
    for name, text in chat.templates.items():
        _check_name(name)
        path = out_dir / (TEMPLATE_FILE if name == DEFAULT else NAMED_TEMPLATE.format(name))
        path.write_bytes(text.encode("utf-8"))   # byte for byte: a template's line ends are its text
    (out_dir / TOKENS_FILE).write_text(json.dumps(chat.tokens, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_name(name):
    if not name or name != Path(name).name or name.startswith("."):
        raise ValueError(f"a chat template's name {name!r} is not a file name")


def is_own_file(name):
    """Whether `name` is one of the files write() stores in a model directory."""
    return name in (TEMPLATE_FILE, TOKENS_FILE) or (name.startswith("chat_template.") and name.endswith(".jinja"))


def read(model_path):
    """The chat templates stored with a model: a model directory's files, or a GGUF file's metadata."""
    path = Path(model_path)
    if path.is_file() and path.suffix == ".gguf":
        from colibri.convert.gguf_import import _reader

        return from_gguf_metadata(_reader(path).meta, str(path))
    templates = {}
    if (path / TEMPLATE_FILE).is_file():
        templates[DEFAULT] = (path / TEMPLATE_FILE).read_bytes().decode("utf-8")
    for file in sorted(path.glob(NAMED_TEMPLATE.format("*"))):
        templates[file.name[len("chat_template."):-len(".jinja")]] = file.read_bytes().decode("utf-8")
    return ChatTemplates(templates, _json_object(path / TOKENS_FILE), str(path))

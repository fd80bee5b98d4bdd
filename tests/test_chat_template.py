"""Chat templates (colibri.chat): rendered as transformers' apply_chat_template(..., tokenize=False)
renders the same template text, messages and arguments, on templates written here in the styles
real models use; read from a checkpoint's tokenizer_config.json / chat_template.jinja and a GGUF
file's tokenizer.chat_template, stored with the converted model, and rendered from there the same."""
import datetime
import json
import os
import shutil

import pytest
from gguf import GGUFWriter

import colibri
from colibri import chat
from colibri.convert import convert
from support import FIXTURES, require_reference

torch, transformers = require_reference()

# Qwen3 style: ChatML, the reasoning of turns before the last user query dropped, enable_thinking
CHATML_THINKING = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == "user" %}
        {%- set ns.last_query_index = index %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and reasoning_content %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# Llama 3 style: headers, bos_token written by the template, today's date from strftime_now
LLAMA3 = """\
{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You have access to the following functions:\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4, sort_keys=true) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# DeepSeek R1 style: full-width bars in the special tokens, the system prompt first, thinking cut from replies
DEEPSEEK = """\
{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{% set ns = namespace(system_prompt='') %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{% endif %}
{%- endfor %}
{{ bos_token }}{{ ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{% endif %}
    {%- if message['role'] == 'assistant' %}
        {% set content = message['content'] %}
        {% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}
        {{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}
"""

# Hermes / Qwen2.5 style tool use: the tools as JSON, assistant tool calls, tool results grouped in one user turn
TOOLS = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- if documents %}
    {{- '<|im_start|>system\\n# Documents\\n' }}
    {%- for doc in documents %}
        {{- '\\n## ' + doc.title + '\\n' + doc.text }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Mistral style: no system role, the system prompt merged into the first user turn, roles checked
MISTRAL = """\
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

SYSTEM = {"role": "system", "content": "You are a terse assistant. Réponds en français si on te parle français."}
TALK = [SYSTEM,
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "<think>\nSmall sum.\n</think>\n\n4."},
        {"role": "user", "content": "Et 3 × 3 ?"},
        {"role": "assistant", "content": "9.", "reasoning_content": "Trois fois trois."},
        {"role": "user", "content": "  And the capital of 日本?  "}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "La météo d'une ville, en °C",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "Nom de la ville"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
TOOL_TALK = [SYSTEM,
             {"role": "user", "content": "Quel temps fait-il à Zürich et à Genève ?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Genève", "unit": "celsius"}}}]},
             {"role": "tool", "name": "get_weather", "content": "21"},
             {"role": "tool", "name": "get_weather", "content": "24"},
             {"role": "user", "content": "Merci !"}]
DOCUMENTS = [{"title": "Lac Léman", "text": "Le plus grand lac d'Europe occidentale."}]
BOS, EOS = "<s>", "</s>"


def hf_tokenizer(bos=BOS, eos=EOS, template=None):
    """A tokenizer transformers accepts, built here: its special tokens are what the templates read."""
    from tokenizers import Tokenizer, models

    vocab = {bos: 0, eos: 1, "<unk>": 2}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                                bos_token=bos, eos_token=eos, unk_token="<unk>", chat_template=template)


@pytest.fixture
def fixed_date(monkeypatch):
    """strftime_now reads one fixed day in both renderers."""
    class Day(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 7, 4, 9, 30)

    import transformers.utils.chat_template_utils as theirs
    monkeypatch.setattr(theirs, "datetime", Day)
    monkeypatch.setattr(chat, "datetime", Day)


def both(template, messages, bos=BOS, eos=EOS, **kwargs):
    """(colibri's text, transformers' text) of one conversation (with the generation prompt unless
    told: colibri's default, not transformers')."""
    kwargs.setdefault("add_generation_prompt", True)
    ours = chat.ChatTemplates({"default": template}, {"bos_token": bos, "eos_token": eos, "unk_token": "<unk>"})
    theirs = hf_tokenizer(bos, eos).apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)
    return ours.render(messages, **kwargs), theirs


CASES = {   # name: template, messages, keyword arguments
    "chatml-thinking": (CHATML_THINKING, TALK, {}),
    "chatml-no-thinking": (CHATML_THINKING, TALK, {"enable_thinking": False}),
    "chatml-continued": (CHATML_THINKING, TALK[:5], {"add_generation_prompt": False}),
    "llama3": (LLAMA3, TALK, {}),
    "llama3-tools": (LLAMA3, TALK[:2], {"tools": [WEATHER]}),
    "llama3-date-given": (LLAMA3, TALK[1:2], {"date_string": "1 Jan 2030"}),
    "deepseek": (DEEPSEEK, TALK, {}),
    "tools": (TOOLS, TOOL_TALK, {"tools": [WEATHER]}),
    "tools-documents": (TOOLS, TOOL_TALK[1:2], {"documents": DOCUMENTS}),
    "mistral-system-merged": (MISTRAL, [SYSTEM] + [m for m in TALK[1:] if m["role"] != "system"], {}),
    "mistral-no-system": (MISTRAL, TALK[1:3], {"add_generation_prompt": False}),
}


@pytest.mark.parametrize("name", CASES)
def test_rendered_as_transformers_renders_it(name, fixed_date):
    template, messages, kwargs = CASES[name]
    bos = "<｜begin▁of▁sentence｜>" if template is DEEPSEEK else "<|begin_of_text|>" if template is LLAMA3 else BOS
    ours, theirs = both(template, messages, bos=bos, **kwargs)
    assert ours == theirs
    assert messages[-1]["content"].strip() in ours   # not two empty texts


def test_the_cases_render_what_their_style_writes(fixed_date):
    """The comparisons above compare something: each style's marks are in its text."""
    assert "<think>\n\n</think>\n\n" in both(*CASES["chatml-no-thinking"][:2], enable_thinking=False)[0]
    assert "Small sum" not in both(CHATML_THINKING, TALK)[0]   # reasoning of earlier turns dropped
    assert "Trois fois trois" not in both(CHATML_THINKING, TALK)[0]
    assert "<think>\nTrois fois trois.\n</think>" in both(CHATML_THINKING, TALK[:5], add_generation_prompt=False)[0]
    assert "Today Date: 04 Jul 2026" in both(LLAMA3, TALK, bos="<|begin_of_text|>")[0]
    text = both(DEEPSEEK, TALK, bos="<｜begin▁of▁sentence｜>")[0]
    assert text.startswith("<｜begin▁of▁sentence｜>" + SYSTEM["content"] + "<｜User｜>What is 2 + 2?<｜Assistant｜>")
    assert "Small sum" not in text and text.endswith("<｜Assistant｜><think>\n")
    text = both(TOOLS, TOOL_TALK, tools=[WEATHER])[0]
    assert '"description": "La météo d\'une ville, en °C"' in text   # tojson keeps non-ASCII
    assert '{"name": "get_weather", "arguments": {"city": "Genève", "unit": "celsius"}}' in text
    assert "<tool_response>\n21\n</tool_response>\n<tool_response>\n24" in text
    assert '    "description"' in both(LLAMA3, TALK[:2], tools=[WEATHER])[0]   # tojson(indent=4)
    assert text.count("<|im_start|>system") == 1
    assert " [INST] " + SYSTEM["content"] + "\n\nWhat is 2 + 2? [/INST]" in both(*CASES["mistral-system-merged"][:2])[0]


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "conversation roles must alternate"),
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], "Only user and assistant roles are supported"),
    ([{"role": "tool", "content": "a"}], "conversation roles must alternate"),
])
def test_a_template_that_refuses_the_roles_raises_in_both(messages, message):
    import jinja2

    with pytest.raises(jinja2.TemplateError, match=message):
        hf_tokenizer().apply_chat_template(messages, chat_template=MISTRAL, tokenize=False)
    with pytest.raises(chat.ChatTemplateError, match=f"^the chat template: .*{message}"):
        chat.ChatTemplates({"default": MISTRAL}, {"bos_token": BOS}).render(messages)


def test_the_sandbox_refuses_what_transformers_refuses():
    import jinja2

    escape = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        hf_tokenizer().apply_chat_template([{"role": "user", "content": "x"}], chat_template=escape, tokenize=False)
    with pytest.raises(chat.ChatTemplateError, match="access to attribute '__class__' of 'list' object is unsafe"):
        chat.render(escape, [{"role": "user", "content": "x"}])
    mutate = "{% set x = messages.append(1) %}{{ x }}"   # the immutable sandbox
    with pytest.raises(chat.ChatTemplateError, match="unsafe"):
        chat.render(mutate, [{"role": "user", "content": "x"}])


def test_whether_the_template_writes_bos():
    tokens = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    assert chat.ChatTemplates({"default": LLAMA3}, tokens).writes_bos()
    assert not chat.ChatTemplates({"default": CHATML_THINKING}, tokens).writes_bos()
    assert not chat.ChatTemplates({"default": LLAMA3}, {}).writes_bos()   # no bos text: nothing to find


# ------------------------------------------------------------------------------ stored with the model

def checkpoint(tmp_path, config, jinja=None):
    """tests/fixtures/tiny-mixtral with a tokenizer_config.json `config` (and a chat_template.jinja)."""
    src = tmp_path / "hf"
    shutil.copytree(FIXTURES / "tiny-mixtral", src)
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    if jinja is not None:
        (src / "chat_template.jinja").write_bytes(jinja.encode())
    return src


def test_a_checkpoints_templates_convert_and_render_as_transformers(tmp_path):
    src = checkpoint(tmp_path, {
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True},
        "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": [{"name": "default", "template": MISTRAL}, {"name": "tool_use", "template": TOOLS}]})
    model = colibri.Model(convert(src, tmp_path / "m", progress=False))
    assert sorted(p.name for p in (tmp_path / "m").glob("chat_template*")) == ["chat_template.jinja",
                                                                               "chat_template.tool_use.jinja"]
    theirs = transformers.AutoTokenizer.from_pretrained(src)
    talk = [SYSTEM] + [m for m in TALK[1:] if m["role"] != "system"]
    expected = theirs.apply_chat_template(talk, tokenize=False, add_generation_prompt=True)
    assert expected.startswith("<s> [INST] ") and expected.count("</s>") == 2
    assert model.apply_chat_template(talk) == expected
    # tools pick the tool_use template, as in transformers; or a template by name
    assert model.apply_chat_template(TOOL_TALK, tools=[WEATHER]) == \
        theirs.apply_chat_template(TOOL_TALK, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    assert model.apply_chat_template(TOOL_TALK[1:2], template="tool_use") == \
        theirs.apply_chat_template(TOOL_TALK[1:2], chat_template="tool_use", tokenize=False, add_generation_prompt=True)
    assert chat.read(model.path).writes_bos()


def test_a_chat_template_jinja_beside_the_checkpoint_is_the_default(tmp_path):
    src = checkpoint(tmp_path, {"bos_token": "<s>", "eos_token": "</s>", "chat_template": MISTRAL},
                     jinja=CHATML_THINKING.replace("\n", "\r\n", 3))   # its bytes kept, line ends too
    (src / "additional_chat_templates").mkdir()
    (src / "additional_chat_templates" / "tool_use.jinja").write_text(TOOLS)
    model = colibri.Model(convert(src, tmp_path / "m", progress=False))
    theirs = transformers.AutoTokenizer.from_pretrained(src)
    for kwargs in ({}, {"enable_thinking": False}):
        expected = theirs.apply_chat_template(TALK, tokenize=False, add_generation_prompt=True, **kwargs)
        assert expected.startswith("<|im_start|>system")
        assert model.apply_chat_template(TALK, **kwargs) == expected
    assert (tmp_path / "m" / "chat_template.jinja").read_bytes() == (src / "chat_template.jinja").read_bytes()
    assert model.apply_chat_template(TOOL_TALK, tools=[WEATHER]) == \
        theirs.apply_chat_template(TOOL_TALK, tools=[WEATHER], tokenize=False, add_generation_prompt=True)


def test_a_model_without_a_template_says_where_templates_are_looked_for(tmp_path):
    model = colibri.Model(convert(FIXTURES / "tiny-mixtral", tmp_path / "m", progress=False))
    assert not list((tmp_path / "m").glob("chat_template*"))
    with pytest.raises(chat.ChatTemplateError, match=r": no chat template \(looked for chat_template.jinja and "
                                                     r"chat_template.NAME.jinja in a model directory"):
        model.apply_chat_template(TALK)
    assert model.apply_chat_template(TALK[1:2], template="{{ messages[0].content }}") == TALK[1]["content"]


def test_a_reconversion_from_a_source_without_templates_drops_the_old_ones(tmp_path):
    src = checkpoint(tmp_path, {"chat_template": [{"name": "default", "template": MISTRAL},
                                                  {"name": "tool_use", "template": TOOLS}]})
    convert(src, tmp_path / "m", progress=False)
    (src / "tokenizer_config.json").unlink()
    convert(src, tmp_path / "m", progress=False)
    assert not list((tmp_path / "m").glob("chat_template*")) and not (tmp_path / "m" / chat.TOKENS_FILE).exists()


@pytest.mark.parametrize("name", ["../outside", ".hidden", ""])
def test_a_template_name_that_is_no_file_name_is_refused(tmp_path, name):
    from colibri.convert import ConvertError

    src = checkpoint(tmp_path, {"chat_template": [{"name": "default", "template": MISTRAL},
                                                  {"name": name, "template": TOOLS}]})
    with pytest.raises(ConvertError, match="is not a file name"):
        convert(src, tmp_path / "m", progress=False)
    assert not (tmp_path / "outside.jinja").exists() and not (tmp_path / "m").exists()


def gguf_with_template(path, templates):
    """A tiny llama-with-experts GGUF with a SentencePiece-style vocabulary and chat templates."""
    import numpy as np

    rng = np.random.default_rng(0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁hi", "▁there"]
    D, F, E, V = 16, 32, 2, len(tokens)
    out = GGUFWriter(str(path), "llama")
    for method, value in (("add_context_length", 64), ("add_embedding_length", D), ("add_block_count", 1),
                          ("add_feed_forward_length", F), ("add_head_count", 2), ("add_head_count_kv", 2),
                          ("add_rope_freq_base", 10000.0), ("add_layer_norm_rms_eps", 1e-5), ("add_expert_count", E),
                          ("add_expert_used_count", 2), ("add_rope_dimension_count", D // 2),
                          ("add_tokenizer_model", "llama"), ("add_token_list", tokens),
                          ("add_token_types", [2, 3, 3] + [6] * 256 + [1, 1]),
                          ("add_token_scores", [0.0] * 259 + [-1.0, -2.0]),
                          ("add_bos_token_id", 1), ("add_eos_token_id", 2), ("add_chat_template", templates)):
        getattr(out, method)(value)
    w = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)   # noqa: E731
    out.add_tensor("token_embd.weight", w(V, D))
    for name, shape in (("attn_norm", (D,)), ("attn_q", (D, D)), ("attn_k", (D, D)), ("attn_v", (D, D)),
                        ("attn_output", (D, D)), ("ffn_norm", (D,)), ("ffn_gate_inp", (E, D)),
                        ("ffn_gate_exps", (E, F, D)), ("ffn_up_exps", (E, F, D)), ("ffn_down_exps", (E, D, F))):
        out.add_tensor(f"blk.0.{name}.weight", w(*shape))
    out.add_tensor("output_norm.weight", w(D))
    out.add_tensor("output.weight", w(V, D))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return path


def test_a_gguf_files_templates_convert_and_render_as_transformers(tmp_path, monkeypatch):
    path = gguf_with_template(tmp_path / "m.gguf", [{"name": "default", "template": MISTRAL},
                                                    {"name": "tool_use", "template": TOOLS}])
    model = colibri.Model(convert(path, tmp_path / "m", progress=False))
    talk = [SYSTEM] + [m for m in TALK[1:] if m["role"] != "system"]
    theirs = hf_tokenizer("<s>", "</s>")   # the GGUF's bos and eos ids name these tokens
    expected = theirs.apply_chat_template(talk, chat_template=MISTRAL, tokenize=False, add_generation_prompt=True)
    assert model.apply_chat_template(talk) == expected
    assert chat.read(path).render(talk) == expected   # read from the GGUF file itself
    monkeypatch.setenv("COLIBRI_CACHE", str(tmp_path / "cache"))   # run in place: from its description
    assert colibri.Model(path).apply_chat_template(talk) == expected
    assert model.apply_chat_template(TOOL_TALK, tools=[WEATHER]) == \
        theirs.apply_chat_template(TOOL_TALK, chat_template=TOOLS, tools=[WEATHER], tokenize=False,
                                   add_generation_prompt=True)
    assert json.loads((tmp_path / "m" / chat.TOKENS_FILE).read_text())["bos_token"] == "<s>"

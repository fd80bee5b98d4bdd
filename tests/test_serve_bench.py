"""benchmarks/serve.py reads a streamed completion as OpenAI documents it and as llama-server sends it:
only the events carrying text are timed (inter-token latency), and the usage comes from whichever
chunk holds it.  The benchmark itself runs servers at length and is not part of the suite."""
import importlib.util
import json
from pathlib import Path

TESTS = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("serve_bench", TESTS.parent / "benchmarks" / "serve.py")
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)


def sse(chunks, times):
    """(time, line) pairs of server-sent events: each chunk a `data:` line then a blank one."""
    lines = []
    for t, chunk in zip(times, chunks):
        lines += [(t, "data: " + (chunk if isinstance(chunk, str) else json.dumps(chunk))), (t, "")]
    return lines


def choice(text, finish=None):
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}], "object": "text_completion"}


USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_openai_stream_usage_in_its_own_chunk():
    # OpenAI's stream_options.include_usage: a last chunk with no choices, then [DONE]
    chunks = [choice("a"), choice(""), choice("b"), choice("c", "length"), {"choices": [], "usage": USAGE}, "[DONE]"]
    got = serve.parse_stream(sse(chunks, [1.0, 1.5, 2.0, 4.0, 4.1, 4.2]))
    assert got["events"] == [1.0, 2.0, 4.0]   # the empty-text chunk is no token the client saw
    assert (got["prompt_tokens"], got["completion_tokens"], got["finish"]) == (5, 3, "length")


def test_llama_server_stream_usage_in_the_final_choice():
    # llama-server's /v1/completions: the final chunk has an empty text, the finish reason and the usage
    final = dict(choice("", "length"), usage=USAGE)
    got = serve.parse_stream(sse([choice("a"), choice("b"), choice("c"), final, "[DONE]"], [1.0, 2.0, 3.0, 3.0, 3.0]))
    assert got["events"] == [1.0, 2.0, 3.0]
    assert (got["prompt_tokens"], got["completion_tokens"], got["finish"]) == (5, 3, "length")


def test_stream_without_usage_counts_the_text_events():
    got = serve.parse_stream(sse([choice("a"), choice("b", "length"), "[DONE]"], [1.0, 2.0, 2.0]))
    assert got["prompt_tokens"] is None and got["completion_tokens"] == 2

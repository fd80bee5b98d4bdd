"""A conversion replaces its output directory whole or not at all (colibri/convert/output.py): no
leftover of the previous model in the new one, and the previous model intact after a conversion
that fails, runs out of disk, or is killed."""

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

import colibri
from colibri.convert import ConvertError, convert
from support import FIXTURES

WITH_TOKENIZER, WITHOUT_TOKENIZER = FIXTURES / "tiny-mixtral", FIXTURES / "tiny-mixtral-b"


def contents(directory):
    """{relative path: sha256} of every file under `directory`."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def siblings(out):
    """What lies beside `out` besides the sources and `out` itself."""
    return sorted(p.name for p in out.parent.iterdir() if p != out)


@pytest.fixture
def previous(tmp_path):
    """A converted model at tmp_path/out with its tokenizer, and its files' hashes."""
    out = convert(WITH_TOKENIZER, tmp_path / "out", progress=False)
    assert (out / "tokenizer.json").is_file()
    return out, contents(out)


def test_a_source_without_a_tokenizer_leaves_no_old_tokenizer_behind(previous):
    out, _ = previous
    convert(WITHOUT_TOKENIZER, out, progress=False)
    assert not (out / "tokenizer.json").exists()
    model = colibri.Model(out)
    assert model.tokenizer is None
    r = subprocess.run([sys.executable, "-m", "colibri", "generate", "--model", str(out), "--prompt", "ROMEO:"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "tokenizer" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_conversion_that_fails_midway_leaves_the_previous_model(previous, monkeypatch):
    from colibri.convert import writer

    out, before = previous
    encoded, calls = writer._encoded, []

    def fail_on_the_fifth(*args):
        calls.append(args[0])
        if len(calls) == 5:
            raise ConvertError("stopped midway by the test")
        return encoded(*args)

    monkeypatch.setattr(writer, "_encoded", fail_on_the_fifth)
    with pytest.raises(ConvertError, match="stopped midway"):
        convert(WITHOUT_TOKENIZER, out, progress=False)
    assert contents(out) == before and siblings(out) == []


def test_a_full_disk_while_copying_the_tokenizer_leaves_the_previous_model(previous, monkeypatch):
    import colibri.convert

    out, before = previous
    other = previous[0].parent / "other-source"
    other.mkdir()
    for name in ("config.json", "model.safetensors"):
        (other / name).write_bytes((WITHOUT_TOKENIZER / name).read_bytes())
    (other / "tokenizer.json").write_bytes((WITH_TOKENIZER / "tokenizer.json").read_bytes())

    def half_then_full(src, dst):   # what shutil.copyfile does when the disk fills up halfway
        data = open(src, "rb").read()
        open(dst, "wb").write(data[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(colibri.convert.shutil, "copyfile", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        convert(other, out, progress=False)
    assert contents(out) == before and siblings(out) == ["other-source"]


# The conversion is slowed (each tensor waits) so that it is surely midway when it is killed.
SLOW_CONVERT = """
import sys, time
from colibri.convert import convert, writer
encoded = writer._encoded
def slow(*args):
    time.sleep(0.05)
    return encoded(*args)
writer._encoded = slow
convert(sys.argv[1], sys.argv[2], progress=False)
"""


def kill_midway(out, sig, args):
    """Run the slowed conversion and send `sig` once it has written part of weights.bin."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120   # a loaded CI machine may take long to import torch-free colibri
    while time.monotonic() < deadline and p.poll() is None:
        started = [w for w in out.parent.glob(f".{out.name}.converting-*/weights.bin") if w.stat().st_size > 0]
        if started:
            break
        time.sleep(0.01)
    assert p.poll() is None, f"the conversion ended before it was killed: {p.communicate()}"
    p.send_signal(sig)
    _, stderr = p.communicate(timeout=60)
    return p.returncode, stderr


def test_kill_9_midway_leaves_the_previous_model_and_the_next_conversion_cleans_up(previous):
    out, before = previous
    code, _ = kill_midway(out, signal.SIGKILL, [sys.executable, "-c", SLOW_CONVERT, str(WITHOUT_TOKENIZER), str(out)])
    assert code == -signal.SIGKILL
    assert contents(out) == before
    leftover = siblings(out)
    assert len(leftover) == 1 and leftover[0].startswith(".out.converting-"), leftover
    assert not any(p.name.endswith(".partial") for p in out.parent.rglob("*"))
    convert(WITHOUT_TOKENIZER, out, progress=False)   # the dead conversion's directory is removed
    assert siblings(out) == [] and not (out / "tokenizer.json").exists()


def test_sigterm_midway_leaves_the_previous_model_and_nothing_else(previous):
    out, before = previous
    script = SLOW_CONVERT.replace("convert(sys.argv[1], sys.argv[2], progress=False)",
                                  "from colibri.cli import main\nsys.exit(main(['convert', '--quiet', *sys.argv[1:]]))")
    code, stderr = kill_midway(out, signal.SIGTERM, [sys.executable, "-c", script, str(WITHOUT_TOKENIZER), str(out)])
    assert code == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr
    assert contents(out) == before and siblings(out) == []


def test_files_of_the_users_own_are_carried_into_the_new_model(previous):
    out, _ = previous
    (out / "training.json").write_text('{"steps": 3}')
    (out / "profiles").mkdir()
    (out / "profiles" / "run.json").write_text("{}")
    convert(WITHOUT_TOKENIZER, out, progress=False)
    assert (out / "training.json").read_text() == '{"steps": 3}'
    assert (out / "profiles" / "run.json").read_text() == "{}"
    assert not (out / "tokenizer.json").exists()


def test_a_directory_that_is_not_a_model_is_not_replaced(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConvertError, match="not empty and not a colibri model"):
        convert(WITHOUT_TOKENIZER, out, progress=False)
    assert (out / "notes.txt").read_text() == "keep me" and siblings(out) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConvertError, match="not a directory"):
        convert(WITHOUT_TOKENIZER, tmp_path / "file", progress=False)


def test_an_output_directory_that_holds_the_source_is_refused(tmp_path):
    out = convert(WITHOUT_TOKENIZER, tmp_path / "out", progress=False)
    source = out / "hf"
    source.mkdir()
    for name in ("config.json", "model.safetensors"):
        (source / name).write_bytes((WITHOUT_TOKENIZER / name).read_bytes())
    with pytest.raises(ConvertError, match="holds the source"):
        convert(source, out, progress=False)
    assert (source / "model.safetensors").is_file()


def test_a_model_the_core_refuses_replaces_nothing(previous, monkeypatch):
    """Written, then loaded with verify=True before the swap: a checksum the writer got wrong (a
    stand-in for any writer bug the core's validation catches) stops it there."""
    from colibri.convert import writer

    out, before = previous
    monkeypatch.setattr(writer.zlib, "crc32", lambda data: 0)
    with pytest.raises(ConvertError, match=r"does not load \(nothing was replaced\).*crc32 .* != 0 in"):
        convert(WITHOUT_TOKENIZER, out, progress=False)
    assert contents(out) == before and siblings(out) == []

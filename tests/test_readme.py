"""README.md's code blocks, run: every command that finishes in seconds on the bundled model.

Markers, an HTML comment just above a block: `<!-- readme: not run: WHY -->` skips it, saying why;
`<!-- readme: varies: KIND, ... -->` lets these differ from the shown output: times, speeds, shares
(percentages), addresses, kernels (variant names), order (of the lines).

Each block is one test, named by its line (`test_block[README.md:73]`); failures name the command's
line.  ```bash: each command (a line with its `\\` continuations) must exit 0.  ```python: runs
(a traceback's line numbers are README.md's).  ``` with `$ ` prompts: where lines follow a command,
they are what it prints (stdout and stderr together), `...` on a line of its own standing for any
lines and inside a line for any text; with none, it must exit 0.  A block none of these, with no
marker, fails.  By rule, when unmarked, the first block is skipped: the install, which
tests/test_install_routes.py runs as written on a bare machine.
Commands run in a scratch folder that holds tests/fixtures, as a checkout does, and `out/model`
(made as the first line of "Using it" makes it) where the block names it.
"""
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import FIXTURES, TESTS

README = TESTS.parent / "README.md"
MAKE_MODEL = "colibri convert tests/fixtures/shakespeare-hf out/model --quant f16"   # "Using it", line 1
FIRST_BLOCK = "the install block, covered by tests/test_install_routes.py"
TIMEOUT = 300

# varying figures: what finds one in the shown output, what then matches the run's (either may
# follow spaces, which a wider or narrower number takes or gives back)
NUMBER = r"[\d][\d,.]*"
VARIES = {
    "times": (rf"{NUMBER} ?(?:ms|µs|us|s)\b", rf"{NUMBER} ?(?:ms|µs|us|s)\b"),
    "speeds": (rf"{NUMBER} ?(?:tok/s|MB/s)", rf"{NUMBER} ?(?:tok/s|MB/s)"),
    "shares": (rf"{NUMBER}%", rf"{NUMBER}%"),
    "addresses": (r"0x[0-9a-f]+", r"0x[0-9a-f]+"),
    "kernels": (r"\b(?:avx512|avx2|neon-dotprod|neon|rvv|mve|reference-int8|reference)\b", r"[\w-]+"),
}
KINDS = set(VARIES) | {"order"}
MARKER = re.compile(r"<!--\s*readme:\s*(.*?)\s*-->")


@dataclass
class Block:
    line: int                      # README line of the opening fence
    lang: str
    lines: list                    # the block's lines
    section: str
    markers: list = field(default_factory=list)
    marker_lines: list = field(default_factory=list)

    @property
    def id(self):
        return f"README.md:{self.line}"


def parse(text):
    """The fenced blocks of a Markdown text, each with the markers just above it."""
    blocks, section, lines = [], "", text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i][3:].strip()
        if lines[i].startswith("```"):
            start, lang = i, lines[i][3:].strip()
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            markers, at, j = [], [], start - 1
            while j >= 0 and (not lines[j].strip() or MARKER.fullmatch(lines[j].strip())):
                if lines[j].strip():
                    markers.insert(0, MARKER.fullmatch(lines[j].strip()).group(1))
                    at.append(j + 1)
                j -= 1
            blocks.append(Block(start + 1, lang, lines[start + 1:i], section, markers, at))
        i += 1
    return blocks


BLOCKS = parse(README.read_text(encoding="utf-8"))


def commands(block):
    """[(README line, command, [shown output lines])] of a block: a `$ ` transcript, or a bash
    block's lines (comment lines and blank lines dropped, `\\` continuations and here-documents
    joined)."""
    out, prompt, until = [], any(l.startswith("$ ") for l in block.lines), None
    for k, l in enumerate(block.lines):
        line = block.line + 1 + k
        if until is not None or (out and out[-1][1].endswith("\\")):
            out[-1][1] += "\n" + l
            until = None if l == until else until
            continue
        if prompt and l.startswith("$ "):
            out.append([line, l[2:], []])
        elif prompt:
            out[-1][2].append(l)
            continue
        elif l.strip() and not l.lstrip().startswith("#"):
            out.append([line, l, []])
        else:
            continue
        heredoc = re.search(r"<<-?\s*['\"]?([A-Za-z_]\w*)['\"]?", l)
        until = heredoc.group(1) if heredoc else None
    return out


def directive(block):
    """('run', kinds that vary) or ('skip', why) for a block; an AssertionError names what is wrong."""
    kinds, skip = set(), None
    for m in block.markers:
        key, _, value = m.partition(":")
        if key.strip() == "not run" and value.strip():
            skip = value.strip()
        elif key.strip() == "varies":
            kinds |= {k.strip() for k in value.split(",")}
            assert kinds <= KINDS, f"{block.id}: unknown kind {kinds - KINDS} in `{m}` (known: {sorted(KINDS)})"
        else:
            raise AssertionError(f"{block.id}: a marker neither `not run: WHY` nor `varies: KIND, ...`: `{m}`")
    assert not (skip and kinds), f"{block.id}: a block not run cannot have figures that vary"
    if skip:
        return "skip", skip
    if not block.markers:
        if block is BLOCKS[0]:
            return "skip", FIRST_BLOCK
    runnable = block.lang in ("bash", "python") or (block.lang == "" and any(l.startswith("$ ") for l in block.lines))
    assert runnable, (f"{block.id}: a ```{block.lang} block with no command to run: mark it "
                      "`<!-- readme: not run: WHY -->` on the line above")
    assert not kinds or block.lang == "", f"{block.id}: `varies` is for shown output, which only `$ ` blocks have"
    return "run", kinds


# ------------------------------------------------------------------------------- shown output

def line_pattern(line, kinds):
    """A regex for one shown line: `...` any text, each varying figure any such figure."""
    finders = [r"\.\.\."] + [VARIES[k][0] for k in sorted(kinds - {"order"})]
    finder = re.compile(r"[ \t]*(?:" + "|".join(f"({f})" for f in finders) + ")")
    out, pos = [], 0
    for m in finder.finditer(line):
        out.append(re.escape(line[pos:m.start()]))
        which = next(i for i, g in enumerate(m.groups()) if g is not None)
        out.append(r"[^\n]*?" if which == 0 else r"[ \t]*" + VARIES[sorted(kinds - {"order"})[which - 1]][1])
        pos = m.end()
    out.append(re.escape(line[pos:]))
    return "".join(out)


def matches(shown, printed, kinds):
    """Whether a command printed what the README shows."""
    printed = printed.rstrip("\n").split("\n")
    shown = list(shown)
    while shown and not shown[-1].strip():
        shown.pop()
    if "order" in kinds:   # the same lines, in any order
        left = list(printed)
        for s in shown:
            hit = next((p for p in left if re.fullmatch(line_pattern(s, kinds), p)), None)
            if hit is None:
                return False
            left.remove(hit)
        return not left
    regex = "".join(r"(?:[^\n]*\n)*?" if s.strip() == "..." else line_pattern(s, kinds) + r"\n" for s in shown)
    return re.fullmatch(regex, "\n".join(printed) + "\n") is not None


# ------------------------------------------------------------------------------- running

@pytest.fixture(scope="module")
def made_model(tmp_path_factory):
    """out/model as the README makes it, once; each block that names it gets a copy."""
    assert MAKE_MODEL in README.read_text(encoding="utf-8"), "the README no longer makes out/model this way"
    root = tmp_path_factory.mktemp("readme-model")
    (root / "tests").mkdir()
    (root / "tests" / "fixtures").symlink_to(FIXTURES)
    r = subprocess.run(["bash", "-c", MAKE_MODEL + " --quiet"], cwd=root, env=environment(), capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    return root / "out" / "model"


def environment():
    """This Python, and the colibri and colibri-infer installed beside it, first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def scratch(block, tmp_path, made_model):
    """The folder a block runs in: tests/fixtures as in a checkout, out/model where named."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(FIXTURES)
    if any("out/model" in l for l in block.lines):
        shutil.copytree(made_model, tmp_path / "out" / "model")
    return tmp_path


def run_commands(block, cwd):
    """[(README line, command, shown, printed, exit status)]: the block's commands in one bash,
    in order (a variable set by one is seen by the next), stdout and stderr together."""
    cmds = commands(block)
    script = ["exec 2>&1 </dev/null"]
    for n, (_, cmd, _) in enumerate(cmds):
        script += [cmd, f"printf '\\n@@readme-end-{n} %d@@\\n' $?"]
    r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=environment(), stdout=subprocess.PIPE,
                       timeout=TIMEOUT)
    text, out = r.stdout.decode("utf-8", errors="replace"), []
    for n, (line, cmd, shown) in enumerate(cmds):
        m = re.search(rf"\n@@readme-end-{n} (\d+)@@\n", text)
        if m is None:   # the shell itself stopped (`exit`, a syntax error)
            out.append((line, cmd, shown, text, None))
            break
        out.append((line, cmd, shown, text[:m.start()], int(m.group(1))))
        text = text[m.end():]
    return out


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block, tmp_path, made_model):
    what, detail = directive(block)
    if what == "skip":
        pytest.skip(f"{block.id}: not run: {detail}")
    cwd = scratch(block, tmp_path, made_model)
    if block.lang == "python":
        # padded so that the script's line numbers are README.md's
        script = cwd / ".readme" / "README.md"
        script.parent.mkdir()
        script.write_text("\n" * block.line + "\n".join(block.lines) + "\n", encoding="utf-8")
        r = subprocess.run([sys.executable, script], cwd=cwd, env=environment(), capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode == 0, f"{block.id}: the Python block failed:\n{r.stdout}{r.stderr}"
        return
    for line, cmd, shown, printed, status in run_commands(block, cwd):
        where = f"README.md:{line}: `{cmd}`"
        assert status is not None, f"{where}: the shell stopped here:\n{printed}"
        if any(s.strip() for s in shown):
            assert matches(shown, printed, detail), (
                f"{where} printed something else than the README shows"
                f"{' (these may vary: ' + ', '.join(sorted(detail)) + ')' if detail else ''}.\n"
                f"--- the README:\n" + "\n".join(shown).rstrip() + f"\n--- printed (exit status {status}):\n{printed}")
        else:
            assert status == 0, f"{where}: exit status {status}:\n{printed}"


def test_every_marker_sits_above_a_block():
    """A marker away from a block would silently mark nothing."""
    attached = {n for b in BLOCKS for n in b.marker_lines}
    for n, l in enumerate(README.read_text(encoding="utf-8").split("\n"), 1):
        if "<!--" in l and "readme:" in l:
            assert n in attached, f"README.md:{n}: a readme marker not just above a code block: {l}"


@pytest.mark.parametrize("shown, printed, kinds, ok", [
    (["a 1.5 ms b"], "a 1.5 ms b", set(), True),
    (["a 1.5 ms b"], "a 1.6 ms b", set(), False),
    (["a 1.5 ms b"], "a 12.6 ms b", {"times"}, True),
    (["x ( 2.8%)"], "x (12.5%)", {"shares"}, True),
    (["x ( 2.8%)"], "x (12.5%) y", {"shares"}, False),
    (["head", "...", "tail"], "head\n1\n2\ntail", set(), True),
    (["head", "...", "tail"], "head\ntail", set(), True),
    (["head", "...", "tail"], "head\n1\ntail\nmore", set(), False),
    (["(.../x.json)"], "(/a/b/x.json)", set(), True),
    (["b", "a"], "a\nb", {"order"}, True),
    (["b", "a"], "a\nb", set(), False),
    (["b", "a"], "a\nb\nc", {"order"}, False),
    (["avx512 kernels @0x7f00"], "avx2 kernels @0x5500", {"kernels", "addresses"}, True),
], ids=lambda v: None)
def test_the_comparison(shown, printed, kinds, ok):
    """The comparison of shown and printed output, on cases whose verdict is known."""
    assert matches(shown, printed, kinds) is ok

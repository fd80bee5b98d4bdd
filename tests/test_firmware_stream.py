"""Bare metal with the routed experts streamed (colibri.targets.firmware with an expert budget): a
model whose experts exceed the board's flash runs with only its resident prefix in flash, the
experts read as tokens need them from the host's weights.bin through semihosting, standing in for
an SD card.  The text and every logit are the host's, resident and streamed with the same budget
(strict mode), and `plan` is what the linker and the image report."""
import subprocess
import sys

import numpy as np
import pytest

from colibri.targets import infer_command
from colibri.targets import firmware as fw
from support import load_make_fixtures

BOARDS = list(fw.BOARDS)   # each with 4 MiB of flash
BOARD = "mps2-an386"       # Cortex-M4F: the board of the tests that need only one
CTX, BATCH, STACK = 64, 4, 8192
PROMPT = [1, 5, 9, 13, 17, 21]
SLOTS = 3              # of 8 experts a layer, 2 layers: most demanded experts are read


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """12.6 MB of routed experts (2 layers x 8 x 786 KB, f32) beside 0.8 MB of the rest."""
    from colibri.convert import convert

    cfg = dict(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
               max_position_embeddings=256, tie_word_embeddings=False,
               rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    root = tmp_path_factory.mktemp("stream")
    load_make_fixtures().build_model(cfg, seed=4).save_pretrained(root / "hf")
    return convert(root / "hf", root / "m", dtype="f32", layout="interleaved", progress=False)


@pytest.fixture(scope="module")
def budget(model):
    """SLOTS slots: the slot's size is the same on every target."""
    return SLOTS * fw.plan(BOARD, model, ctx=CTX, batch=BATCH, stack=STACK).expert_slot_bytes


@pytest.fixture(scope="module")
def images(model, budget):
    """{board: the streaming image}, built when first asked for."""
    class Images(dict):
        def __missing__(self, board):
            self[board] = fw.build_image(board, model, ctx=CTX, batch=BATCH, stack=STACK, expert_budget=budget)
            return self[board]
    return Images()


@pytest.fixture(scope="module")
def image(images):
    return images[BOARD]


def host(model, *args):
    """colibri-infer's output (the generated ids) in the strict mode, with the image's session shape."""
    command = [*infer_command("native"), "--reference", "--model", model, "--ctx", CTX, "--batch", BATCH, "--ids", *args]
    r = subprocess.run(list(map(str, command)), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


def run(model, image, *args, experts=None, board=BOARD, **kw):
    experts = model / "weights.bin" if experts is None else experts
    return fw.run(board, image, fw.arguments(*args, experts=experts, **{"kernels": "reference", **kw}), timeout=600)


def test_the_experts_exceed_the_flash_and_the_prefix_fits(model, budget):
    resident = fw.plan(BOARD, model, ctx=CTX, batch=BATCH, stack=STACK)
    assert resident.problems() and resident.problems()[0].startswith("flash: needs")
    assert f"--expert-budget, at least {resident.expert_min_budget:,} B" in resident.problems()[0]
    streamed = fw.plan(BOARD, model, ctx=CTX, batch=BATCH, stack=STACK, expert_budget=budget)
    assert not streamed.problems(), streamed.problems()
    assert streamed.streamed > streamed.flash_size > streamed.flash
    assert streamed.expert_slots == SLOTS and streamed.expert_min_budget == 2 * streamed.expert_slot_bytes
    assert streamed.arena >= resident.arena + budget
    r = subprocess.run([sys.executable, "-m", "colibri", "firmware", "plan", "--board", BOARD, "--model", str(model),
                        "--ctx", str(CTX), "--batch", str(BATCH), "--expert-budget", f"{budget / 1024}K"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "experts streamed" in r.stdout and f"{SLOTS} x " in r.stdout, r.stdout + r.stderr
    assert "fits" in r.stdout and "routed experts" in r.stdout


@pytest.mark.parametrize("board", BOARDS)
def test_the_text_is_the_hosts_resident_and_streamed(board, model, budget, images):
    resident = host(model, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens", 16, "--temperature", 0,
                    "--ignore_eos")
    assert resident.count(b",") == 15
    streamed = host(model, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens", 16, "--temperature", 0,
                    "--ignore_eos", "--expert_budget", budget)
    greedy = run(model, images[board], PROMPT, 16, ignore_eos=True, board=board)
    assert greedy.status == 0, greedy.output.decode(errors="replace")
    assert greedy.output == streamed == resident
    sampled = run(model, images[board], PROMPT, 16, temperature=0.9, top_k=50, top_p=0.9, seed=5, ignore_eos=True,
                  board=board)
    assert sampled.status == 0 and sampled.output == host(
        model, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens", 16, "--temperature", 0.9, "--top_k", 50,
        "--top_p", 0.9, "--seed", 5, "--ignore_eos")


@pytest.mark.parametrize("board", BOARDS)
def test_every_logit_is_the_hosts(board, model, images, tmp_path):
    n = 8
    result = run(model, images[board], PROMPT, n, ignore_eos=True, logits=tmp_path / "board.f32", board=board)
    assert result.status == 0, result.output.decode(errors="replace")
    ids = [int(t) for t in result.output.decode().strip().split(",")]
    host(model, "--tokens", ",".join(map(str, PROMPT + ids[:-1])), "--max_tokens", 0, "--logits",
         tmp_path / "host.f32")
    board_bits = np.fromfile(tmp_path / "board.f32", dtype="<u4")
    host_bits = np.fromfile(tmp_path / "host.f32", dtype="<u4")
    assert board_bits.size == host_bits.size == (len(PROMPT) + n - 1) * 512
    assert np.array_equal(board_bits, host_bits), f"{np.count_nonzero(board_bits != host_bits)} logits differ"


@pytest.mark.parametrize("board", BOARDS)
def test_plan_is_what_the_linker_and_the_image_report(board, model, budget, images):
    p = fw.plan(board, model, ctx=CTX, batch=BATCH, stack=STACK, expert_budget=budget)
    assert (p.flash, p.ram) == fw.image_usage(board, images[board])
    assert fw.symbol_size(board, images[board], "colibri_fw_ram") == p.metadata + p.arena
    result = run(model, images[board], PROMPT, 8, ignore_eos=True, board=board)
    assert result.status == 0, result.output.decode(errors="replace")
    r = result.report
    assert r["arena_needed"] == r["arena_reserved"] == p.arena and r["meta_reserved"] == p.metadata
    assert r["expert_budget"] == budget and r["weights_flash"] + p.streamed == (model / "weights.bin").stat().st_size
    assert (r["expert_slots"], r["expert_slot_bytes"]) == (p.expert_slots, p.expert_slot_bytes)
    assert r["expert_misses"] > 0 and r["expert_reads"] >= r["expert_misses"]
    assert r["expert_bytes_read"] == r["expert_reads"] * p.expert_slot_bytes   # one read per expert: its extent
    assert 0 < r["stack_used"] < r["stack_reserved"] == p.stack


def test_a_short_or_missing_experts_file_is_a_clear_failure(model, image, tmp_path):
    """A file that ends inside the experts: the read comes back short and the core says so; no
    file: the image says what it needs."""
    short = tmp_path / "weights.bin"
    data = (model / "weights.bin").read_bytes()
    short.write_bytes(data[:len(data) // 2])
    r = run(model, image, PROMPT, 8, experts=short)
    text = r.output.decode(errors="replace")
    assert r.status == 1 and "failed" in text and " expert " in text and "(COLIBRI_E_IO)" in text, text
    r = fw.run(BOARD, image, fw.arguments(PROMPT, 8), timeout=300)
    assert r.status == 1 and b"experts=FILE" in r.output, r.output
    r = run(model, image, PROMPT, 8, experts=tmp_path / "absent.bin")
    assert r.status == 1 and b"cannot read" in r.output, r.output


def test_the_cli_runs_the_streamed_board(model, budget, image):
    """`colibri firmware run --expert-budget` (the fixture's image) passes the model's weights.bin."""
    cli = subprocess.run([sys.executable, "-m", "colibri", "firmware", "run", "--board", BOARD, "--model", str(model),
                          "--ctx", str(CTX), "--batch", str(BATCH), "--expert-budget", str(budget), "--tokens",
                          ",".join(map(str, PROMPT)), "--max-tokens", "8", "--temperature", "0", "--verbose"],
                         capture_output=True, timeout=900)
    assert cli.returncode == 0, cli.stderr.decode(errors="replace")
    assert cli.stdout == host(model, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens", 8, "--temperature", 0)
    assert b"experts streamed" in cli.stderr and b"misses" in cli.stderr

"""Bare-metal firmware on every board (colibri.targets.firmware): the core with no OS and no heap,
the model linked into flash, run under QEMU system emulation.  The reference is the host's
colibri-infer in the strict mode (--reference), which every board must match bit for bit."""
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import colibri
from colibri.demo import MODEL_DIR
from colibri.targets import build, env_for, infer_command
from colibri.targets import firmware as fw
from support import FIXTURES, load_make_fixtures

BOARDS = list(fw.BOARDS)
PROMPT = [1, 591, 47, 39, 49, 28]   # <s> ROMEO:
TEXTS = ["ROMEO:", "ROMEO: café 😀 日本\nJULIET, (a,b) 100%"]   # encoded on the board
TINY = FIXTURES / "tiny-mixtral.colibri"


def host(*args):
    r = subprocess.run([*infer_command("native"), "--reference", *map(str, args)], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


def image(board):
    """The bundled model's image, as `meson test` builds it."""
    return build(board) / "firmware" / "colibri-firmware.elf"


def run_ok(board, elf, *args, **kw):
    """The image in the strict mode (kernels=reference), unless told otherwise."""
    result = fw.run(board, elf, fw.arguments(*args, **{"kernels": "reference", **kw}), timeout=300)
    assert result.status == 0, result.output.decode(errors="replace")
    return result


@pytest.mark.parametrize("board", BOARDS)
def test_c_tests_pass_on_the_board(board):
    """The core's own C tests (loading from memory, the caller arena, elementary functions
    against the board's libm) and the firmware image, through `meson test` and QEMU."""
    r = subprocess.run(["meson", "test", "-C", str(build(board)), "--print-errorlogs"], capture_output=True,
                       text=True, env=env_for(board), timeout=600)
    assert r.returncode == 0 and "Fail:              0" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("board", BOARDS)
def test_greedy_and_sampled_text_match_the_host(board):
    greedy = run_ok(board, image(board), PROMPT, 24, ignore_eos=True)
    assert greedy.output == host("--model", MODEL_DIR, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens", 24,
                                 "--temperature", 0, "--ignore_eos")
    sampled = run_ok(board, image(board), PROMPT, 24, temperature=0.9, top_k=50, top_p=0.9, seed=5)
    assert sampled.output == host("--model", MODEL_DIR, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens", 24,
                                  "--temperature", 0.9, "--top_k", 50, "--top_p", 0.9, "--seed", 5)


def generate(*args):
    """What the host's `colibri generate` prints."""
    r = subprocess.run([sys.executable, "-m", "colibri", "generate", *map(str, args)], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("board", BOARDS)
def test_text_prompts_are_encoded_on_the_board_as_on_the_host(board, text, tmp_path):
    """The image encodes text= with the model's encoder and prints what `colibri generate` prints,
    greedy and seeded; the ids it fed are Model.tokenize's (the prompt's logits, bit for bit, are
    the host's for those ids)."""
    greedy = run_ok(board, image(board), text, 24, ignore_eos=True, logits=tmp_path / "board.f32")
    assert greedy.output == generate("--prompt", text, "--max-tokens", 24, "--temperature", 0, "--ignore-eos")
    sampled = run_ok(board, image(board), text, 24, temperature=0.9, top_k=50, top_p=0.9, seed=5)
    assert sampled.output == generate("--prompt", text, "--max-tokens", 24, "--temperature", 0.9, "--top-k", 50,
                                      "--top-p", 0.9, "--seed", 5)
    ids = colibri.Model(MODEL_DIR).tokenize(text)
    assert greedy.report["prompt_tokens"] == len(ids)
    host("--model", MODEL_DIR, "--tokens", ",".join(map(str, ids)), "--max_tokens", 0, "--logits",
         tmp_path / "host.f32")
    prompt_bits = np.fromfile(tmp_path / "board.f32", dtype="<u4")[:len(ids) * 1024]
    assert np.array_equal(prompt_bits, np.fromfile(tmp_path / "host.f32", dtype="<u4"))
    assert 0 < greedy.report["stack_used"] < greedy.report["stack_reserved"]   # the encoder's frames included


def test_text_arguments_carry_any_byte():
    """Spaces, commas, newlines and '%' go as %XX (QEMU splits at spaces, doubles commas); ids stay ids."""
    assert fw.arguments("a b,\n%é", 1)[0] == "text=a%20b%2C%0A%25%C3%A9"
    assert fw.arguments([1, 2], 1)[0] == "ids=1:2"
    assert fw.arguments("", 1)[0] == "text="


def test_bad_text_and_a_model_without_an_encoder_are_reported(tmp_path):
    """A malformed %XX, text with ids, a prompt longer than the image's buffer or the command line,
    and text for a model that carries no encoder: each a message, never a run."""
    elf = image("mps2-an386")
    for args, message in [(["text=ab%2"], b"must start %XX"), (["text=a", "ids=1"], b"give the prompt once"),
                          (["text=" + "a" * 400], b"the image holds at most 256")]:
        r = fw.run("mps2-an386", elf, [*args, "max_tokens=1"], timeout=120)
        assert r.status != 0 and message in r.output, (args, r.output)
    with pytest.raises(fw.FirmwareError, match="semihosting passes at most 1022"):
        fw.run("mps2-an386", elf, fw.arguments("x" * 1000, 1), timeout=120)
    shutil.copytree(TINY, tmp_path / "m")   # as a model converted before models carried an encoder
    meta = json.loads((tmp_path / "m" / "colibri_model.json").read_text())
    del meta["encoder"]
    meta["tensors"] = [t for t in meta["tensors"] if t["name"] in ("tokenizer.token_bytes", "tokenizer.token_offsets")
                       or not t["name"].startswith("tokenizer.")]
    (tmp_path / "m" / "colibri_model.json").write_text(json.dumps(meta))
    elf = fw.build_image("mps2-an386", tmp_path / "m", ctx=48, batch=5)
    r = fw.run("mps2-an386", elf, fw.arguments("hello", 1), timeout=120)
    assert r.status == 1 and b"carries no encoder" in r.output and b"ids=" in r.output, r.output
    assert run_ok("mps2-an386", elf, [1, 5], 2).status == 0   # ids still run


def test_a_stack_too_small_for_the_encoder_is_reported():
    """4 KiB holds a generation from ids but not the encoder's frames: the guard painted below
    the budget shows it, even where a frame skips the budget's last bytes."""
    elf = fw.build_image("mps2-an386", MODEL_DIR, stack=4096)
    assert run_ok("mps2-an386", elf, PROMPT, 2).report["stack_used"] < 4096
    r = fw.run("mps2-an386", elf, fw.arguments("ROMEO:", 2), timeout=120)
    assert r.status == 1 and b"the stack outgrew its budget of 4096 bytes encoding the prompt" in r.output, r.output


@pytest.mark.parametrize("board", BOARDS)
def test_logits_are_bit_identical_to_the_host(board, tmp_path):
    """Every position's logits, the prompt's and each decode step's, in the same float bits as
    the host's strict mode."""
    n = 12
    ids = [int(t) for t in host("--model", MODEL_DIR, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens", n,
                                "--temperature", 0, "--ignore_eos", "--ids").decode().split(",")]
    run_ok(board, image(board), PROMPT, n, ignore_eos=True, logits=tmp_path / "board.f32")
    fed = PROMPT + ids[:-1]   # what the board fed: the prompt, then each token it generated but the last
    host("--model", MODEL_DIR, "--tokens", ",".join(map(str, fed)), "--max_tokens", 0, "--logits",
         tmp_path / "host.f32")
    board_bits = np.fromfile(tmp_path / "board.f32", dtype="<u4")
    host_bits = np.fromfile(tmp_path / "host.f32", dtype="<u4")
    assert board_bits.size == host_bits.size == len(fed) * 1024
    assert np.array_equal(board_bits, host_bits), f"{np.count_nonzero(board_bits != host_bits)} logits differ"


@pytest.mark.parametrize("board", BOARDS)
def test_plan_is_what_the_linker_and_the_arena_report(board):
    """`plan` (made on this host, before building) equals the built image's flash and RAM as the
    size tool reports them, and the board's own session and metadata sizes: for another model
    and another context than the measured image's."""
    p = fw.plan(board, TINY, ctx=48, batch=5, stack=4096)
    elf = fw.build_image(board, TINY, ctx=48, batch=5, stack=4096)
    assert (p.flash, p.ram) == fw.image_usage(board, elf)
    assert fw.symbol_size(board, elf, "colibri_fw_ram") == p.metadata + p.arena
    r = run_ok(board, elf, [1, 5, 9], 8, temperature=0.8, top_k=40, top_p=0.95).report
    assert r["arena_needed"] == r["arena_reserved"] == p.arena
    assert r["meta_reserved"] == p.metadata and p.metadata - 64 < r["meta_needed"] <= p.metadata
    assert 0 < r["stack_used"] < r["stack_reserved"] == p.stack


@pytest.mark.parametrize("board", BOARDS)
def test_the_image_links_no_allocator(board):
    symbols = fw._run_tool(board, "nm", image(board)).split()
    assert not {"malloc", "calloc", "realloc", "free", "_malloc_r", "__malloc_sbrk_base"} & set(symbols)


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """A model of 21 MB (f32) and 65536 positions: too big for 4 MiB of flash, and its KV cache
    at full context too big for any board's RAM."""
    from colibri.convert import convert

    cfg = dict(vocab_size=4096, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=8, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
               max_position_embeddings=65536, tie_word_embeddings=False,
               rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    root = tmp_path_factory.mktemp("big")
    load_make_fixtures().build_model(cfg, seed=1).save_pretrained(root / "hf")
    return convert(root / "hf", root / "big", dtype="f32", progress=False)


def test_a_model_that_does_not_fit_is_refused_before_building(big_model):
    p = fw.plan("mps2-an386", big_model, ctx=256)
    assert p.flash > p.flash_size and len(p.problems()) == 1 and p.problems()[0].startswith("flash: needs")
    p = fw.plan("mps2-an500", big_model, ctx=65536)
    assert any(x.startswith("RAM: needs") and "lower --ctx" in x for x in p.problems())
    for command in (["plan"], ["build"], ["run", "--tokens", "1"]):
        r = subprocess.run([sys.executable, "-m", "colibri", "firmware", *command[:1], "--board", "mps2-an386",
                            "--model", str(big_model), *command[1:]], capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert "flash: needs" in r.stdout + r.stderr and "Traceback" not in r.stderr, (command, r.stderr)


def test_a_hung_image_is_stopped_and_reported_with_its_output():
    with pytest.raises(fw.FirmwareError, match=r"did not finish within 1 s(.|\n)*ROMEO"):
        fw.run("mps2-an386", image("mps2-an386"), fw.arguments(PROMPT, 10**6, ignore_eos=True), timeout=1)


def test_the_cli_runs_the_board_as_generate_runs_the_host():
    cli = subprocess.run([sys.executable, "-m", "colibri", "firmware", "run", "--board", "virt-rv32", "--prompt",
                          "ROMEO:", "--max-tokens", "20", "--temperature", "0", "--verbose"],
                         capture_output=True, check=True, timeout=600)
    assert cli.stdout == generate("--prompt", "ROMEO:", "--max-tokens", 20, "--temperature", 0)
    assert b"tok/s" in cli.stderr and b"emulated" in cli.stderr
    ids = subprocess.run([sys.executable, "-m", "colibri", "firmware", "run", "--board", "virt-rv32", "--tokens",
                          ",".join(map(str, PROMPT)), "--max-tokens", "20", "--temperature", "0"],
                         capture_output=True, check=True, timeout=600)
    assert ids.stdout == cli.stdout   # --tokens passes ids, for a model with no encoder


# ---- Small boards: the bundled model at q8_0 and q4_0 on the memory of common MCU classes

def host_logits(model, ids, path):
    """The host's strict-mode logits (bits) of every position of `ids`."""
    host("--model", model, "--tokens", ",".join(map(str, ids)), "--max_tokens", 0, "--logits", path)
    return np.fromfile(path, dtype="<u4")


@pytest.mark.parametrize("dtype, flash, ram", [("q8_0", 2 << 20, 512 << 10), ("q4_0", 1 << 20, 256 << 10)])
def test_the_quantized_bundled_model_on_a_small_chip(dtype, flash, ram, bundled_quantized, tmp_path):
    """`firmware plan` for the bundled model at q8_0 (converted here) on a chip of 2 MiB flash and
    512 KiB RAM, at q4_0 on one of 1 MiB and 256 KiB: the longest context it gives fits and one more
    does not, the image linked for that memory occupies what the plan says, and on the board it
    gives the host's strict logits bit for bit."""
    model, board = bundled_quantized[dtype], "mps2-an386"
    ctx = fw.largest_ctx(board, model, flash, ram)
    assert 0 < ctx < 256
    p, more = (fw.for_memory(fw.plan(board, model, ctx=c), flash, ram) for c in (ctx, ctx + 1))
    assert not p.problems() and more.problems() and more.problems()[0].startswith("RAM: needs")
    elf = fw.build_image(board, model, ctx=ctx, chip=(flash, ram))
    assert fw.image_usage(board, elf) == (p.flash, p.ram) and p.ram <= ram < more.ram

    r = run_ok(board, elf, PROMPT, 8, ignore_eos=True, logits=tmp_path / "board.f32")
    ids = [int(t) for t in host("--model", model, "--ctx", ctx, "--tokens", ",".join(map(str, PROMPT)),
                                "--max_tokens", 8, "--temperature", 0, "--ignore_eos", "--ids").decode().split(",")]
    assert r.report["kernels"] == "reference"
    board_bits = np.fromfile(tmp_path / "board.f32", dtype="<u4")
    assert np.array_equal(board_bits, host_logits(model, PROMPT + ids[:-1], tmp_path / "host.f32"))


def test_a_chip_too_small_is_refused_before_building(bundled_quantized):
    """1 MiB of flash does not hold q8_0 with the code: the plan says by how much, and no image is
    built; `plan --flash --ram` names the longest context a chip holds."""
    p = fw.for_memory(fw.plan("mps2-an386", bundled_quantized["q8_0"], ctx=16), 1 << 20, 256 << 10)
    assert p.problems()[0].startswith("flash: needs") and "the chip has 1,048,576 B" in p.problems()[0]
    with pytest.raises(fw.FirmwareError, match="does not fit a chip of 1,048,576 B flash"):
        fw.build_image("mps2-an386", bundled_quantized["q8_0"], ctx=16, chip=(1 << 20, 256 << 10))
    r = subprocess.run([sys.executable, "-m", "colibri", "firmware", "plan", "--board", "mps2-an386", "--model",
                        str(bundled_quantized["q8_0"]), "--flash", "2M", "--ram", "512K"], capture_output=True,
                       text=True, timeout=300)
    largest = fw.largest_ctx("mps2-an386", bundled_quantized["q8_0"], 2 << 20, 512 << 10)
    assert largest < fw.DEFAULT_CTX   # the default context does not fit: the plan says so, and what does
    assert r.returncode == 1 and f"\nlargest n_ctx that fits: {largest}\n" in r.stdout, r.stdout + r.stderr


# ---- Helium (MVE) on the Cortex-M55 of mps3-an547

M55 = "mps3-an547"


def test_the_mve_kernels_match_the_reference_on_the_m55():
    """The core's kernel test on the board: mve and mve-int8 (its int8 path alone) against the
    reference, every kernel and tail length, the int8 path (q8_0, q4_0 and their x8 layouts) in
    the scalar int8 path's bits."""
    r = subprocess.run(["meson", "test", "-C", str(build(M55)), "kernel variants against the reference", "--verbose"],
                       capture_output=True, text=True, env=env_for(M55), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    for variant in ("mve", "mve-int8"):
        for what in ("kernels", "tails 1..385", "softmax, silu, rmsnorm", "attention (f32, f16, q8_0 caches)"):
            assert re.search(rf"^{variant} {re.escape(what)}: [1-9]\d* outputs compared with the reference, 0 outside",
                             r.stdout, re.M), (variant, what, r.stdout[-3000:])
        assert re.search(rf"^{variant} f16 weights, every bit pattern: 65536 outputs compared with the reference, 0 differ",
                         r.stdout, re.M)


def board_logits(board, elf, model, tmp_path, kernels, host_kernels_name, n=8):
    """(the board's logits of every position with kernels=`kernels`, the host's for the ids the board
    fed with colibri-infer --kernels `host_kernels_name`; None: the host's best)."""
    r = run_ok(board, elf, PROMPT, n, ignore_eos=True, logits=tmp_path / "board.f32", kernels=kernels)
    assert r.report["kernels"] == kernels
    ids = [int(t) for t in host_kernels(host_kernels_name, "--model", model, "--tokens", ",".join(map(str, PROMPT)),
                                        "--max_tokens", n, "--temperature", 0, "--ignore_eos", "--ids").decode().split(",")]
    host_kernels(host_kernels_name, "--model", model, "--tokens", ",".join(map(str, PROMPT + ids[:-1])),
                 "--max_tokens", 0, "--logits", tmp_path / "host.f32")
    return np.fromfile(tmp_path / "board.f32", dtype="<f4"), np.fromfile(tmp_path / "host.f32", dtype="<f4")


def host_kernels(kernels, *args):
    """colibri-infer on the host with a kernel variant by name (None: the host's best)."""
    options = ["--kernels", kernels] if kernels else []
    r = subprocess.run([*infer_command("native"), *options, *map(str, args)], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


def test_mve_is_the_m55_images_own_and_agrees_with_the_host(tmp_path):
    """Unasked, the M55 image computes with mve: its logits (the bundled model's f16 weights) agree
    with the host's fast mode as two targets' do (test_targets: only summation order differs), and
    its greedy text is the host's."""
    r = fw.run(M55, image(M55), fw.arguments(PROMPT, 24, ignore_eos=True, logits=tmp_path / "board.f32"), timeout=300)
    assert r.status == 0 and r.report["kernels"] == "mve", r.output
    assert r.output == host_kernels(None, "--model", MODEL_DIR, "--tokens", ",".join(map(str, PROMPT)), "--max_tokens",
                                    24, "--temperature", 0, "--ignore_eos")
    board, host_fast = board_logits(M55, image(M55), MODEL_DIR, tmp_path, "mve", None)
    print(f"mve: max |board - host| {np.abs(board - host_fast).max():.2e}")
    np.testing.assert_allclose(board, host_fast, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_mve_int8_path_is_the_scalar_one_on_the_m55(dtype, bundled_quantized, tmp_path):
    """The bundled model at q8_0 / q4_0 (repacked to the x8 layouts, as converted by default): with
    mve's int8 path (mve-int8, the rest the reference) the board's logits are the host's scalar int8
    path's (reference-int8) bit for bit; with all of mve, within test_quantized's bound of the scalar
    int8 path (the same integers, float sums in another order).  That bound holds for these tokens:
    on longer sequences a last-bit difference in mve's norms or attention can flip an activation's
    int8 rounding, as benchmarks/int8_spread.py measures for the x86 variants."""
    elf = fw.build_image(M55, bundled_quantized[dtype], ctx=64)
    board, scalar = board_logits(M55, elf, bundled_quantized[dtype], tmp_path, "mve-int8", "reference-int8")
    assert np.array_equal(board.view(np.uint32), scalar.view(np.uint32)), f"{np.count_nonzero(board != scalar)} differ"
    board, scalar = board_logits(M55, elf, bundled_quantized[dtype], tmp_path, "mve", "reference-int8")
    print(f"mve {dtype}: max |board - host's reference-int8| {np.abs(board - scalar).max():.2e}")
    np.testing.assert_allclose(board, scalar, atol=1e-4, rtol=0)

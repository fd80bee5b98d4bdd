"""Firmware images: the core with no OS and no heap, the model linked into flash, run under QEMU
system emulation with output and files through semihosting.

    colibri firmware plan  --board mps2-an386 --model PATH --ctx 256   # flash and RAM, before building
    colibri firmware build --board mps2-an386 [--model PATH]
    colibri firmware run   --board mps2-an386 --prompt "ROMEO:" --max-tokens 64
    colibri firmware run   --board mps2-an386 --model BIG --expert-budget 2M --tokens 1,2,3   # experts streamed

`run` passes the prompt as text: the image encodes it with the encoder the model carries
(colibri_tokenize, on the board); --tokens passes ids, for a model converted without one.

An image is the board's build of the core and firmware/ plus one generated assembly file that holds
everything model-specific (firmware/plan/model_image.c), so its code is the same for every model.
`plan` measures that code once per board, from the image of the bundled model (<builds>/<board>),
with the toolchain's size tool, and adds what the model and context need: the model's bytes, and
the metadata and arena sizes the core computes on this host with the layout every target uses,
asked of the same program (colibri-model-image --plan) that writes the image's model file.

With an expert budget the image streams the routed experts of an interleaved model: flash holds
weights.bin's resident prefix (docs/FORMAT.md), the arena a pool of cache slots of that many bytes,
and the image reads the experts from the host's weights.bin through semihosting (experts=FILE),
standing in for an SD card, so a model whose experts exceed the flash runs."""
import dataclasses
import hashlib
import json
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from colibri import targets
from colibri.targets import TargetError, build, build_dir, cross_files, meson_build


@dataclass(frozen=True)
class Board:
    """A board as its cross file (toolchains/*.ini, [properties] colibri_*) describes it."""
    name: str
    cpu: str            # "Cortex-M4F"
    float: str          # "single-precision FPU"
    qemu: tuple         # the system emulator of the board, to which run() adds the image
    flash: int          # the memory map, as the cross file gives it to the linker
    flash_size: int
    ram: int
    ram_size: int
    tools: str          # the toolchain's binutils prefix, "arm-none-eabi-"
    freertos: bool      # the cross file names a FreeRTOS port (-Dfreertos_kernel builds an image)
    model_flash: int = 0        # a flash of the model's own (colibri_model_flash: mps3-an547's QSPI), else 0
    model_flash_size: int = 0


_SYSTEM = ("-nographic", "-monitor", "none", "-serial", "none", "-chardev", "stdio,id=out")
# picolibc's semihosting start-up reads the command line into 1 KiB; a longer one reaches main as
# no arguments (measured on every board: 1,022 characters pass, 1,023 do not).
MAX_COMMAND_LINE = 1022
DEFAULT_CTX, DEFAULT_BATCH, DEFAULT_STACK = 256, 16, 12288   # as meson.options; the encoder takes ~5.6 KiB


def _boards():
    out = {}
    for name, f in cross_files("colibri_board").items():
        p = f["properties"]
        (flash, flash_size), (ram, ram_size) = [[int(v, 0) for v in p[k]] for k in ("colibri_flash", "colibri_ram")]
        model_flash, model_flash_size = [int(v, 0) for v in p.get("colibri_model_flash", ["0", "0"])]
        out[name] = Board(name, p["colibri_cpu"], p["colibri_float"], (*p["colibri_qemu"], *_SYSTEM), flash,
                          flash_size, ram, ram_size, f["binaries"]["size"].removesuffix("size"),
                          bool(p.get("colibri_freertos_port")), model_flash, model_flash_size)
    return out


def __getattr__(name):
    """BOARDS ({name: Board}), read from toolchains/ when first asked for."""
    if name == "BOARDS":
        return _boards()
    raise AttributeError(f"module 'colibri.targets.firmware' has no attribute {name!r}")


class FirmwareError(TargetError):
    """A model that does not fit a board, a board tool that failed, an image that hung."""


def _board(name):
    boards = _boards()
    if name not in boards:
        raise FirmwareError(f"unknown board {name!r}: one of {', '.join(boards)}")
    return boards[name]


def memory_map(board):
    """{flash, flash_size, ram, ram_size, model_flash, model_flash_size}: picolibc's --defsym values
    in the board's cross file, and the flash its model has to itself (0, 0: none, the model is in
    `flash` with the code)."""
    b = _board(board)
    return {"flash": b.flash, "flash_size": b.flash_size, "ram": b.ram, "ram_size": b.ram_size,
            "model_flash": b.model_flash, "model_flash_size": b.model_flash_size}


def _tool(board, name):
    """A binutils program of the board's toolchain, e.g. arm-none-eabi-size."""
    return _board(board).tools + name


def _run_tool(board, name, *args):
    r = subprocess.run([_tool(board, name), *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise FirmwareError(f"{_tool(board, name)} failed: {r.stderr.strip()}")
    return r.stdout


def sections(board, elf):
    """{section: (size, address)} of the image's allocated sections, from the size tool."""
    out = {}
    for line in _run_tool(board, "size", "-A", "-d", elf).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and int(parts[2]) != 0:
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out


def image_usage(board, elf):
    """(flash, ram) bytes the image occupies: flash from its start to the end of the code and
    constants plus the load image of .data (plus, on a board with a flash for the model, that
    flash from its start to the model's end), RAM from its start to the end of the stack
    reservation.  All as the linker placed them."""
    mm, secs = memory_map(board), sections(board, elf)

    def extent(start, size):
        inside = [a + s for s, a in secs.values() if start <= a < start + size]
        return max(inside) - start if inside else 0

    flash = extent(mm["flash"], mm["flash_size"]) + sum(secs.get(n, (0, 0))[0] for n in (".data", ".tdata"))
    if mm["model_flash_size"]:
        flash += extent(mm["model_flash"], mm["model_flash_size"])
    return flash, extent(mm["ram"], mm["ram_size"])


def symbol_size(board, elf, name):
    for line in _run_tool(board, "nm", "-S", elf).splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == name:
            return int(parts[1], 16)
    raise FirmwareError(f"{elf} has no symbol {name}")


def _align64(n):
    return (n + 63) // 64 * 64


@dataclass
class Plan:
    board: str
    model: str
    ctx: int
    batch: int
    code_flash: int     # code and constants, the same for every model
    model_flash: int    # weights.bin and the JSON, 64-byte aligned
    code_ram: int       # the code's own data and bss
    metadata: int       # the model's tables (colibri_model_load's meta)
    arena: int          # the session: activations, KV cache, router, sampling, expert cache slots
    stack: int
    flash_size: int     # the board's flash; with model_flash_size, the code's flash alone
    ram_size: int
    model_flash_size: int = 0   # a flash of the model's own (mps3-an547's QSPI); 0: the model is in flash
    expert_budget: int = 0      # bytes of expert cache slots in the arena; 0: the experts in flash
    expert_slots: int = 0       # the slots the budget holds
    expert_slot_bytes: int = 0  # one slot: the largest routed expert (0: no routed experts)
    expert_min_budget: int = 0  # the smallest budget: one layer's top_k slots
    streamed: int = 0           # bytes of weights.bin left on storage: the experts' extents
    kv_type: str = "f32"        # what the session's KV cache stores: f32, f16, q8_0
    chip: str = ""              # for_memory's: not the board's memory, this one (the code still the board's)

    @property
    def where(self):
        return "the chip" if self.chip else self.board

    @property
    def flash(self):
        return self.code_flash + self.model_flash

    @property
    def ram(self):
        return self.code_ram + self.metadata + self.arena + self.stack

    def problems(self):
        out = []
        stream = (f", stream the experts (--expert-budget, at least {self.expert_min_budget:,} B; an interleaved "
                  f"model)" if self.expert_slot_bytes and not self.expert_budget else "")
        if self.model_flash_size and self.model_flash > self.model_flash_size:
            out.append(f"model flash: needs {self.model_flash:,} B, {self.where} has {self.model_flash_size:,} B "
                       f"(over by {self.model_flash - self.model_flash_size:,} B): store the weights as q8_0, q4_0, "
                       f"f16 or bf16{stream}, or use a smaller model")
        if self.model_flash_size and self.code_flash > self.flash_size:
            out.append(f"flash: the code needs {self.code_flash:,} B, {self.where} has {self.flash_size:,} B")
        if not self.model_flash_size and self.flash > self.flash_size:
            out.append(f"flash: needs {self.flash:,} B, {self.where} has {self.flash_size:,} B "
                       f"(over by {self.flash - self.flash_size:,} B; the model alone is {self.model_flash:,} B): "
                       f"store the weights as q8_0, q4_0, f16 or bf16{stream}, or use a smaller model")
        if self.ram > self.ram_size:
            slots = f", {self.expert_budget:,} B of it expert slots" if self.expert_budget else ""
            out.append(f"RAM: needs {self.ram:,} B, {self.where} has {self.ram_size:,} B "
                       f"(over by {self.ram - self.ram_size:,} B; the session arena is {self.arena:,} B{slots}): "
                       f"lower --ctx (the KV cache grows with it), --batch" + (" or --expert-budget" if slots else ""))
        return out

    def table(self):
        def row(label, n, total=None):
            tail = f"{total:>14,}  {n / total:6.1%}" if total else ""
            return f"  {label:<34}{n:>12,}{tail}"
        b = _board(self.board)
        model = "model (resident prefix + JSON)" if self.expert_budget else "model (weights.bin + JSON)"
        on = f"{self.chip}, the code as on {self.board} ({b.cpu})" if self.chip else f"{self.board} ({b.cpu}, {b.float})"
        lines = [f"{self.model} on {on}, n_ctx {self.ctx}, n_batch {self.batch}"
                 + (f", kv cache {self.kv_type}" if self.kv_type != "f32" else "")
                 + (", experts streamed" if self.expert_budget else ""),
                 f"{'flash':<36}{'bytes':>12}{'of the chip' if self.chip else 'of the board':>14}"]
        if self.model_flash_size:   # two flashes: the code's, the model's
            lines += [row("code and constants", self.code_flash, self.flash_size),
                      row("model, in a flash of its own", self.model_flash, self.model_flash_size)]
        else:
            lines += [row("code and constants", self.code_flash), row(model, self.model_flash),
                      row("total", self.flash, self.flash_size)]
        lines += ["RAM", row("code's data and bss", self.code_ram), row("model tables (metadata)", self.metadata),
                 row("session arena", self.arena)]
        if self.expert_budget:
            lines.append(row(f"  expert slots ({self.expert_slots} x {self.expert_slot_bytes:,} B)",
                             self.expert_slots * self.expert_slot_bytes))
        lines += [row("stack", self.stack), row("total", self.ram, self.ram_size)]
        if self.expert_budget:
            lines += ["storage (read as tokens need them)", row("routed experts", self.streamed)]
        problems = self.problems()
        lines.append("fits" if not problems else "does not fit:\n  " + "\n  ".join(problems))
        return "\n".join(lines)


@dataclass
class CodeSize:
    flash: int
    ram: int


def code_size(board):
    """Flash and RAM of the board's image less everything model_image.S holds: measured on the
    image of the bundled model.  Exact for any model: the model block and the RAM block are one
    64-byte aligned object each, a multiple of 64 long, so changing them shifts what follows
    without changing any padding."""
    elf = build(board) / "firmware" / "colibri-firmware.elf"
    flash, ram = image_usage(board, elf)
    return CodeSize(flash - symbol_size(board, elf, "colibri_fw_model"),
                    ram - symbol_size(board, elf, "colibri_fw_ram") - stack_reserved(board, elf))


def stack_reserved(board, elf):
    for line in _run_tool(board, "nm", elf).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "__stack_size":
            return int(parts[0], 16)
    raise FirmwareError(f"{elf} has no __stack_size")


def plan(board, model_dir, ctx=DEFAULT_CTX, batch=DEFAULT_BATCH, stack=DEFAULT_STACK, expert_budget=0, kv_type="f32"):
    """What an image of this model and session needs on this board, without building it.  With an
    expert budget (bytes), the image that streams the routed experts; kv_type: the session's KV
    cache type (Session's kv_type)."""
    mm, code = memory_map(board), code_size(board)   # builds <builds>/<board>, with colibri-model-image
    path = Path(model_dir).resolve()
    tool = build(board) / "firmware" / "colibri-model-image"
    r = subprocess.run([str(tool), "--plan", str(path), str(ctx), str(batch), str(stack), str(expert_budget), kv_type],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise FirmwareError(r.stderr.strip().removeprefix("colibri-model-image: "))
    n = {key: int(value) for key, _, value in (line.partition(": ") for line in r.stdout.splitlines())}
    return Plan(board, path.name, ctx, min(batch, ctx), code.flash, n["model_flash"], code.ram, n["metadata"],
                n["arena"], stack, mm["flash_size"], mm["ram_size"], mm["model_flash_size"], n["expert_budget"], n["expert_slots"],
                n["expert_slot_bytes"], n["expert_min_budget"], n["streamed"], kv_type)


def for_memory(p, flash, ram):
    """The plan `p` on a chip of `flash` and `ram` bytes (the code as on p's board's CPU, the model
    in the same flash): what a board of one's own, or an MCU class, would hold."""
    return dataclasses.replace(p, chip=f"a chip of {flash:,} B flash, {ram:,} B RAM", flash_size=flash,
                               ram_size=ram, model_flash_size=0)


def largest_ctx(board, model_dir, flash, ram, batch=DEFAULT_BATCH, stack=DEFAULT_STACK, kv_type="f32"):
    """The longest context, up to the model's max_position_embeddings, at which an image of the model
    fits `flash` and `ram` bytes with `board`'s code: the arena (the KV cache) grows with n_ctx, so
    it is a bisection over plans.  0: none fits (the flash, or the RAM at n_ctx 1)."""
    hparams = json.loads((Path(model_dir) / "colibri_model.json").read_text())["hparams"]

    def fits(ctx):
        return not for_memory(plan(board, model_dir, ctx, batch, stack, kv_type=kv_type), flash, ram).problems()

    lo, hi = 0, int(hparams["max_position_embeddings"])   # fits(lo) (or lo == 0); the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def build_image(board, model_dir, ctx=DEFAULT_CTX, batch=DEFAULT_BATCH, stack=DEFAULT_STACK, expert_budget=0,
                chip=None, kv_type="f32"):
    """Plans, refuses what does not fit, builds; returns the image's path.  Each (board, model,
    session) gets its own build directory under firmware/ of the builds' folder (targets.build_dir).
    `chip` (flash, RAM bytes): the image linked for that memory instead of the board's (the plan
    of for_memory), so the linker refuses what overflows it; it still runs on the board."""
    p = plan(board, model_dir, ctx, batch, stack, expert_budget, kv_type)
    if chip:
        if _board(board).model_flash_size:
            raise FirmwareError(f"{board} keeps its model in a flash of its own: plan a chip on another board")
        p = for_memory(p, *chip)
    if p.problems():
        raise FirmwareError(f"{p.model} does not fit {p.chip or board}:\n  " + "\n  ".join(p.problems()))
    model_dir = str(Path(model_dir).resolve())
    key = hashlib.sha1(f"{model_dir}|{ctx}|{batch}|{stack}|{expert_budget}|{chip}|{kv_type}".encode()).hexdigest()[:12]
    out = build_dir() / "firmware" / f"{board}-{key}"
    options = [*targets.OPTIONS[board]]
    if chip:   # a second cross file: the board's link arguments with the chip's sizes
        link = [a for a in cross_files("colibri_board")[board]["built-in options"]["c_link_args"]
                if not a.startswith(("-Wl,--defsym=__flash_size=", "-Wl,--defsym=__ram_size="))]
        link += [f"-Wl,--defsym=__flash_size={chip[0]:#x}", f"-Wl,--defsym=__ram_size={chip[1]:#x}"]
        out.parent.mkdir(parents=True, exist_ok=True)
        (out.parent / f"{out.name}.ini").write_text(f"[built-in options]\nc_link_args = {link!r}\n")
        options += ["--cross-file", str(out.parent / f"{out.name}.ini")]
    # -Dtests=false: an image needs none of the C tests, which build(board) builds and runs
    out = meson_build(out, [*options, "-Dtests=false", f"-Dfirmware_model={model_dir}", f"-Dfirmware_ctx={ctx}",
                            f"-Dfirmware_batch={batch}", f"-Dfirmware_stack={stack}",
                            f"-Dfirmware_expert_budget={expert_budget}", f"-Dfirmware_kv_type={kv_type}"])
    return out / "firmware" / "colibri-firmware.elf"


@dataclass
class Run:
    status: int
    output: bytes       # what the image printed: the text, or the failing step
    report: dict        # memory and timing (counts), the kernel variant (name), from the image (firmware/app/firmware.c)

    def tokens_per_second(self):
        r = self.report
        return r["generated_tokens"] * r["ticks_per_second"] / r["decode_ticks"] if r.get("decode_ticks") else 0.0


# QEMU's instruction counting: the virtual clock advances one nanosecond per instruction retired,
# so a board clock read by the image (ticks at ticks_per_second) counts instructions.
ICOUNT = ("-icount", "shift=0")


def instructions(run_result, ticks):
    """Instructions retired over `ticks` of the board's clock in a run under ICOUNT."""
    return ticks * 10**9 // run_result.report["ticks_per_second"]


def run(board, image, arguments, timeout=600, qemu_options=()):
    """Runs `image` on the board under QEMU with the firmware's arguments ("text=ROMEO%3A",
    "max_tokens=20", ...) and any more QEMU options (ICOUNT).  A fault ends QEMU with status 1 and
    the registers printed; a hang is stopped after `timeout` seconds and reported with everything
    QEMU printed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.txt"
        args = [*arguments, f"report={report}"]
        if any(c.isspace() for a in args for c in a):   # the image's command line is split at spaces
            raise FirmwareError(f"{board}: an argument holds a space, which semihosting cannot pass: {args}")
        if len(" ".join(args)) > MAX_COMMAND_LINE:   # else the image would start with no arguments at all
            raise FirmwareError(f"{board}: the image's command line is {len(' '.join(args))} characters, semihosting "
                                f"passes at most {MAX_COMMAND_LINE}: shorten the prompt")
        config = "enable=on,target=native,chardev=out," + ",".join("arg=" + a.replace(",", ",,") for a in args)
        command = [*_board(board).qemu, *qemu_options, "-semihosting-config", config, "-kernel", str(image)]
        try:
            r = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            printed = (e.stdout or b"").decode(errors="replace")[-4000:]
            raise FirmwareError(f"{board}: the image did not finish within {timeout} s (a hang or a fault loop); "
                                f"QEMU printed:\n{printed}") from None
        values = {}
        if report.exists():
            for line in report.read_text().splitlines():
                key, _, value = line.partition(": ")
                values[key] = value if key == "kernels" else int(value)
        return Run(r.returncode, r.stdout + r.stderr, values)


def arguments(prompt, max_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0, ignore_eos=False, logits=None,
              experts=None, kernels=None):
    """The firmware's argument list for one generation.  `prompt`: text, which the image encodes
    with the model's encoder (its UTF-8 bytes go as text=, every byte but letters, digits and
    "-._~" as %XX, so spaces, commas and newlines survive QEMU's command line), or a list of ids
    (ids=, for a model that carries no encoder).  `experts`: the weights.bin a streaming image
    reads its experts from.  `kernels`: a kernel variant by name ("reference": the strict mode, the
    host's --reference bit for bit; "mve" on mps3-an547); None: the best the image has."""
    if isinstance(prompt, str):
        args = ["text=" + urllib.parse.quote(prompt.encode("utf-8"), safe="")]
    else:
        args = ["ids=" + ":".join(map(str, prompt))]
    args += [f"max_tokens={max_tokens}", f"temperature={temperature!r}", f"top_k={top_k}", f"top_p={top_p!r}",
             f"seed={seed}"]
    if ignore_eos:
        args.append("ignore_eos")
    if logits:
        args.append(f"logits={logits}")
    if experts:
        args.append(f"experts={Path(experts).resolve()}")
    if kernels:
        args.append(f"kernels={kernels}")
    return args

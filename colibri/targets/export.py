"""A self-contained folder for a firmware project of one's own: the core's sources for bare metal,
the model as data for the firmware's linker, and the plan's sizes, with a CMake library target
(colibri::colibri), a Meson subproject, and an example firmware for the board.

    colibri firmware export --board mps2-an386 --ctx 256 --out fw
    colibri firmware export --cpu cortex-m7 --model out/model --ctx 512 --out fw

The folder (firmware/export/ holds the parts that do not change with the model or the target):
  core/              the core's sources and headers, the bare-metal platform (colibri.c_sources)
  model/             weights.bin and colibri_model.json, colibri_model.S (.incbin, section
                     `colibri_model`, 64-byte aligned) and colibri_model.c (the same as a C array)
  colibri_plan.h     n_ctx, n_batch, metadata, arena and stack bytes, the model's size and identity
  port/              colibri_port.h (a clock and text out), port_template.c to fill in, and with
                     --board port_board.c: the board's clock (firmware/boards/) and semihosted output
  example/main.c     load, session, tokenize, forward, sample: what `colibri generate` prints
  CMakeLists.txt, meson.build, meson.options, README.md; with --board cmake/toolchain.cmake

The sizes are the core's own plan (colibri_model_meta_bytes, colibri_session_plan), the same on
every target and what `colibri firmware plan` reports; the code's own size depends on the
firmware's toolchain, which links it."""
import hashlib
import os
import secrets
import shutil
import zlib
from pathlib import Path

import colibri
from colibri.targets import TargetError, cross_files
from colibri.targets import firmware
from colibri.targets.firmware import DEFAULT_BATCH, DEFAULT_CTX, DEFAULT_STACK

# The CPUs an export targets without a board: the flags the core and the firmware share (the
# boards' cross files in toolchains/ carry the same ones).
CPUS = {
    "cortex-m4f": ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"],
    "cortex-m7": ["-mcpu=cortex-m7", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv5-d16"],
    "cortex-m55": ["-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard"],
    "rv32imac": ["-march=rv32imac", "-misa-spec=2.2", "-mabi=ilp32", "-mcmodel=medany"],
}


# The vector kernels a CPU's flags enable, as c_core/meson.build's kernel_variants builds them:
# (source under c_core/, its define).
VECTOR_KERNELS = {"-mcpu=cortex-m55": ("arch/arm/matmul_mve.c", "COLIBRI_HAVE_MVE")}


class ExportError(TargetError):
    """A target that is not known, a model that cannot be planned, a folder that is in the way."""


def _align64(n):
    return (n + 63) // 64 * 64


def _target(board, cpu):
    """(name, CPU flags, the board's cross file or None)."""
    if (board is None) == (cpu is None):
        raise ExportError("give one of --board or --cpu")
    if cpu is not None:
        if cpu not in CPUS:
            raise ExportError(f"unknown CPU {cpu!r}: one of {', '.join(CPUS)}")
        return cpu, CPUS[cpu], None
    boards = cross_files("colibri_board")
    if board not in boards:
        raise ExportError(f"unknown board {board!r}: one of {', '.join(boards)}")
    f = boards[board]
    flags = [a for a in f["built-in options"]["c_args"] if not a.startswith("--specs")]
    return board, flags, f


def plan_sizes(model_dir, ctx, batch, kv_type="f32"):
    """{meta, arena}: the bytes the core plans for the model's tables and the session, 64-byte
    aligned (as firmware/plan/model_image.c rounds them)."""
    try:
        model = colibri.Model(model_dir, repack=False)   # as the image runs it: its bytes as stored
        return {"meta": _align64(model.metadata_bytes), "arena": _align64(model.memory_plan(ctx, min(batch, ctx), kv_type=kv_type))}
    except colibri.Error as e:
        raise ExportError(f"{model_dir}: {e}") from None


def _plan_header(name, target, ctx, batch, stack, sizes, json_bytes, weights_bytes, kv_type):
    sha = hashlib.sha256(json_bytes + weights_bytes).hexdigest()
    crc = zlib.crc32(json_bytes)
    return f"""/* The plan `colibri firmware export` made for model {name} on {target} (colibri {colibri.__version__}).
 * The RAM a firmware gives the core: COLIBRI_PLAN_RAM_BYTES in one static block, 64-byte aligned,
 * the model's tables first (colibri_model_load's meta), then the session arena
 * (colibri_session_options.arena); and a stack of COLIBRI_PLAN_STACK_BYTES. */
#ifndef COLIBRI_PLAN_H
#define COLIBRI_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define COLIBRI_PLAN_MODEL "{name}"
/* the model's identity: SHA-256 of colibri_model.json then weights.bin; on the device,
 * colibri_plan_matches checks the JSON (whose per-tensor CRC-32s cover the weights) */
#define COLIBRI_PLAN_MODEL_SHA256 "{sha}"
#define COLIBRI_PLAN_JSON_CRC32 0x{crc:08x}u
#define COLIBRI_PLAN_JSON_BYTES {len(json_bytes)}u
#define COLIBRI_PLAN_WEIGHTS_BYTES {len(weights_bytes)}u
#define COLIBRI_PLAN_N_CTX {ctx}
#define COLIBRI_PLAN_N_BATCH {min(batch, ctx)}
#define COLIBRI_PLAN_KV_TYPE COLIBRI_DTYPE_{kv_type.upper()}   /* what the KV cache stores (colibri_session_options.kv_type) */
#define COLIBRI_PLAN_META_BYTES {sizes["meta"]}u     /* colibri_model_meta_bytes, rounded up to 64 */
#define COLIBRI_PLAN_ARENA_BYTES {sizes["arena"]}u   /* colibri_session_plan, rounded up to 64 */
#define COLIBRI_PLAN_RAM_BYTES (COLIBRI_PLAN_META_BYTES + COLIBRI_PLAN_ARENA_BYTES)
#define COLIBRI_PLAN_STACK_BYTES {stack}u   /* the stack budget (--stack); encoding a prompt takes about 5.6 KiB */

#ifndef COLIBRI_ALIGN64   /* another compiler: define it to its 64-byte alignment */
#if defined(__GNUC__)
#define COLIBRI_ALIGN64 __attribute__((aligned(64)))
#else
#define COLIBRI_ALIGN64
#endif
#endif

/* model/colibri_model.S or model/colibri_model.c */
extern const unsigned char colibri_model_weights[];   /* (COLIBRI_PLAN_WEIGHTS_BYTES) 64-byte aligned */
extern const char colibri_model_json[];               /* (COLIBRI_PLAN_JSON_BYTES) */

/* Whether `json` is the model this plan was made for (its CRC-32, as zlib.crc32). */
static inline int colibri_plan_matches(const char *json, size_t len)
{{
    uint32_t crc = 0xFFFFFFFFu;
    size_t i;
    int bit;
    if (len != COLIBRI_PLAN_JSON_BYTES) return 0;
    for (i = 0; i < len; i++) {{
        crc ^= (uint8_t)json[i];
        for (bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }}
    return ~crc == COLIBRI_PLAN_JSON_CRC32;
}}

#endif
"""


def _c_chars(data):
    """`data` as C character constants, 24 a line: printable ASCII as itself, every other byte
    octal (a string literal of the JSON could outgrow the 4095 bytes C99 compilers must take)."""
    def char(b):
        return f"'{chr(b)}'" if 32 <= b < 127 and b not in b"'\\" else f"'\\{b:03o}'"
    return ",\n".join(",".join(map(char, data[i:i + 24])) for i in range(0, len(data), 24))


def _c_array(json_bytes, weights_bytes):
    def rows(data):
        return ",\n".join(",".join(map(str, data[i:i + 40])) for i in range(0, len(data), 40))
    return f"""/* The model as C arrays, for a toolchain without .incbin (model/colibri_model.S is the same).
 * COLIBRI_MODEL_ATTRIBUTES places and aligns the weights: 64-byte aligned, as colibri_model_load
 * requires; define it for another compiler. */
#include "../colibri_plan.h"

#ifndef COLIBRI_MODEL_ATTRIBUTES
#if defined(__GNUC__)
#define COLIBRI_MODEL_ATTRIBUTES __attribute__((section("colibri_model"), aligned(64)))
#else
#define COLIBRI_MODEL_ATTRIBUTES
#endif
#endif

COLIBRI_MODEL_ATTRIBUTES const unsigned char colibri_model_weights[{len(weights_bytes)}] = {{
{rows(weights_bytes)}
}};

const char colibri_model_json[{len(json_bytes)}] = {{
{_c_chars(json_bytes)}
}};
"""


def _board_port(root, board_file, stack):
    """The board's clock from firmware/boards/ under the port's names, text out through the C
    library's stdout (semihosting, as colibri's own images print), and the plan's stack for
    picolibc's linker script (which sees a symbol an object defines, not a --defsym)."""
    clock = (root / "firmware" / "boards" / board_file["properties"]["colibri_clock"]).read_text()
    clock = clock.replace('#include "../app/firmware.h"', '#include <stdio.h>\n\n#include "colibri_port.h"')
    clock = clock.replace("fw_ticks_per_second", "colibri_port_ticks_per_second").replace("fw_ticks",
                                                                                         "colibri_port_ticks")
    return (f"/* The port for {board_file['properties']['colibri_board']}: its clock (colibri's firmware/boards/) "
            f"and text out through stdout,\n * which picolibc's semihosting start-up (cmake/toolchain.cmake) "
            f"sends to the host. */\n" + clock.split("*/", 1)[1].lstrip("\n") +
            "\nvoid colibri_port_write(const char *bytes, size_t len)\n{\n    fwrite(bytes, 1, len, stdout);\n"
            "    fflush(stdout);\n}\n\n/* the stack picolibc's linker script reserves: colibri_plan.h's */\n"
            f'__asm__(".global __stack_size\\n.set __stack_size, {stack}");\n')


def _toolchain(board_file):
    """A CMake toolchain file from the board's cross file: its compiler, flags and memory map."""
    b, o = board_file["binaries"], board_file["built-in options"]
    c_args = o["c_args"]
    # a board's model flash takes colibri's section .colibri_model; the export's is colibri_model
    link = [a.replace("--section-start=.colibri_model=", "--section-start=colibri_model=")
            for a in o["c_link_args"] if a not in c_args]
    processor = board_file["host_machine"]["cpu_family"]
    qemu = _qemu(board_file)
    return f"""# {board_file['properties']['colibri_board']}: the compiler, flags and memory map of colibri's cross file
# (toolchains/{board_file['path'].name}); picolibc's start-up and linker script, output through semihosting.
#   cmake -S . -B build --toolchain cmake/toolchain.cmake && cmake --build build
#   {qemu}
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR {processor})
set(CMAKE_C_COMPILER {b['c']})
set(CMAKE_ASM_COMPILER {b['c']})
set(CMAKE_AR {b['ar']})
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
set(CMAKE_C_FLAGS_INIT "{' '.join(c_args)}")
set(CMAKE_ASM_FLAGS_INIT "{' '.join(c_args)}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "{' '.join(link)}")
"""


def _qemu(board_file):
    """The command that runs the example image, its text on stdout (as colibri.targets.firmware.run)."""
    board = firmware.BOARDS[board_file["properties"]["colibri_board"]]
    return " ".join([*board.qemu, "-semihosting-config", "enable=on,target=native,chardev=out", "-kernel",
                     "build/colibri-example.elf"])


def _fill(text, **values):
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def export(out, model_dir, ctx=DEFAULT_CTX, batch=DEFAULT_BATCH, stack=DEFAULT_STACK, board=None, cpu=None,
           kv_type="f32"):
    """Writes the folder `out` (new, or empty) for the board or CPU; returns the plan's sizes."""
    target, flags, board_file = _target(board, cpu)
    # the sources colibri.c_sources lists: this package's own (the checkout it runs from, or the wheel's copy)
    out, model_dir, root = Path(out).resolve(), Path(model_dir).resolve(), colibri.source_root()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: exists and is not an empty folder")
    if stack < 1024 or stack % 8:
        raise ExportError(f"a stack of {stack} bytes: at least 1024, a multiple of 8")
    sizes = plan_sizes(model_dir, ctx, batch, kv_type)
    json_bytes = (model_dir / "colibri_model.json").read_bytes()
    weights_bytes = (model_dir / "weights.bin").read_bytes()
    if board_file is not None:   # the board's own code comes on top: `colibri firmware plan` measures it
        mm, ram = firmware.memory_map(board), sizes["meta"] + sizes["arena"] + stack
        flash = mm["model_flash_size"] or mm["flash_size"]   # the model's own flash, where the board has one
        if len(weights_bytes) + len(json_bytes) > flash or ram > mm["ram_size"]:
            raise ExportError(f"{model_dir.name} does not fit {board}: {len(weights_bytes) + len(json_bytes):,} B of "
                              f"model for {flash:,} B of flash, {ram:,} B of RAM for {mm['ram_size']:,} B "
                              f"(colibri firmware plan --board {board} --ctx {ctx} says more)")
    # Written beside `out` and renamed into place: a failure (a full disk) leaves no half folder,
    # and `out` is there whole or not at all.
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.partial"
    try:
        partial.mkdir()
        _write(partial, root, model_dir, target, flags, board_file, ctx, batch, stack, sizes, json_bytes,
               weights_bytes, kv_type)
        os.rename(partial, out)            # replaces an empty folder, fails on one filled meanwhile
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise ExportError(f"{out}: {e.strerror or e} (nothing written)") from e
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return sizes


def _write(out, root, model_dir, target, flags, board_file, ctx, batch, stack, sizes, json_bytes, weights_bytes,
           kv_type):
    """The folder's files, into `out` (an empty folder)."""
    template = root / "firmware" / "export"
    core = root / "c_core"
    sources = [Path(s).relative_to(core) for s in colibri.c_sources("baremetal")]
    vectors = [VECTOR_KERNELS[f] for f in flags if f in VECTOR_KERNELS]   # Helium on a Cortex-M55
    sources += [Path(source) for source, _ in vectors]
    defines = ["COLIBRI_ONE_THREAD"] + [define for _, define in vectors]   # baremetal.c makes no pool
    headers = [p.relative_to(core) for p in [*core.glob("include/colibri/*.h"), *core.glob("src/**/*.h"),
                                              *core.glob("arch/*.h")]]
    for rel in [*sources, *headers]:   # core/, not c_core/: the folder is no checkout of colibri's
        (out / "core" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(core / rel, out / "core" / rel)
    shutil.copyfile(root / "LICENSE", out / "core" / "LICENSE")   # the terms the sources' SPDX lines name
    for rel in ("example/main.c", "port/colibri_port.h", "port/port_template.c", "model/colibri_model.S",
                "meson.options"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template / rel, out / rel)
    shutil.copyfile(model_dir / "colibri_model.json", out / "model" / "colibri_model.json")
    shutil.copyfile(model_dir / "weights.bin", out / "model" / "weights.bin")
    (out / "model" / "colibri_model.c").write_text(_c_array(json_bytes, weights_bytes))
    (out / "colibri_plan.h").write_text(_plan_header(model_dir.name, target, ctx, batch, stack, sizes,
                                                     json_bytes, weights_bytes, kv_type))
    names = [f"core/{s.as_posix()}" for s in sources]
    values = dict(VERSION=colibri.__version__, TARGET=target)
    (out / "CMakeLists.txt").write_text(_fill((template / "CMakeLists.txt").read_text(), CPU_FLAGS=";".join(flags),
                                              SOURCES="\n".join(f"  {n}" for n in names),
                                              DEFINES=" ".join(defines), **values))
    (out / "meson.build").write_text(_fill((template / "meson.build").read_text(),
                                           CPU_ARGS=", ".join(f"'{a}'" for a in flags),
                                           DEFINE_ARGS=", ".join(f"'-D{d}'" for d in defines),
                                           SOURCES=",\n".join(f"  '{n}'" for n in names), **values))
    readme = _fill((template / "README.md").read_text(), MODEL=model_dir.name, CTX=str(ctx), **values,
                   RAM=f"{sizes['meta'] + sizes['arena']:,}", STACK=f"{stack:,}",
                   FLASH=f"{len(weights_bytes) + len(json_bytes):,}")
    if board_file is not None:
        (out / "port" / "port_board.c").write_text(_board_port(root, board_file, stack))
        (out / "cmake").mkdir()
        (out / "cmake" / "toolchain.cmake").write_text(_toolchain(board_file))
        readme = _fill(readme, QEMU=_qemu(board_file))
    else:   # no board: no example image of its own
        readme = readme.split("\n## The board's example")[0]
    (out / "README.md").write_text(readme)

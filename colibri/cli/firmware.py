"""colibri firmware plan, build, run and export: bare-metal images of a model for a board."""
import sys
from pathlib import Path

from colibri import experts
from colibri.cli.options import (INT32_MAX, build_dir_argument, checkout_names, count_in, generation_arguments,
                                 kv_type_argument, open_model, parse_size, prompt_ids, resolve_seed)


def _firmware_session(args):
    """(board, model directory, ctx, batch, stack, expert budget) of a firmware command."""
    model = open_model(args.model, repack=False)   # as an image runs it: its bytes as stored
    budget = 0
    if args.expert_budget is not None:
        try:   # a percentage is of what slots for every routed expert take
            budget = parse_size(args.expert_budget, lambda: experts.routed_bytes(model))
        except ValueError as e:
            raise SystemExit(f"colibri firmware: {e}")
    return args.board, model.path, args.ctx, args.batch, args.stack, budget


def cmd_firmware_plan(args):
    """Flash and RAM an image of this model and session needs on the board, before building."""
    from colibri.targets import firmware

    session = _firmware_session(args)
    p = firmware.plan(*session, kv_type=args.kv_type)
    if args.flash or args.ram:   # a chip of one's own: the board's code, this memory
        try:
            flash, ram = (parse_size(v) if v else d for v, d in ((args.flash, p.flash_size + p.model_flash_size),
                                                                 (args.ram, p.ram_size)))
        except ValueError as e:
            raise SystemExit(f"colibri firmware plan: {e}")
        p = firmware.for_memory(p, flash, ram)
        print(p.table())
        largest = firmware.largest_ctx(session[0], session[1], flash, ram, *session[3:5], kv_type=args.kv_type)
        print(f"largest n_ctx that fits: {largest}" if largest else "no n_ctx fits")
    else:
        print(p.table())
    return 1 if p.problems() else 0


def cmd_firmware_build(args):
    from colibri.targets import firmware

    board = args.board
    image = firmware.build_image(*_firmware_session(args), kv_type=args.kv_type)
    flash, ram = firmware.image_usage(board, image)
    mm = firmware.memory_map(board)
    print(image)
    print(firmware._run_tool(board, "size", "-A", "-d", image).split("\n.comment")[0].rstrip())
    print(f"flash used {flash:,} of {mm['flash_size'] + mm['model_flash_size']:,} B; RAM used {ram:,} of {mm['ram_size']:,} B "
          f"(stack reserved {firmware.stack_reserved(board, image):,} B)")
    return 0


def cmd_firmware_run(args):
    """The board's image under QEMU: the prompt text encoded on the board, then the text as
    `colibri generate` prints it (with the model's own byte table), then with --verbose the image's timing and memory on stderr."""
    from colibri.targets import firmware

    model = _model_directory(args)
    resolve_seed(args)
    prompt = args.prompt if args.tokens is None else prompt_ids(model, args)   # text: encoded on the board
    session = _firmware_session(args)
    image = firmware.build_image(*session, kv_type=args.kv_type)
    experts = Path(model.path) / "weights.bin" if session[-1] else None
    result = firmware.run(args.board, image, firmware.arguments(
        prompt, args.max_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.ignore_eos,
        experts=experts, kernels=args.kernels), timeout=args.timeout)
    sys.stdout.buffer.write(result.output)
    if args.verbose and result.report:
        r = result.report
        print(f"[{args.board}, emulated by QEMU: {r['prompt_tokens']} prompt tokens in "
              f"{r['prefill_ticks'] / r['ticks_per_second'] * 1e3:.0f} ms, {r['generated_tokens']} generated at "
              f"{result.tokens_per_second():.2f} tok/s; arena {r['arena_needed']:,} B, "
              f"stack {r['stack_used']:,} of {r['stack_reserved']:,} B]", file=sys.stderr)
        if "expert_slots" in r:
            print(f"[experts streamed: {r['expert_slots']} slots of {r['expert_slot_bytes']:,} B, "
                  f"{r['expert_hits']} hits, {r['expert_misses']} misses, {r['expert_bytes_read']:,} B read in "
                  f"{r['expert_reads']} reads]", file=sys.stderr)
    return result.status


def _model_directory(args):
    """The model to build into an image: a directory (a firmware links its weights.bin)."""
    model = open_model(args.model, repack=False)   # as an image runs it: its bytes as stored
    if model.directory != model.path:
        raise SystemExit(f"colibri firmware: an image holds a model directory's weights.bin: convert the GGUF "
                         f"first (colibri convert {model.path} DIR)")
    return model


def cmd_firmware_export(args):
    """A folder for a firmware project of one's own: sources, model data, plan, CMake and Meson."""
    from colibri.targets import export

    model = _model_directory(args)
    try:
        sizes = export.export(args.out, model.path, args.ctx, args.batch, args.stack, board=args.board, cpu=args.cpu,
                              kv_type=args.kv_type)
    except export.ExportError as e:
        raise SystemExit(f"colibri firmware export: {e}")
    print(f"{args.out}: {Path(model.path).name} for {args.board or args.cpu}, n_ctx {args.ctx}: RAM block "
          f"{sizes['meta'] + sizes['arena']:,} B (metadata {sizes['meta']:,}, arena {sizes['arena']:,}), stack "
          f"{args.stack:,} B; see {Path(args.out) / 'README.md'}")
    return 0


def add_firmware(sub):
    fw = sub.add_parser("firmware", help="bare-metal images: plan, build, run under QEMU (needs meson, ninja, the "
                        "board's toolchain and QEMU)")
    fw_sub = fw.add_subparsers(dest="firmware_command", required=True)

    def firmware_parser(name, help):
        from colibri.targets import firmware
        from colibri.targets.firmware import DEFAULT_BATCH, DEFAULT_CTX, DEFAULT_STACK

        f = fw_sub.add_parser(name, help=help)
        f.add_argument("--board", required=True, choices=checkout_names(firmware, "BOARDS"))
        f.add_argument("--model", help="colibri model directory (default: the bundled model)")
        f.add_argument("--ctx", type=count_in(1, INT32_MAX), default=DEFAULT_CTX, help=f"context the image reserves (default {DEFAULT_CTX})")
        f.add_argument("--batch", type=count_in(1, 4096), default=DEFAULT_BATCH, help=f"prefill chunk (default {DEFAULT_BATCH})")
        f.add_argument("--stack", type=count_in(1, INT32_MAX), default=DEFAULT_STACK, help=f"stack bytes (default {DEFAULT_STACK})")
        f.add_argument("--expert-budget", metavar="SIZE",
                       help="stream the routed experts of an interleaved model into SIZE bytes of cache slots (bytes, "
                            "512K, 2M, or a percentage of what every routed expert takes): flash holds the rest of "
                            "the model, the image reads the experts from the host's weights.bin (default: the whole "
                            "model in flash)")
        kv_type_argument(f)
        build_dir_argument(f)
        return f

    fp = firmware_parser("plan", "flash and RAM the image needs on the board, and whether it fits")
    fp.add_argument("--flash", metavar="SIZE", help="plan for a chip of this much flash (1M, 512K): the code as "
                    "on the board's CPU, the model beside it; also prints the largest n_ctx that fits")
    fp.add_argument("--ram", metavar="SIZE", help="plan for a chip of this much RAM (256K)")
    fp.set_defaults(func=cmd_firmware_plan)
    firmware_parser("build", "build the board's image of a model; print its size").set_defaults(
        func=cmd_firmware_build)
    fr = firmware_parser("run", "build the board's image and generate with it under QEMU")
    generation_arguments(fr, "prompt as comma-separated token ids (for a model without an encoder; --prompt "
                             "text is encoded on the board)")
    fr.add_argument("--kernels", metavar="NAME", help="a kernel variant of the image by name: reference (the strict "
                    "mode: the host's --reference bit for bit), mve on mps3-an547 (default: the best it has)")
    fr.add_argument("--timeout", type=float, default=600, help="seconds before a hung image is stopped (default 600)")
    fr.add_argument("--verbose", action="store_true", help="the image's timing and memory on stderr")
    fr.set_defaults(func=cmd_firmware_run)

    from colibri.targets import firmware as boards
    from colibri.targets.export import CPUS
    from colibri.targets.firmware import DEFAULT_BATCH, DEFAULT_CTX, DEFAULT_STACK

    fe = fw_sub.add_parser("export", help="a folder for a firmware of one's own: the core's sources, the model as "
                           "linker data, colibri_plan.h, CMakeLists.txt (colibri::colibri) and meson.build")
    where = fe.add_mutually_exclusive_group(required=True)
    where.add_argument("--board", choices=checkout_names(boards, "BOARDS"),
                       help="a board colibri knows: its CPU, and an example image with its clock and toolchain file")
    where.add_argument("--cpu", choices=list(CPUS), help="a CPU alone: the library and the example, no board port")
    fe.add_argument("--model", help="colibri model directory (default: the bundled model)")
    fe.add_argument("--ctx", type=count_in(1, INT32_MAX), default=DEFAULT_CTX,
                    help=f"context the plan reserves (default {DEFAULT_CTX})")
    fe.add_argument("--batch", type=count_in(1, 4096), default=DEFAULT_BATCH, help=f"prefill chunk (default {DEFAULT_BATCH})")
    fe.add_argument("--stack", type=count_in(1, INT32_MAX), default=DEFAULT_STACK,
                    help=f"stack bytes (default {DEFAULT_STACK})")
    kv_type_argument(fe)
    fe.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new, or empty)")
    fe.set_defaults(func=cmd_firmware_export)

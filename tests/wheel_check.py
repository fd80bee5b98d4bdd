"""The checks a built wheel passes, shared by tests/test_wheel_cross.py and the wheel builds in CI
(pyproject.toml's [tool.cibuildwheel] test-command, .github/workflows/wheels.yml).

    python wheel_check.py contents WHEEL... [--source CHECKOUT]
        on the build machine: no symbolic link in the wheel and no file outside the package (colibri/,
        its .dist-info, the colibri-infer program); every file of colibri/_source/ a file of the checkout
    python wheel_check.py run [--kernels NAME,...] [--out FILE]
        with the Python the wheel is installed in, from anywhere but a checkout: the installed
        `colibri generate --prompt "ROMEO:" --max-tokens 20 --temperature 0` prints the text of the
        bundled model's greedy tokens with colibri's own choice of kernels, the same tokens as the
        reference kernels'; the chosen kernels are one of NAME; FILE gets the text, for a comparison
        with another machine's

Exit status 0 when every check holds; otherwise the first failure on stderr and status 1.  Only the
standard library here: it runs in a bare target's Python."""
import argparse
import os
import stat
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

PROMPT, TOKENS = "ROMEO:", 20
GENERATE = ["generate", "--prompt", PROMPT, "--max-tokens", str(TOKENS), "--temperature", "0"]


class CheckFailed(Exception):
    pass


def wheel_problems(wheel, source=None):
    """What is wrong with the files of `wheel` (a list of strings, empty when nothing is): symbolic
    links, paths outside the package, and, given the checkout `source` it was built from, files of
    colibri/_source/ that are not regular files of that checkout."""
    dist = "-".join(Path(wheel).name.split("-")[:2])   # colibri_moe-0.1.0
    roots = ("colibri/", f"{dist}.dist-info/", f"{dist}.data/scripts/colibri-infer")
    problems = []
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if stat.S_ISLNK(info.external_attr >> 16):
                problems.append(f"{name}: a symbolic link")
            inside = name.startswith(roots) or info.is_dir() and any(r.startswith(name) for r in roots)
            if name.startswith("/") or ".." in name.split("/") or not inside:
                problems.append(f"{name}: outside the package ({', '.join(roots)})")
            copy = name.removeprefix("colibri/_source/")
            if source is not None and copy != name and not info.is_dir():
                path = Path(source, copy)
                if not path.is_file() or any(p.is_symlink() for p in (path, *path.parents)):
                    problems.append(f"{name}: not a regular file of the checkout {source}")
    return problems


def run(kernels=None, out=None):
    """The installed package's checks (see the module's docstring); returns the chosen kernels."""
    os.environ.pop("COLIBRI_KERNELS", None)   # colibri's own choice, not a forced one
    import colibri
    from colibri.demo import MODEL_DIR

    paths = sysconfig.get_paths()
    where = Path(colibri.__file__).resolve().parent
    if where.parent not in (Path(paths["platlib"]).resolve(), Path(paths["purelib"]).resolve()):
        raise CheckFailed(f"colibri is imported from {where}, not from this Python's site-packages {paths['platlib']}")
    model = colibri.Model(MODEL_DIR)
    chosen = model.session().kernels
    variants = colibri.kernel_variants()
    print(f"colibri {colibri.__version__} from {where}: {chosen} kernels (this build has "
          f"{', '.join(n + ('' if runs else ' (not on this CPU)') for n, runs in variants.items())})")
    if kernels and chosen not in kernels:
        raise CheckFailed(f"colibri chose the {chosen} kernels here, not one of {', '.join(kernels)}")

    # greedy: the chosen kernels' tokens are the reference kernels', and the command prints them
    ids = model.tokenize(PROMPT)
    tokens, reference = (list(model.session(kernels=k).stream(ids, max_tokens=TOKENS, temperature=0))
                         for k in ("auto", "reference"))
    if tokens != reference:
        raise CheckFailed(f"the {chosen} kernels generate {tokens}, the reference kernels {reference}")
    r = subprocess.run([str(Path(paths["scripts"], "colibri")), *GENERATE], capture_output=True, timeout=1800)
    if r.returncode != 0:
        raise CheckFailed(f"colibri {' '.join(GENERATE)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    if r.stdout != (PROMPT + model.detokenize(tokens) + "\n").encode():
        raise CheckFailed(f"colibri {' '.join(GENERATE)} printed {r.stdout!r}, not the text of {tokens}")
    if out:
        Path(out).write_bytes(r.stdout)
    print(f"colibri {' '.join(GENERATE)}: the text of the {chosen} kernels' {TOKENS} tokens, the reference kernels' too")
    return chosen


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("contents", help="the files of built wheels")
    c.add_argument("wheels", nargs="+")
    c.add_argument("--source", default=Path(__file__).resolve().parents[1],
                   help="the checkout the wheels were built from (default: this file's)")
    r = sub.add_parser("run", help="the installed package")
    r.add_argument("--kernels", type=lambda s: s.split(","), help="the kernel variants colibri may choose here")
    r.add_argument("--out", help="a file for the generated text")
    args = p.parse_args(argv)
    try:
        if args.command == "contents":
            for wheel in args.wheels:
                problems = wheel_problems(wheel, args.source)
                if problems:
                    raise CheckFailed(f"{wheel}:\n  " + "\n  ".join(problems))
                print(f"{wheel}: no symbolic link, no file outside the package")
        else:
            run(args.kernels, args.out)
    except CheckFailed as e:
        print(f"wheel_check: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

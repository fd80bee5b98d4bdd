"""The output directory of a conversion, replaced whole or not at all.

A conversion writes into a fresh directory beside its target and renames it into place once every
file is written and the core has loaded it: a failed or interrupted conversion leaves the previous
model as it was (or nothing), never a mix of the two. On Linux the swap is one renameat2 exchange;
elsewhere the old directory is renamed aside first, so a kill between the two renames leaves it
under its aside name (the next conversion into the same place removes it). A conversion killed
with SIGKILL leaves its hidden work directory, which the next conversion there removes too.

Files a user keeps in a model directory (a training log, a profile) are carried into the new one;
the converter's own files (OWN, and the chat templates) never are: a source without a tokenizer
gives a model without one, a source without a chat template a model without one.
"""

import ctypes
import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from colibri.chat import is_own_file

from .errors import ConvertError

OWN = ("colibri_model.json", "weights.bin", "weights.bin.partial", "tokenizer.json")
WORK, ASIDE = "converting", "replaced"   # the hidden siblings' kinds: .NAME.KIND-PID-XXXXXXXX


@contextmanager
def staged(out_dir, src=None):
    """Yield an empty directory to write a model into; when the block ends without an exception,
    it becomes out_dir. out_dir must be absent, empty, or a colibri model directory."""
    out_dir = Path(out_dir).resolve()   # a link to a model directory: the directory it names is replaced
    _check_target(out_dir, src)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out_dir)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=_prefix(out_dir, WORK)))
    try:
        yield work
        if out_dir.exists():
            _carry_user_files(out_dir, work)
        work = _install(work, out_dir)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)   # the unfinished model, or the one it replaced


def _check_target(out_dir, src):
    if src is not None and Path(src).resolve().is_relative_to(out_dir):
        raise ConvertError(f"{out_dir}: the output directory holds the source {src}: give another")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConvertError(f"{out_dir}: exists and is not a directory: give a directory to write the model into")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "colibri_model.json").is_file():
        raise ConvertError(f"{out_dir}: not empty and not a colibri model (no colibri_model.json): "
                           f"refusing to replace it; give an empty or new directory")


def _prefix(out_dir, kind):
    return f".{out_dir.name}.{kind}-{os.getpid()}-"


def _remove_stale(out_dir):
    """Remove the work and aside directories conversions that are no longer running left here."""
    for sibling in out_dir.parent.iterdir():
        if not sibling.name.startswith(f".{out_dir.name}."):
            continue
        kind, _, rest = sibling.name[len(out_dir.name) + 2:].partition("-")
        pid = rest.partition("-")[0]
        if kind in (WORK, ASIDE) and pid.isdigit() and sibling.is_dir() and not _running(int(pid)):
            shutil.rmtree(sibling, ignore_errors=True)


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's live process
        return True
    return True


def _carry_user_files(old, new):
    """Link (or copy) into `new` what `old` holds besides the converter's own files."""
    for entry in old.iterdir():
        if entry.name in OWN or is_own_file(entry.name) or (new / entry.name).exists():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, new / entry.name)


def _link_or_copy(src, dst):
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _install(work, out_dir):
    """Put `work` at out_dir. Returns where the previous directory now is (to remove), or None."""
    if not out_dir.exists():
        os.rename(work, out_dir)
        return None
    if _exchange(work, out_dir):
        return work
    aside = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=_prefix(out_dir, ASIDE)))
    os.rename(out_dir, aside / "model")
    os.rename(work, out_dir)
    return aside


def _exchange(a, b):
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system has none."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):   # the kernel or file system lacks it
        return False
    raise OSError(err, f"cannot swap {a} into place: {os.strerror(err)}", str(b))

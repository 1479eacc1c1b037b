"""Subcommands (``subd run``, ``stream``, ``transcribe``, ``train-punct``): each module defines
register(subparsers).

May import: any folder except ``subd.bench`` and ``subd.testing``, and the top-level modules;
only ``subd.cli`` imports them. Heavy imports (torch) stay inside the command that needs them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from subd.errors import UserError


def check_writable_folder(folder: Path, what: str) -> None:
    """One line and exit 2 before the work where files cannot be written into ``folder`` (it
    cannot be made, or is not writable): not an internal error after it. ``what`` names the
    output in the message (the file, or the option)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".subd-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except FileExistsError:  # mkdir: the folder's name is a file's
        raise UserError(f"{what}: cannot write ({folder} is not a folder)") from None
    except OSError as exc:
        raise cannot_write(what, exc) from None


def cannot_write(what: str, exc: OSError) -> UserError:
    """The one-line error for an output ``what`` that ``exc`` kept from being written."""
    return UserError(f"{what}: cannot write ({exc.strerror or type(exc).__name__})")

"""Key files: where a relay's agent signing keys live on disk.

Key files hold one key per line (base64url of 32 random bytes); ``#`` comments and blank lines are
ignored. The first key signs, every key verifies. To rotate: put a new key on the first line, keep
the old one until the tokens it signed have expired, then delete it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Final

from broker.front.tokens import KEY_BYTES, KeyRing, b64url_decode, b64url_encode, key_id

MAX_KEY_FILE_BYTES: Final = 64 * 1024

_KEY_LINE = re.compile(r"[A-Za-z0-9_-]{43}")
_KEY_FILE_HEADER = (
    "# relay agent MCP signing keys: one per line; the first signs, every one verifies.\n"
    "# To rotate, put a new key (`relay keygen`) on the first line and delete the old one\n"
    "# once the tokens it signed have expired. Keep this file mode 0600.\n"
)


class KeyFileError(ValueError):
    """A key file that cannot be used; the one-line message says what is wrong and what to do."""


def load_key_file(path: str | os.PathLike[str]) -> KeyRing:
    """Read a key file, refusing anything unsafe or malformed with a ``KeyFileError``."""
    where = Path(path)
    keygen = f"create one with `relay keygen {where}`"
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise KeyFileError(f"key file {where} does not exist; {keygen}") from None
    except PermissionError:
        raise KeyFileError(f"key file {where} cannot be read (permission denied); check its owner") from None
    except OSError as exc:
        raise KeyFileError(f"key file {where} cannot be opened ({exc.strerror}); {keygen}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"key file {where} is not a regular file; {keygen}")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"key file {where} is readable or writable by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {where}`"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"key file {where} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {where} is larger than {MAX_KEY_FILE_BYTES} bytes; is it a key file?")
    if not data.strip():
        raise KeyFileError(f"key file {where} is empty; {keygen} --force")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise KeyFileError(f"key file {where} is not ASCII text; {keygen} --force") from None
    keys: list[bytes] = []
    seen: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        key = b64url_decode(entry) if _KEY_LINE.fullmatch(entry) else None
        if key is None or len(key) != KEY_BYTES:
            raise KeyFileError(
                f"key file {where}, line {number}: not a key (expected 43 base64url characters of 32 bytes); "
                "fix or delete the line, or make a new file with `relay keygen`"
            )
        if key in seen:
            raise KeyFileError(
                f"key file {where}, line {number}: repeats the key of line {seen[key]}; delete it"
            )
        seen[key] = number
        keys.append(key)
    if not keys:
        raise KeyFileError(f"key file {where} has no key, only comments; {keygen} --force")
    return KeyRing(keys)


def write_key_file(path: str | os.PathLike[str], force: bool = False) -> str:
    """Write a new key file (mode 0600) holding one fresh key; return that key's id.

    Without ``force`` an existing path is refused; with it the file is replaced atomically.
    """
    where = Path(path)
    key = secrets.token_bytes(KEY_BYTES)
    content = (_KEY_FILE_HEADER + b64url_encode(key) + "\n").encode("ascii")
    try:
        if not force:
            try:
                fd = os.open(where, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600)
            except FileExistsError:
                raise KeyFileError(
                    f"{where} already exists; pass --force to replace it "
                    "(tokens signed by its keys stop verifying)"
                ) from None
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(content)
                    handle.flush()
                    os.fsync(handle.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(where)
                raise
        else:
            if where.is_dir():
                raise KeyFileError(f"{where} is a directory; give a file path")
            fd, temp = tempfile.mkstemp(prefix=f".{where.name}.", suffix=".tmp", dir=where.parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    os.fchmod(handle.fileno(), 0o600)
                    handle.write(content)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, where)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
    except KeyFileError:
        raise
    except FileNotFoundError:
        raise KeyFileError(f"directory {where.parent} does not exist; create it first") from None
    except OSError as exc:
        raise KeyFileError(f"cannot write {where} ({exc.strerror})") from None
    return key_id(key)

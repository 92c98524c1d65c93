"""Build the docker backend's image from the host's own interpreter, without a registry.

The root filesystem holds: the interpreter running holedger and its standard library at
their host paths (site-packages left out), the shared libraries they and the harness
runtime link against (found with ldd), /bin/sh, the harness runtime at
/opt/holedger/runtime, the entrypoint at /opt/holedger/entry.py, python3/python links in
/opt/holedger/bin, synthetic /etc files, and empty mount points. It is packed as a tar and
handed to ``docker import``. The image carries the runtime's content key as a label.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from holedger.errors import SandboxError
from holedger.sandboxes.common import ETC_FILES
from holedger.sandboxes.docker_client import docker_client
from holedger.sandboxes.runtime import Interpreter, build_runtime, host_interpreter
from holedger.sandboxes.spec import BIN_DIR, CODE_DIR, RUNTIME_DIR, SANDBOX_PATH

IMAGE = os.environ.get("HOLEDGER_SANDBOX_IMAGE", "holedger-sandbox:latest")
ENTRY_PATH = "/opt/holedger/entry.py"
IN_DIR = "/run/holedger/in"
OUT_DIR = "/run/holedger/out"
STDLIB_SKIP = frozenset(
    {
        "site-packages",
        "dist-packages",
        "test",
        "idlelib",
        "turtledemo",
        "ensurepip",
        "tkinter",
        "lib2to3",
    }
)
_LDD_PATH = re.compile(r"(/\S+)")


def image_key(runtime_key: str) -> str:
    """What the image must be rebuilt for: its format, the entrypoint, the runtime, python."""
    h = hashlib.sha256(f"image-format=1;runtime={runtime_key};python={sys.version}\n".encode())
    h.update(Path(__file__).with_name("entry.py").read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ImageInfo:
    tag: str
    image_id: str
    runtime_key: str
    size_bytes: int


def _shared_libs(files: list[Path]) -> set[Path]:
    libs: set[Path] = set()
    for chunk in range(0, len(files), 64):
        batch = [str(f) for f in files[chunk : chunk + 64]]
        out = subprocess.run(["ldd", *batch], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            if "=>" in line:
                line = line.split("=>", 1)[1]
            m = _LDD_PATH.search(line)
            if m and Path(m.group(1)).exists():
                libs.add(Path(m.group(1)))
    return libs


def _add_parents(tar: tarfile.TarFile, dest: str, seen: set[str]) -> None:
    """Explicit 0755 entries for every ancestor, so uid 65534 can traverse them."""
    parts = Path(dest).parts[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d and d not in seen:
            seen.add(d)
            _add_dir(tar, d)


def _add_file(tar: tarfile.TarFile, src: Path, dest: str, seen: set[str]) -> None:
    """Add ``src`` at ``dest`` (following the symlink chain so both names exist)."""
    if dest == str(src):  # a host path: land it at its real directory (merged /usr)
        dest = os.path.join(os.path.realpath(src.parent), src.name)
    dest = dest.lstrip("/")
    if dest in seen:
        return
    _add_parents(tar, dest, seen)
    seen.add(dest)
    if src.is_symlink():
        target = os.readlink(src)
        _add_symlink(tar, dest, target)
        real_src = Path(os.path.normpath(os.path.join(src.parent, target)))
        if os.path.isabs(target):
            _add_file(tar, real_src, str(real_src), seen)
        else:
            real_dest = os.path.normpath(os.path.join("/" + os.path.dirname(dest), target))
            _add_file(tar, real_src, real_dest, seen)
        return
    info = tar.gettarinfo(str(src), dest)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755 if os.access(src, os.X_OK) else 0o644
    with open(src, "rb") as f:
        tar.addfile(info, f)


def _add_dir(tar: tarfile.TarFile, dest: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(dest.lstrip("/"))
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _add_text(tar: tarfile.TarFile, dest: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(dest.lstrip("/"))
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _add_symlink(tar: tarfile.TarFile, dest: str, target: str) -> None:
    info = tarfile.TarInfo(dest.lstrip("/"))
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info)


def write_rootfs(path: Path, interp: Interpreter, runtime: Path) -> None:
    """Write the image's root filesystem as a tar at ``path``."""
    seen: set[str] = set()
    with tarfile.open(path, "w") as tar:
        _add_dir(tar, "/tmp", 0o1777)
        for d in (
            "/usr",
            "/usr/bin",
            "/usr/lib",
            "/etc",
            "/opt",
            "/opt/holedger",
            BIN_DIR,
            "/run",
            "/run/holedger",
            IN_DIR,
            OUT_DIR,
            CODE_DIR,
            "/proc",
            "/dev",
            "/sys",
        ):
            _add_dir(tar, d)
            seen.add(d.lstrip("/"))
        seen.add("tmp")
        for top in ("bin", "sbin", "lib", "lib64"):
            host = Path("/") / top
            if host.is_symlink():
                _add_symlink(tar, f"/{top}", os.readlink(host))
                seen.add(top)
        for name, text in ETC_FILES.items():
            _add_text(tar, f"/etc/{name}", text.encode())
        native: list[Path] = [interp.executable]
        if interp.shared_lib:
            native.append(interp.shared_lib)
        sh = Path("/bin/sh")
        if sh.exists():
            native.append(sh.resolve())
            _add_file(
                tar,
                Path("/usr/bin/sh") if Path("/usr/bin/sh").exists() else sh,
                "/usr/bin/sh",
                seen,
            )
        for f in native:
            _add_file(tar, f, str(f), seen)
        for root, dirs, files in os.walk(interp.stdlib):
            dirs[:] = sorted(d for d in dirs if d not in STDLIB_SKIP)
            for name in sorted(files):
                src = Path(root) / name
                _add_file(tar, src, str(src), seen)
                if name.endswith(".so"):
                    native.append(src)
        for root, dirs, files in os.walk(runtime):
            dirs.sort()
            for name in sorted(files):
                src = Path(root) / name
                rel = src.relative_to(runtime)
                _add_file(tar, src, f"{RUNTIME_DIR}/{rel}", seen)
                if ".so" in name:
                    native.append(src)
        for lib in sorted(_shared_libs(native)):
            _add_file(tar, lib, str(lib), seen)
        _add_file(tar, Path(__file__).with_name("entry.py"), ENTRY_PATH, seen)
        for name in ("python3", "python"):
            _add_symlink(tar, f"{BIN_DIR}/{name}", str(interp.executable))


def build_image(tag: str = IMAGE, client: Any = None) -> ImageInfo:
    """Build the sandbox image with ``docker import``; returns its id and size."""
    client = client or docker_client()
    interp = host_interpreter()
    runtime = build_runtime()
    key = runtime.name.rsplit("-", 1)[-1]
    work = Path(tempfile.mkdtemp(prefix="holedger-image-"))
    try:
        tar_path = work / "rootfs.tar"
        write_rootfs(tar_path, interp, runtime)
        repo, _, version = tag.partition(":")
        changes = [
            f"ENV PATH={SANDBOX_PATH}",
            f"ENV PYTHONPATH={RUNTIME_DIR}",
            "ENV LANG=C.UTF-8",
            f"WORKDIR {CODE_DIR}",
            "USER 65534:65534",
            f"LABEL holedger.runtime={key}",
            f"LABEL holedger.image={image_key(key)}",
        ]
        try:
            client.api.import_image_from_file(
                str(tar_path), repository=repo, tag=version or "latest", changes=changes
            )
            image = client.images.get(tag)
        except Exception as exc:
            raise SandboxError(f"docker import failed: {exc}") from exc
        return ImageInfo(tag, image.id, key, int(image.attrs.get("Size", 0)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def current_image(tag: str = IMAGE, client: Any = None) -> ImageInfo | None:
    """The image at ``tag`` when it is current for this interpreter and runtime, else None."""
    from holedger.sandboxes.runtime import runtime_distributions, runtime_key

    client = client or docker_client()
    key = runtime_key(runtime_distributions())
    try:
        image = client.images.get(tag)
    except Exception:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    if labels.get("holedger.image") != image_key(key):
        return None
    return ImageInfo(tag, image.id, key, int(image.attrs.get("Size", 0)))

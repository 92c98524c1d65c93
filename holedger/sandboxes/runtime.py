"""The harness runtime: the interpreter a trial runs on and the packages it may import.

A trial must never see the holedger package (its bundled tasks hold held-out answers), nor
anything else in the host's site-packages. So the sandbox gets the interpreter and its
standard library read-only, with every site-packages directory hidden, plus one curated
directory holding only the distributions a harness may import: by default ``openai`` and
``anthropic`` (the two providers' SDKs) and everything they require, found from the
installed distributions' metadata and copied, with their compiled bytecode, into a cache
directory built once per content digest.
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.metadata as metadata
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from holedger.errors import SandboxError

DEFAULT_PACKAGES = ("openai", "anthropic")
RUNTIME_FORMAT = 1
# Never copied into a runtime, whatever depends on it.
FORBIDDEN = frozenset({"holedger"})


@dataclass(frozen=True)
class Interpreter:
    """The host interpreter's files that a sandbox binds read-only at their own paths."""

    executable: Path  # the real binary (symlinks and venvs resolved)
    stdlib: Path  # lib/python3.X, including lib-dynload
    shared_lib: Path | None  # libpython3.X.so.1.0 when the build is shared
    hidden: tuple[Path, ...]  # site-packages directories to mask inside the sandbox
    version: str  # "3.11.7"


def host_interpreter() -> Interpreter:
    """Describe the interpreter running holedger (a trial runs on the same one)."""
    executable = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    shared: Path | None = None
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = sysconfig.get_config_var("LIBDIR")
        soname = sysconfig.get_config_var("INSTSONAME")
        if libdir and soname and (Path(libdir) / soname).exists():
            shared = (Path(libdir) / soname).resolve()
    candidates = [*site.getsitepackages(), site.getusersitepackages()]
    candidates += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    # In a virtualenv those are the venv's; the base interpreter (the one a trial runs)
    # has its own, which its site module would add inside the sandbox.
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    candidates += [sysconfig.get_paths(vars=base)[key] for key in ("purelib", "platlib")]
    # Other interpreters under /usr (visible in bwrap) keep their packages here.
    for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages"):
        candidates += [str(p) for p in Path("/usr").glob(pattern)]
        candidates += [str(p) for p in Path("/usr/local").glob(pattern)]
    hidden = tuple(sorted({Path(p).resolve() for p in candidates if Path(p).is_dir()}))
    version = ".".join(str(v) for v in sys.version_info[:3])
    return Interpreter(executable, stdlib, shared, hidden, version)


def _requirements(dist: metadata.Distribution) -> list[str]:
    names = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        names.append(req.name)
    return names


def runtime_distributions(roots: tuple[str, ...] = DEFAULT_PACKAGES) -> list[metadata.Distribution]:
    """``roots`` and everything they require (no extras), from installed metadata."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        if name in FORBIDDEN:
            raise SandboxError(f"the harness runtime may not contain {name!r}")
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise SandboxError(
                f"package {name!r} for the harness runtime is not installed",
                hint=f"pip install {name}",
            ) from exc
        seen[name] = dist
        todo.extend(_requirements(dist))
    return [seen[k] for k in sorted(seen)]


def runtime_key(dists: list[metadata.Distribution]) -> str:
    h = hashlib.sha256(f"format={RUNTIME_FORMAT};python={sys.version}\n".encode())
    for dist in dists:
        h.update(f"{canonicalize_name(dist.metadata['Name'])}=={dist.version}\n".encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """``$HOLEDGER_CACHE``, else ``$XDG_CACHE_HOME/holedger``, else ``~/.cache/holedger``."""
    env = os.environ.get("HOLEDGER_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "holedger"


def _copy_distribution(dist: metadata.Distribution, dest: Path) -> None:
    base = Path(str(dist.locate_file(""))).resolve()
    for rel in dist.files or []:
        src = Path(str(dist.locate_file(rel))).resolve()
        try:
            inside = src.relative_to(base)
        except ValueError:
            continue  # console scripts and data outside site-packages
        if inside.parts and inside.parts[0].endswith((".pth",)):
            continue
        if not src.is_file():
            continue
        target = dest / inside
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def build_runtime(roots: tuple[str, ...] = DEFAULT_PACKAGES, cache: Path | None = None) -> Path:
    """The runtime directory for ``roots`` (built on first use; content-addressed)."""
    dists = runtime_distributions(roots)
    root = cache or cache_root()
    final = root / f"harness-runtime-{runtime_key(dists)}"
    if (final / ".complete").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".runtime-", dir=root))
    try:
        for dist in dists:
            _copy_distribution(dist, work)
        for name in FORBIDDEN:
            if (work / name).exists():
                raise SandboxError(f"the harness runtime would contain {name!r}")
        compileall.compile_dir(str(work), quiet=2, workers=1)
        names = "\n".join(f"{d.metadata['Name']}=={d.version}" for d in dists)
        (work / ".complete").write_text(names + "\n")
        for dirpath, dirnames, filenames in os.walk(work):
            for n in dirnames:
                os.chmod(os.path.join(dirpath, n), 0o755)
            for n in filenames:
                os.chmod(os.path.join(dirpath, n), 0o644)
        os.chmod(work, 0o755)
        try:
            os.rename(work, final)
        except OSError:
            if not (final / ".complete").exists():
                raise
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return final

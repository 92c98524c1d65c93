"""The parts that need no engine: seccomp program, DNS parsing, argv/kwargs, runtime, CLI."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from holedger.cli import cli
from holedger.errors import SandboxError
from holedger.sandboxes import get_backend
from holedger.sandboxes.netns import _dns_question, _nxdomain
from holedger.sandboxes.runtime import build_runtime, host_interpreter, runtime_distributions
from holedger.sandboxes.seccomp import (
    AUDIT_ARCH_X86_64,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    X86_64_CLONE3,
    X86_64_DENIED,
    x86_64_filter,
)
from holedger.sandboxes.spec import Limits, SandboxSpec


def _interpret(program: bytes, nr: int, arch: int = AUDIT_ARCH_X86_64, arg0: int = 0) -> int:
    """A tiny classic-BPF interpreter for the instructions holedger's filter uses."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == 0x06:
            return k
        else:
            cond = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if cond else jf)


def test_seccomp_filter_decisions() -> None:
    prog = x86_64_filter()
    assert len(prog) % 8 == 0
    assert _interpret(prog, 0) == SECCOMP_RET_ALLOW  # read
    assert _interpret(prog, 56, arg0=0x11) == SECCOMP_RET_ALLOW  # clone(SIGCHLD): fork
    assert _interpret(prog, 56, arg0=0x3D0F00) == SECCOMP_RET_ALLOW  # pthread_create flags
    assert _interpret(prog, 56, arg0=0x10000011) == SECCOMP_RET_ERRNO | 1  # CLONE_NEWUSER
    assert _interpret(prog, X86_64_CLONE3) == SECCOMP_RET_ERRNO | 38  # ENOSYS, not EPERM
    for name, nr in X86_64_DENIED.items():
        assert _interpret(prog, nr) == SECCOMP_RET_ERRNO | 1, name
    assert _interpret(prog, 0x40000000 + 1) == SECCOMP_RET_ERRNO | 1  # x32 ABI
    assert _interpret(prog, 0, arch=0x40000003) == 0x80000000  # i386 ABI: kill


def test_dns_question_parsing_and_nxdomain() -> None:
    query = struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 0)
    query += b"\x05exfil\x07example\x03com\x00" + struct.pack("!HH", 1, 1)
    parsed = _dns_question(query)
    assert parsed is not None and parsed[0] == "exfil.example.com"
    reply = _nxdomain(query, parsed[1])
    qid, flags, qd = struct.unpack_from("!HHH", reply)
    assert (qid, flags & 0x8000, flags & 0xF, qd) == (0xBEEF, 0x8000, 3, 1)
    assert _dns_question(b"\x00" * 5) is None
    assert _dns_question(query[:20]) is None  # truncated name


def test_runtime_holds_openai_and_anthropic_and_never_holedger() -> None:
    names = {d.metadata["Name"].lower() for d in runtime_distributions()}
    assert {"openai", "anthropic", "pydantic"} <= names
    assert "holedger" not in names
    runtime = build_runtime()
    assert (runtime / "openai" / "__init__.py").is_file()
    assert (runtime / "anthropic" / "__init__.py").is_file()
    assert not (runtime / "holedger").exists()
    assert not list(runtime.glob("*.pth"))


def test_runtime_is_built_once_per_content(tmp_path: Path) -> None:
    runtime = build_runtime(("sniffio",), cache=tmp_path)
    assert (runtime / "sniffio" / "__init__.py").is_file()
    assert list(runtime.glob("sniffio/__pycache__/*.pyc"))
    assert build_runtime(("sniffio",), cache=tmp_path) == runtime
    assert len(list(tmp_path.iterdir())) == 1


def test_runtime_refuses_holedger(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="may not contain"):
        build_runtime(("holedger",), cache=tmp_path)


def test_interpreter_hides_site_packages() -> None:
    interp = host_interpreter()
    assert interp.executable.is_file()
    assert any(p.name in ("site-packages", "dist-packages") for p in interp.hidden)


def _spec(tmp_path: Path) -> SandboxSpec:
    return SandboxSpec(
        code_dir=tmp_path,
        argv=["python3", "-m", "harness"],
        env={"OPENAI_API_KEY": "k"},
        limits=Limits(wall_s=5, memory_mb=256, cpus=0.5, pids=16),
        label="t1",
    )


def test_bwrap_argv_isolates(tmp_path: Path) -> None:
    from holedger.sandboxes.bwrap import BwrapBackend

    backend = BwrapBackend()
    if not backend.bwrap:
        pytest.skip("bwrap not installed")
    interp = host_interpreter()
    argv = backend.build_argv(
        _spec(tmp_path),
        interp=interp,
        runtime=tmp_path,
        etc=tmp_path,
        empty=tmp_path / "empty",
        seccomp_fd=17,
        info_fd=18,
        block_fd=19,
        stdin_fd=20,
    )
    for flag in ("--unshare-user", "--unshare-pid", "--die-with-parent"):
        assert flag in argv
    # the environment (the token) is bwrap's own, never on its command line
    assert "--setenv" not in argv and not any("k" == a for a in argv)
    assert backend.environment(_spec(tmp_path))["OPENAI_API_KEY"] == "k"
    assert "--share-net" not in argv  # the netns is holedger's own
    assert argv[argv.index("--uid") + 1] == "65534"
    assert argv[argv.index("--seccomp") + 1] == "17"
    assert argv[argv.index("--block-fd") + 1] == "19"  # held until confined
    etc = argv.index("/etc")  # the synthetic /etc, one read-only mount
    assert argv[etc - 2 : etc + 1] == ["--ro-bind", str(tmp_path), "/etc"]
    i = argv.index("--ro-bind", argv.index("--chdir") - 4)
    assert argv[i : i + 3] == ["--ro-bind", str(tmp_path.resolve()), "/code"]
    for hidden in interp.hidden:
        if str(hidden).startswith(str(interp.stdlib)):
            i = argv.index(str(hidden))
            assert argv[i - 2 : i] == ["--ro-bind", str(tmp_path / "empty")]
    assert argv[-3:] == ["python3", "-m", "harness"]
    assert argv[argv.index("--file") + 1] == "20"  # the trial's stdin, copied in
    # the root is made read-only after everything in it exists
    assert argv.index("--remount-ro") > max(i for i, a in enumerate(argv) if a == "--ro-bind")
    assert argv[argv.index("--remount-ro") + 1] == "/"
    assert "--bind" not in argv  # nothing of the host is writable


def test_docker_kwargs_lock_the_container_down(tmp_path: Path) -> None:
    pytest.importorskip("docker")
    from holedger.sandboxes.docker_backend import DockerBackend

    kw = DockerBackend(client=object()).container_kwargs(
        _spec(tmp_path), tmp_path, tmp_path / "in", tmp_path / "out"
    )
    assert kw["network_mode"] == "none"
    assert kw["read_only"] is True
    assert kw["cap_drop"] == ["ALL"]
    assert kw["security_opt"][0] == "no-new-privileges"
    assert kw["log_config"]["type"] == "none"  # no log file on the host
    assert kw["user"] == "65534:65534"
    assert kw["mem_limit"] == kw["memswap_limit"] == 256 * 1024 * 1024
    assert kw["pids_limit"] == 16 and kw["nano_cpus"] == 500_000_000
    assert kw["volumes"][str(tmp_path)] == {"bind": "/code", "mode": "ro"}
    assert kw["labels"]["holedger.sandbox"] == "1" and kw["labels"]["holedger.trial"] == "t1"
    assert kw["environment"]["OPENAI_API_KEY"] == "k"


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(SandboxError, match="unknown sandbox backend"):
        get_backend("vm")


def test_limits_record_is_integers() -> None:
    record = Limits(wall_s=1.5, cpus=0.25).as_record()
    assert record["wall_ms"] == 1500 and record["millicpus"] == 250
    assert record["cpu_ms"] == 1500
    assert all(isinstance(v, int) for v in record.values())


def test_doctor_reports_every_backend() -> None:
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [b["name"] for b in data["backends"]] == ["bwrap", "docker", "process"]
    assert all(isinstance(b["works"], bool) and b["detail"] for b in data["backends"])
    assert data["default"] in (None, "bwrap", "docker")
    table = CliRunner().invoke(cli, ["doctor"])
    assert table.exit_code == 0 and "process" in table.output


def test_gc_removes_empty_trial_cgroups_only() -> None:
    from holedger.sandboxes.cgroups import manager

    cg = manager()
    if not cg.usable:
        pytest.skip(f"no usable cgroups: {cg.reason}")
    group = cg.create("gc-test", Limits())
    assert group is not None
    names = {d.name for d in group.dirs.values()}
    result = CliRunner().invoke(cli, ["sandbox", "gc", "--json"])
    assert result.exit_code == 0, result.output
    assert names <= set(json.loads(result.output)["cgroups"])
    assert not any(d.exists() for d in group.dirs.values())


def test_build_image_if_needed_keeps_a_current_image(docker_backend: object) -> None:
    result = CliRunner().invoke(cli, ["sandbox", "build-image", "--if-needed", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["built"] is False  # the docker backend is available, so its image is current
    assert data["tag"] and data["id"].startswith("sha256:")


def test_etc_dir_holds_the_synthetic_files_and_the_loader_cache() -> None:
    """bwrap mounts this one directory as /etc: the synthetic files and a current copy of
    the host's loader cache, so that no host file is mounted there on its own."""
    from holedger.sandboxes.common import ETC_FILES, LOADER_CACHE, etc_dir

    etc = etc_dir()
    for name, text in ETC_FILES.items():
        assert (etc / name).read_text() == text
    if LOADER_CACHE.is_file():
        assert (etc / "ld.so.cache").read_bytes() == LOADER_CACHE.read_bytes()
    assert sorted(p.name for p in etc.iterdir()) == sorted(
        [*ETC_FILES, *(["ld.so.cache"] if LOADER_CACHE.is_file() else [])]
    )


def test_child_pid_is_taken_from_the_first_write_when_it_is_bwraps_child() -> None:
    """--info-fd: the pid is used as soon as it is seen, if it is the given parent's child;
    otherwise the whole document is read (up to the writer's close)."""
    import os
    import subprocess
    import threading

    from holedger.sandboxes.bwrap_trial import _read_child_pid

    child = subprocess.Popen(["sleep", "30"])
    try:
        r, w = os.pipe()
        os.write(w, f'{{\n    "child-pid": {child.pid}'.encode())
        assert _read_child_pid(r, 2.0, parent=os.getpid()) == child.pid  # no close needed
        os.close(r)
        os.close(w)

        r, w = os.pipe()
        os.write(w, f'{{\n    "child-pid": {child.pid}'.encode())
        rest = threading.Timer(0.2, lambda: (os.write(w, b',\n    "x": 1\n}\n'), os.close(w)))
        rest.start()
        # not a child of pid 1: only the complete document counts
        assert _read_child_pid(r, 2.0, parent=1) == child.pid
        rest.join()
        os.close(r)
    finally:
        child.kill()
        child.wait()


def test_interpreter_lib_is_one_bind_only_when_it_holds_only_python(tmp_path: Path) -> None:
    from holedger.sandboxes.bwrap import _interpreter_lib
    from holedger.sandboxes.runtime import Interpreter

    lib = tmp_path / "lib"
    (lib / "python3.99").mkdir(parents=True)
    (lib / "pkgconfig").mkdir()
    (lib / "pkgconfig" / "python-3.99.pc").write_text("")
    (lib / "libpython3.99.so.1.0").write_text("")
    interp = Interpreter(
        tmp_path / "bin" / "python3.99",
        lib / "python3.99",
        lib / "libpython3.99.so.1.0",
        (),
        "3.99.0",
    )
    assert _interpreter_lib(interp) == lib
    (lib / "libssl.so.3").write_text("")  # something else: bind the stdlib alone
    assert _interpreter_lib(interp) == lib / "python3.99"
    static = Interpreter(interp.executable, interp.stdlib, None, (), "3.99.0")
    assert _interpreter_lib(static) == lib / "python3.99"


def test_a_thread_spawns_inside_a_v1_group_and_goes_back() -> None:
    import os
    import subprocess

    from holedger.sandboxes.cgroups import manager

    cg = manager()
    if cg.version != 1:
        pytest.skip(f"needs cgroup v1: {cg.reason}")
    group = cg.create("join-test", Limits())
    assert group is not None

    def mine() -> str:
        return Path("/proc/thread-self/cgroup").read_text()

    before = mine()
    try:
        with group.thread_joined():
            assert group.dirs["pids"].name in mine()
            child = subprocess.Popen(["sleep", "30"])
            assert os.getpid() not in group.members()  # holedger itself is never listed
        assert mine() == before
        assert group.members() == [child.pid] and group.pids() == [child.pid]
        assert group.kill_all() == [child.pid]
        child.wait()
    finally:
        group.remove()


def test_a_virtualenvs_base_site_packages_are_hidden_too(tmp_path: Path) -> None:
    """holedger run from a virtualenv: the trial runs the base interpreter, whose own
    site-packages (pytest, holedger's dependencies...) must be masked as well as the
    venv's."""
    import subprocess
    import sys
    import sysconfig

    base_vars = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    base_site = Path(sysconfig.get_paths(vars=base_vars)["purelib"]).resolve()
    if not base_site.is_dir():
        pytest.skip(f"this interpreter has no site-packages at {base_site}")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code = (
        "import json, sys; from holedger.sandboxes.runtime import host_interpreter;"
        "assert sys.prefix != sys.base_prefix;"
        "print(json.dumps([str(p) for p in host_interpreter().hidden]))"
    )
    # the venv imports holedger and its dependencies from where this process does
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    hidden = {Path(p) for p in json.loads(done.stdout)}
    assert base_site in hidden
    assert (venv / "lib").resolve() in {p.parents[1] for p in hidden}  # the venv's own


def test_every_registered_backend_has_the_whole_interface() -> None:
    # set-up and clean-up are part of the interface, not special cases of one backend
    from holedger.sandboxes.registry import BACKEND_NAMES, FACTORIES
    from holedger.sandboxes.spec import Backend

    assert set(BACKEND_NAMES) == {"bwrap", "docker", "process"}
    for name in BACKEND_NAMES:
        made = FACTORIES[name]()
        assert isinstance(made, Backend), name
        assert made.name == name
        made.settle(1.0)
        made.close()


def test_an_unknown_backend_is_refused_by_name() -> None:
    from holedger.errors import SandboxError
    from holedger.sandboxes import get_backend

    with pytest.raises(SandboxError, match="unknown sandbox backend 'chroot'"):
        get_backend("chroot")

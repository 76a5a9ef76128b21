"""The weight-streaming linear kernel (lookahead_core/kernels): the same products as PyTorch's,
bit-identical rows whatever the rows beside them, the model swap that keeps parameters and ties,
losslessness of lookahead on a swapped model, and the harness's ``model.linear`` key."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch

from experiments.data.datasets import repo_root
from experiments.models.loader import load_model
from lookahead_core import LookaheadConfig, decode, kernels
from lookahead_core.config import DecodeLimits

REASON = kernels.unavailable()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"streaming kernel unavailable here: {REASON}")
# Every ISA the kernel is built for, each tested where this CPU runs it (an AVX-512 host tests both:
# AVX2 code runs there) and skipped, with the reason, where it does not.
ISAS = [pytest.param(isa, marks=pytest.mark.skipif(kernels.unavailable(isa) is not None,
                                                   reason=f"{isa} kernel unavailable here: {kernels.unavailable(isa)}"))
        for isa in kernels.FLAGS]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("out_features,in_features,bias", [(37, 64, True), (130, 48, False), (8, 16, True)])
def test_products_match_torch_for_every_row_count(isa, out_features, in_features, bias):
    gen = torch.Generator().manual_seed(out_features)
    w = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    most = kernels.MAX_ROWS[isa] + 3
    x = torch.randn(most, in_features, generator=gen)
    for rows in range(1, most + 1):      # every group size and pass the kernel has, and beyond its rows
        got = kernels.stream_linear(x[:rows].contiguous(), w, b, isa=isa)
        torch.testing.assert_close(got, torch.nn.functional.linear(x[:rows], w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(isa):
    """Batch invariance, bit for bit: every row computed alone, at each place of a product of
    1..MAX_ROWS rows, equals the same row computed among the others (MKL's kernels differ here)."""
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(203, 96, generator=gen), torch.randn(203, generator=gen)   # 203: blocks of 4 or 2, + rest
    most = kernels.MAX_ROWS[isa]
    x = torch.randn(most, 96, generator=gen)
    alone = torch.cat([kernels.stream_linear(x[r:r + 1].contiguous(), w, b, isa=isa) for r in range(most)])
    for rows in range(1, most + 1):
        together = kernels.stream_linear(x[:rows].contiguous(), w, b, isa=isa)
        assert torch.equal(together, alone[:rows]), rows


@pytest.mark.parametrize("isa", ISAS)
def test_the_kernel_refuses_what_it_cannot_compute(isa):
    w = torch.randn(8, 24)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernels.stream_linear(torch.randn(2, 24), w, isa=isa)
    with pytest.raises(RuntimeError, match="float32"):
        kernels.stream_linear(torch.randn(2, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64), isa=isa)


def test_the_isa_is_the_one_torch_dispatches_to_and_one_the_cpu_runs(monkeypatch):
    """The default ISA follows ``torch.backends.cpu.get_cpu_capability()`` (so ``ATEN_CPU_CAPABILITY=avx2``
    selects the AVX2 kernel on an AVX-512 host); a CPU with neither gets one line naming its capability;
    an ISA the CPU lacks is refused by name, an unknown one as a bad argument."""
    assert kernels.selected_isa() is None or kernels.selected_isa() in kernels.host_isas()
    for capability, isa in (("AVX512", "avx512"), ("AVX2", "avx2"), ("DEFAULT", None)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert kernels.selected_isa() == isa
    assert kernels.unavailable() == "this CPU's vector capability is DEFAULT, the kernel needs AVX512 or AVX2"
    monkeypatch.setattr(kernels, "_failures", {})
    monkeypatch.setattr(kernels, "_extensions", {})
    monkeypatch.setattr(kernels, "host_isas", lambda: ("avx2",))
    assert kernels.unavailable("avx512") == "this CPU does not run AVX512 instructions"
    with pytest.raises(ValueError, match="isa must be one of avx512, avx2, got 'sse'"):
        kernels.unavailable("sse")


@pytest.mark.parametrize("isa", ISAS)
def test_the_swap_keeps_parameters_ties_and_falls_back_beyond_its_rows(isa, monkeypatch):
    import types

    model, _ = load_model("tiny-llama")
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    before = {k: v.clone() for k, v in model.state_dict().items()}
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert kernels.use_streaming_linear(model, isa=isa) == linears
    assert kernels.linear_kernel(model) == "stream"
    assert model.lm_head.weight is model.model.embed_tokens.weight            # still tied, no copy
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(isinstance(m, kernels.StreamingLinear) and m.isa == isa
               for m in model.modules() if isinstance(m, torch.nn.Linear))
    layer = model.lm_head
    calls = []
    original = kernels._extensions[isa].stream_linear
    monkeypatch.setitem(kernels._extensions, isa, types.SimpleNamespace(
        stream_linear=lambda *a: calls.append(a[0].shape[0]) or original(*a)))
    most = kernels.MAX_ROWS[isa]
    with torch.no_grad():
        layer(torch.randn(1, most, layer.in_features))                # MAX_ROWS rows: the kernel
        layer(torch.randn(most + 1, layer.in_features))               # one more: F.linear
    out = layer(torch.randn(2, layer.in_features, requires_grad=True))   # gradients: F.linear
    assert calls == [most] and out.requires_grad


@needs_kernel
def test_running_swaps_the_kernel_for_a_block_and_restores_it_even_on_error():
    """``kernels.running``: stock layers inside the block (PyTorch's products, bit for bit), the
    streaming ones after it, the same parameters and ties throughout; an exception restores too."""
    model, _ = load_model("tiny-llama", linear="stream")
    model.lm_head.weight = model.model.embed_tokens.weight
    weights = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    x = torch.randn(5, model.lm_head.in_features)
    with torch.no_grad():
        with kernels.running(model, "stock"):
            assert kernels.linear_kernel(model) == "stock"
            assert not any(isinstance(m, kernels.StreamingLinear) for m in model.modules())
            assert torch.equal(model.lm_head(x), torch.nn.functional.linear(x, model.lm_head.weight))
            with kernels.running(model, "stock"):          # already stock: nothing to swap
                assert kernels.linear_kernel(model) == "stock"
        assert kernels.linear_kernel(model) == "stream"
        assert torch.equal(model.lm_head(x), kernels.stream_linear(x, model.lm_head.weight))
    with pytest.raises(KeyError), kernels.running(model, "stock"):
        raise KeyError("inside")
    assert kernels.linear_kernel(model) == "stream"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(p is weights[name] for name, p in model.named_parameters(remove_duplicate=False))
    with pytest.raises(ValueError, match="stock or stream"), kernels.running(model, "mkl"):
        pass


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_lookahead_on_a_swapped_model_equals_its_greedy(arch, isa):
    """Losslessness holds on the kernel as on PyTorch's: every config's tokens equal the swapped
    model's own greedy, in fp32, steps of up to MAX_ROWS rows running the kernel and wider ones MKL."""
    model, _ = load_model(f"tiny-{arch}")
    kernels.use_streaming_linear(model, isa=isa)
    assert kernels.linear_kernel(model) == "stream"
    prompt = torch.randint(0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    limits = DecodeLimits(48, ())
    greedy = decode(model, prompt, None, limits).tokens
    for config in (LookaheadConfig(window=2, ngram=3, guess=2), LookaheadConfig(window=5, ngram=4, guess=5),
                   LookaheadConfig(window=3, ngram=3, guess=3, prompt_pool=True, tree=True,
                                   sources={"suffix": 2, "recycle": 2}, budget=12)):
        assert decode(model, prompt, config, limits).tokens == greedy, config


def test_stream_is_refused_where_it_cannot_run(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.raises(kernels.KernelUnavailable, match="model.linear=stream: this CPU's vector capability is "
                                                          "DEFAULT, the kernel needs AVX512 or AVX2; use model.linear=stock"):
        load_model("tiny-llama", linear="stream")
    model, _ = load_model("tiny-llama", linear="auto")                 # auto: stock, nothing raised
    assert kernels.linear_kernel(model) == "stock"


def test_a_kernel_built_wrong_on_this_cpu_is_refused(monkeypatch):
    """The build's self-check (run on every host, with a stand-in for the built extension): a kernel
    whose products are wrong at some row count is refused with that count, and one that is right
    passes."""
    import types

    right = types.SimpleNamespace(stream_linear=lambda x, w, b: torch.nn.functional.linear(x, w, b))
    assert kernels._self_check(right, 12) is None

    def wrong(x, w, b):
        out = torch.nn.functional.linear(x, w, b)
        return out * float("nan") if len(x) == 7 else out

    assert kernels._self_check(types.SimpleNamespace(stream_linear=wrong), 6) is None      # 7 rows: not served
    assert kernels._self_check(types.SimpleNamespace(stream_linear=wrong), 12).startswith(
        "the kernel built on this CPU computes 7-row products nan away")


@needs_kernel
def test_kernel_curves_script_times_every_kernel_and_size_in_each_round(tmp_path, capsys):
    """scripts/kernel_curves.py end to end on a tiny model: every round times stock and each ISA's
    kernel at every k (bfloat16: stock only); the table's ratios are medians of within-round ratios;
    the per-part split adds up to the forward."""
    spec = importlib.util.spec_from_file_location("kernel_curves", repo_root() / "scripts" / "kernel_curves.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    threads = torch.get_num_threads()
    try:
        script.main(["--models", "tiny-llama", "--rounds", "3", "--parts", "1", "--sizes", "1", "3",
                     "--dtypes", "float32", "bfloat16", "--kv", "16", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    table = pd.read_csv(tmp_path / "curves.csv")
    streams = [f"stream-{isa}" for isa in kernels.host_isas() if kernels.unavailable(isa) is None]
    want = sorted([("bfloat16", "stock", k, r) for k in (1, 3) for r in (1, 2, 3)]
                  + [("float32", linear, k, r) for linear in ["stock", *streams] for k in (1, 3) for r in (1, 2, 3)])
    assert sorted(zip(table.dtype, table.linear, table.k, table["round"])) == want
    assert (table.ms > 0).all() and (table.threads == 1).all() and table.host.notna().all()
    ratios = script.ratio_table(table).set_index(["dtype", "linear"])
    for (dtype, linear), rows in table.groupby(["dtype", "linear"]):
        per_round = rows[rows.k == 3].set_index("round").ms / rows[rows.k == 1].set_index("round").ms
        assert ratios.loc[(dtype, linear), 3] == round(per_round.median(), 2)
    parts = pd.read_csv(tmp_path / "parts.csv")
    assert (parts[list(script.PARTS)].sum(axis=1) - parts.ms).abs().max() < 1e-2
    assert (parts[["linears", "attention"]] > 0).all().all()
    printed = capsys.readouterr().out
    assert "| tiny-llama | bfloat16 | stock |" in printed and f"| tiny-llama | float32 | {streams[0]} |" in printed


@needs_kernel
def test_a_both_kernels_job_runs_every_decoder_on_each_kernel_interleaved(tmp_path, monkeypatch):
    """``model.linear=both``: every decoder twice (``<name>@stock``, ``<name>@stream``) in one job on
    the same items, each call on its twin's kernel (the model and its draft model swapped for the
    call), rows recording it; greedy's stock twin is the baseline, and each stream twin is checked
    against greedy's stream twin; the report puts the kernels side by side."""
    from hydra import compose, initialize_config_dir

    from conftest import DATA_ROOT
    from experiments.config.schema import register_configs
    from experiments.decoders.registry import CoreDecoder, HFGenerate
    from experiments.job import runner
    from experiments.reporting import report

    seen: list[tuple[str, str, str]] = []
    for cls in (CoreDecoder, HFGenerate):
        def spy(self, job, *args, _original=cls.generate):
            drafts = [kernels.linear_kernel(model) for model, _ in job.assistants.values()]
            seen.append((self.name, kernels.linear_kernel(job.model), *drafts))
            return _original(self, job, *args)
        monkeypatch.setattr(cls, "generate", spy)
    register_configs()
    decoders = ("decoders=[lookahead,hf_pld,{use:hf_assisted,assistant_model:tiny-mistral,num_assistant_tokens:4}]")
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=tiny_llama", "threads=1", "warmup=1", "experiment=mtbench", "dataset.limit=2",
            "experiment.max_new_tokens=16", "decoding.window=3", "decoding.ngram=3", "decoding.guess=3",
            "baseline=hf_greedy", decoders, "model.linear=both",
            f"data_root={DATA_ROOT}", f"results_dir={tmp_path}"])
    threads = torch.get_num_threads()
    try:
        path = runner.run(cfg)
    finally:
        torch.set_num_threads(threads)
    assert "-" in path.name and "@" not in path.name                   # the file keeps the decoders' tag
    rows = report.load_results([path])
    names = ["hf_greedy", "lookahead", "hf_pld", "hf_assisted"]
    assert sorted(set(rows.decoder)) == sorted(f"{n}@{k}" for n in names for k in ("stock", "stream"))
    assert len(rows) == 2 * 2 * 8                                       # items x turns x decoders
    assert (rows.linear == rows.decoder.str.rsplit("@", n=1).str[1]).all()
    assert rows[rows.baseline].decoder.unique().tolist() == ["hf_greedy@stock"]
    assert rows[~rows.baseline].matches_greedy.all()
    # every call (warm-up included) ran on its twin's kernel, the draft model's too
    assert {name for name, *_ in seen} == set(rows.decoder)
    assert all(set(kinds) == {name.rsplit("@", 1)[1]} for name, *kinds in seen), seen
    # the order rotates over all eight twins, so stock and stream calls interleave within an item
    first = rows[(rows.item_id == rows.item_id.iloc[0]) & (rows.turn == 1)].sort_values("order")
    assert first.linear.nunique() == 2
    table = report.kernel_table(report.summarize(rows))
    assert sorted(table.decoder) == sorted(names)
    greedy = table.set_index("decoder").loc["hf_greedy"]
    assert greedy.speedup_stock == 1.0 and greedy.speedup_stream > 0 and greedy["stream/stock"] == greedy.speedup_stream
    assert "Each decoder on both linear kernels" in report.job_summary(path, rows)

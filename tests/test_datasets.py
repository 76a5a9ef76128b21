"""Dataset adapters read the real offline files and build the reference prompts.

Tests of whole-set counts need the full data and skip without it; the rest also run on the
fixtures (tests/fixtures/data, a few items per data set)."""

from __future__ import annotations

import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from experiments.data.datasets import (
    DATASETS,
    LADE_SUMMARY_INSTRUCTION,
    MTBENCH_TEMPERATURE,
    get_dataset,
)
from experiments.data.datasets import default_data_root as _default_data_root

from conftest import DATA_ROOT, FIXTURE_DATA_ROOT, FULL_DATA, needs_full_data  # the full data when present, else tests/fixtures/data


def test_default_data_root_is_next_to_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOKAHEAD_DATA_ROOT", raising=False)
    repo = Path(__file__).resolve().parent.parent
    assert _default_data_root() == repo.parent / "shared" / "data"
    monkeypatch.setenv("LOOKAHEAD_DATA_ROOT", "/somewhere/else")
    assert _default_data_root() == Path("/somewhere/else")


@needs_full_data("mtbench")
def test_mtbench() -> None:
    adapter = get_dataset("mtbench")
    items = adapter.load(DATA_ROOT)
    assert len(items) == 80
    assert [item.item_id for item in items] == [str(i) for i in range(81, 161)]
    first = items[0]
    assert first.turns is not None and len(first.turns) == 2
    assert first.turns[0].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert first.extra["category"] == "writing"
    assert first.extra["temperature"] == MTBENCH_TEMPERATURE["writing"] == 0.7
    assert adapter.format == "chat" and adapter.num_turns(first) == 2
    assert all(item.extra["temperature"] == MTBENCH_TEMPERATURE[item.extra["category"]] for item in items)


def test_mtbench_second_turn_follows_own_answer() -> None:
    adapter = get_dataset("mtbench")
    item = adapter.load(DATA_ROOT, limit=1)[0]
    assert item.turns is not None
    assert adapter.build_messages(item, 0) == [{"role": "user", "content": item.turns[0]}]
    messages = adapter.build_messages(item, 1, ["My blog post."])
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "My blog post."
    assert messages[2]["content"] == "Rewrite your previous response. Start every sentence with the letter A."
    with pytest.raises(ValueError):
        adapter.build_messages(item, 1, [])


@needs_full_data("humaneval")
def test_humaneval_raw_prompt() -> None:
    adapter = get_dataset("humaneval")
    items = adapter.load(DATA_ROOT)
    assert len(items) == 164 and adapter.format == "raw"
    first = items[0]
    assert first.item_id == "HumanEval/0"
    assert "def has_close_elements" in adapter.raw_prompt(first)
    assert first.extra["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in first.extra["test"]
    with pytest.raises(ValueError):
        adapter.build_messages(first)


def test_humaneval_falls_back_to_installed_package(tmp_path: Path) -> None:
    items = get_dataset("humaneval").load(tmp_path, limit=2, source="local")
    assert [item.item_id for item in items] == ["HumanEval/0", "HumanEval/1"]


@needs_full_data("mbpp")
def test_mbpp_sanitized_test_split() -> None:
    items = get_dataset("mbpp").load(DATA_ROOT)
    assert len(items) == 257
    assert all(11 <= int(item.item_id) <= 510 for item in items)
    item = next(i for i in items if i.item_id == "82")
    assert item.turns == [
        "You are an expert Python programmer, and here is your task: Write a function to find the volume of a sphere."
        " Your code should pass these tests:\n\n" + "\n".join(item.extra["test_list"]) + "\n"
    ]
    assert item.extra["test_imports"] == ["import math"]


@needs_full_data("mbpp", variant="full")
def test_mbpp_full_variant() -> None:
    items = get_dataset("mbpp", variant="full").load(DATA_ROOT)
    assert len(items) == 500 and items[0].item_id == "11"
    assert items[0].turns is not None
    assert "remove first and last occurrence of a given character" in items[0].turns[0]
    assert 'assert remove_Occ("hello","l") == "heo"' in items[0].turns[0]
    assert "test_setup_code" in items[0].extra


@needs_full_data("classeval")
def test_classeval_prompts() -> None:
    adapter = get_dataset("classeval")
    items = adapter.load(DATA_ROOT)
    assert len(items) == 100
    first = items[0]
    assert first.item_id == "ClassEval_0"
    assert first.turns is not None
    assert first.turns[0].startswith(
        "Please complete the class AccessGatewayFilter in the following code.\nimport logging\nimport datetime\n"
    )
    assert first.prompt is not None
    # The constructor's first line keeps its own trailing space and LADE appends " \n".
    assert first.prompt.startswith('import logging\nimport datetime\nclass AccessGatewayFilter:  \n    """\n')
    assert "def __init__(self):" in first.prompt
    assert first.extra["test_classes"][0] == "AccessGatewayFilterTestFilter"
    assert first.extra["import_statement"] == ["import logging", "import datetime"]
    assert get_dataset("classeval", prompt_format="raw").format == "raw"


@needs_full_data("cnndm")
def test_cnndm_lade_prompt_and_messages() -> None:
    adapter = get_dataset("cnndm")
    items = adapter.load(DATA_ROOT)
    assert len(items) == 1000
    item = items[0]
    assert item.item_id == "a4942dd663020ca54575471657a0af38d82897d6"
    assert item.reference is not None and item.reference.startswith("Zully Broussard decided to give a kidney")
    assert item.extra["truncated"] is False and item.extra["split"] == "validation"
    assert item.prompt is not None
    assert item.prompt.startswith("[INST] <<SYS>>\nYou are an intelligent chatbot.")
    assert item.prompt.endswith("Briefly summarize the given context. [/INST]\nSummary: ")
    messages = adapter.build_messages(item)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "(CNN)Share, and your gift will be multiplied." in messages[0]["content"]
    assert messages[1]["content"] == LADE_SUMMARY_INSTRUCTION
    folded = adapter.build_messages(item, system_role=False)
    assert len(folded) == 1 and folded[0]["content"].endswith(LADE_SUMMARY_INSTRUCTION)


def test_summary_truncation_is_recorded() -> None:
    item = get_dataset("cnndm", max_prompt_chars=500).load(DATA_ROOT, limit=1)[0]
    assert item.extra["truncated"] is True
    assert item.extra["kept_chars"] <= 500 < item.extra["document_chars"]
    assert item.prompt is not None and len(item.prompt) < 1500


class _WordTokenizer:
    """One token per whitespace-separated word; enough to check the token budget."""

    def __init__(self) -> None:
        self.words: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.words = text.split()
        return list(range(len(self.words)))

    def decode(self, token_ids: list[int]) -> str:
        return " ".join(self.words[i] for i in token_ids)


def test_summary_token_budget() -> None:
    item = get_dataset("xsum", max_prompt_chars=2000, max_prompt_tokens=20, tokenizer=_WordTokenizer()).load(
        DATA_ROOT, limit=1
    )[0]
    assert item.extra["truncated"] is True
    assert item.extra["kept_chars"] < 2000
    assert item.prompt is not None and "The owners said their planned" in item.prompt
    with pytest.raises(ValueError):
        get_dataset("xsum", max_prompt_tokens=20)


def test_xsum_ids_are_strings() -> None:
    items = get_dataset("xsum").load(DATA_ROOT, limit=3)
    assert all(isinstance(item.item_id, str) and item.item_id.isdigit() for item in items)
    assert items[0].extra["split"] == "test"
    assert items[0].reference is not None


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_offset_and_limit(name: str) -> None:
    adapter = get_dataset(name)
    everything = adapter.load(DATA_ROOT)
    assert adapter.load(DATA_ROOT, limit=3, offset=2) == everything[2:5]
    assert adapter.load(DATA_ROOT, limit=0) == []
    assert adapter.load(DATA_ROOT, offset=len(everything)) == []
    with pytest.raises(ValueError):
        adapter.load(DATA_ROOT, offset=-1)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_fixtures_are_a_few_unchanged_items_of_the_full_data(name: str) -> None:
    """tests/fixtures/data holds 3-5 items of every data set, loadable offline; with the full data
    there, each is the same item as in the full set."""
    options = [{"variant": "sanitized"}, {"variant": "full"}] if name == "mbpp" else [{}]
    for option in options:
        fixtures = get_dataset(name, **option).load(FIXTURE_DATA_ROOT, source="local")
        assert 3 <= len(fixtures) <= 5, (name, option, len(fixtures))
        if FULL_DATA:
            full = {item.item_id: item for item in get_dataset(name, **option).load(DATA_ROOT, source="local")}
            assert all(full[item.item_id] == item for item in fixtures), (name, option)


def test_missing_file_names_path_and_hub_id(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as excinfo:
        get_dataset("mtbench").load(tmp_path, source="local")
    message = str(excinfo.value)
    assert str(tmp_path / "mt_bench" / "question.jsonl") in message
    assert "lighteval/mt-bench" in message


def _fake_datasets(monkeypatch: pytest.MonkeyPatch, load_dataset: object) -> None:
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_hub_failure_gives_file_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("no internet")

    _fake_datasets(monkeypatch, offline)
    with pytest.raises(FileNotFoundError) as excinfo:
        get_dataset("cnndm").load(tmp_path)
    message = str(excinfo.value)
    assert str(tmp_path / "cnn_dailymail" / "validation_first1000.jsonl") in message
    assert "abisee/cnn_dailymail" in message and "no internet" in message


def test_hub_fallback_used_when_local_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, ...]] = []

    def hub(path: str, name: str | None, split: str) -> list[dict[str, object]]:
        calls.append((path, name, split))
        return [{"prompt": ["Hi?", "Why?"], "prompt_id": 12345, "category": "stem", "reference": []}]

    _fake_datasets(monkeypatch, hub)
    items = get_dataset("mtbench").load(tmp_path)
    assert calls == [("lighteval/mt-bench", None, "train")]
    assert items[0].turns == ["Hi?", "Why?"] and items[0].item_id == "12345"
    assert items[0].extra["temperature"] == 0.1
    assert get_dataset("mtbench").load(DATA_ROOT, limit=1)[0].item_id == "81"  # local wins when present
    assert len(calls) == 1


def test_get_dataset_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError) as excinfo:
        get_dataset("gsm8k")
    for name in ("mtbench", "cnndm", "xsum", "humaneval", "mbpp", "classeval"):
        assert name in str(excinfo.value)


# ---------------------------------------------------------------------------------------------
# Spec-Bench

SPEC_BENCH_FIRST = {  # category: (question_id, start of turn 1, start of turn 2 or None), from the file
    "writing": ("81", "Compose an engaging travel blog post about a rec", "Rewrite your previous response"),
    "roleplay": ("91", "Pretend yourself to be Elon Musk in all the foll", "How do you like dancing? Can y"),
    "reasoning": ("101", "Imagine you are participating in a race with a g", 'If the "second person" is chan'),
    "math": ("111", "The vertices of a triangle are at points (0, 0),", "What's area of the circle circ"),
    "coding": ("121", "Develop a Python program that reads all the text", "Can you parallelize it?"),
    "extraction": ("131", "Evaluate the following movie reviews on a scale ", "Update your previous reply by "),
    "stem": ("141", "In the field of quantum physics, what is superpo", "What assumptions have you made"),
    "humanities": ("151", "Provide insights into the correlation between ec", "Now, explain them again like I"),
    "translation": ("161", "Translate German to English: Pfandhäuser boomen ", None),
    "summarization": ("241", "Summarize: Hillary Clinton’s security detail arr", None),
    "qa": ("321", "Who played anna in once upon a time?", None),
    "math_reasoning": ("401", "Jen decides to travel to 3 different countries. ", None),
    "rag": ("481", "Some researchers state that forests do not only ", None),
}
SMOLLM2_FRAME = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from experiments.models.loader import load_model

    return load_model("smollm2_135m")[1]


@needs_full_data("specbench")
def test_specbench_reads_the_real_file_and_builds_each_categorys_prompt(smollm2_tokenizer) -> None:
    from experiments.job.runner import prompt_ids
    from experiments.data.datasets import PromptFormat

    adapter = get_dataset("specbench")
    items = adapter.load(DATA_ROOT)
    assert len(items) == 480
    counts = Counter(item.extra["category"] for item in items)
    assert counts == {**{c: 10 for c in list(SPEC_BENCH_FIRST)[:8]}, **{c: 80 for c in list(SPEC_BENCH_FIRST)[8:]}}
    by_id = {item.item_id: item for item in items}
    for category, (item_id, first, second) in SPEC_BENCH_FIRST.items():
        item = by_id[item_id]
        assert item.extra["category"] == category and adapter.num_turns(item) == (2 if second else 1)
        assert adapter.build_messages(item, 0) == [{"role": "user", "content": item.turns[0]}]
        text = smollm2_tokenizer.decode(prompt_ids(adapter, smollm2_tokenizer, PromptFormat.chat, item, 0, ()))
        assert text.startswith(SMOLLM2_FRAME + "<|im_start|>user\n" + first), text[:200]
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        if second:   # turn 2 follows the model's own first answer
            text = smollm2_tokenizer.decode(prompt_ids(adapter, smollm2_tokenizer, PromptFormat.chat, item, 1,
                                                     ("My answer.",)))
            assert f"{item.turns[0]}<|im_end|>\n<|im_start|>assistant\nMy answer.<|im_end|>\n<|im_start|>user\n{second}" \
                in text


@needs_full_data("specbench")
def test_specbench_subsets_spread_over_categories_and_filter_them() -> None:
    adapter = get_dataset("specbench")
    spread = adapter.load(DATA_ROOT, 130, order="spread", seed=0)
    assert Counter(item.extra["category"] for item in spread) == {c: 10 for c in SPEC_BENCH_FIRST}
    assert len({item.extra["category"] for item in spread[:13]}) == 13, "every prefix spans the categories"
    assert [i.item_id for i in adapter.load(DATA_ROOT, 20, order="spread", seed=0)] == [i.item_id for i in spread[:20]]
    assert [i.item_id for i in adapter.load(DATA_ROOT, 20, order="spread", seed=1)] != [i.item_id for i in spread[:20]]
    subset = adapter.load(DATA_ROOT, categories=["translation", "rag"])
    assert len(subset) == 160 and {i.extra["category"] for i in subset} == {"translation", "rag"}
    with pytest.raises(ValueError, match="unknown category 'nope'"):
        adapter.load(DATA_ROOT, categories=["nope"])


def test_specbench_missing_file_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as excinfo:
        get_dataset("specbench").load(tmp_path)
    assert str(tmp_path / "spec_bench" / "question.jsonl") in str(excinfo.value)
    assert "hemingkx/Spec-Bench" in str(excinfo.value)

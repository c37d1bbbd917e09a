"""Needle-in-a-haystack prompts built in real tokens: exact length, needle at an exact token depth.

Two haystacks, both made on this machine from text that ships with Python (nothing is downloaded):

- ``"passkey"``: the passkey retrieval task of Mohtashami & Jaggi (landmark attention, arXiv 2305.16300),
  also used by the YaRN and PI papers: a short instruction, the same filler sentences repeated, one
  needle "The pass key is 71432. Remember it. 71432 is the pass key.", and the question.
- ``"multikey"``: RULER's multi-key idea (Hsieh et al. 2024, arXiv 2404.06654): natural English prose
  (paragraphs of Python's own reference documentation, ``pydoc_data.topics``, code blocks dropped) with
  one needle "One of the special magic numbers for {key} is: {value}." and ``num_distractors`` more
  needles with other keys and values; the question names one key.

A prompt is ``head + filler[:k] + needle + filler[k:F] + tail`` as token ids (ChatML chat, the assistant's
answer prefix already written), where ``F = length - len(head) - len(needle) - len(tail)`` and
``k = round(depth * F)``: ``depth`` 0 puts the needle right after the instruction, 1 right before the
question. Pieces are tokenized separately and concatenated, so the length is exact.

Each trial (``seed``) draws its own value and its own stretch of filler, so trials are independent: a
passkey trial starts the repeated filler at one of ``PASSKEY_CYCLE`` token offsets (records made
before 2026-12-02 always started it at token 0: one haystack for every trial), a multikey trial starts the
prose at one of 20,000 tokens.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

from longctx.checks import positive_int
from longctx.memory import blocks_for_tokens
from longctx.model.tokenizer import DEFAULT_SYSTEM_PROMPT

HAYSTACKS = ("passkey", "multikey")
PASSKEY_CYCLE = 192  # tokens of filler a passkey trial may skip: 8 repetitions of the 24-token filler
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n\n"
)
MULTIKEY_INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the numbers afterwards.\n\n"
)
KEY_WORDS = (
    "amber", "anchor", "badger", "bamboo", "beacon", "canyon", "cedar", "comet", "copper", "crystal",
    "dolphin", "ember", "falcon", "fjord", "garnet", "glacier", "harbor", "hazel", "island", "jasper",
    "lantern", "lemon", "maple", "meadow", "nectar", "orchid", "otter", "pebble", "quartz", "raven",
    "saffron", "spruce", "tundra", "velvet", "walnut", "willow",
)  # fmt: skip


@dataclass(frozen=True)
class NeedlePrompt:
    """One trial's prompt. ``token_ids`` has exactly ``length`` tokens; ``answer_ids`` follow it."""

    token_ids: list[int]
    answer_ids: list[int]
    answer: str
    needle_start: int  # token index of the needle's first token in token_ids
    needle_len: int
    haystack_start: int  # first filler token (depth 0 puts the needle here)
    haystack_len: int  # filler tokens F (needle excluded)
    distractor_starts: list[int] = field(default_factory=list)
    question_start: int = -1  # first token of the question (and the chat template's end); -1: unknown

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def depth_tokens(self) -> int:
        """Filler tokens before the needle (``round(depth * haystack_len)``)."""
        return self.needle_start - self.haystack_start


@lru_cache(maxsize=1)
def natural_text() -> str:
    """English prose from Python's reference documentation (``pydoc_data.topics``), code blocks dropped.

    About 300 K characters, deterministic for a given Python version."""
    from pydoc_data.topics import topics

    paragraphs = []
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            lines = para.split("\n")
            if any(ln.startswith(" ") for ln in lines) or len(para) < 200:
                continue  # code, grammar, tables, headings
            text = " ".join(ln.strip() for ln in lines)
            prose = sum(c.isalpha() or c in " ,.;:'-" for c in text) / len(text)
            if prose > 0.95 and "__" not in text and text.count("*") + text.count("`") < 4:
                paragraphs.append(text)
    return "\n".join(paragraphs)


def _check(length, depth, haystack) -> None:
    if haystack not in HAYSTACKS:
        raise ValueError(f"haystack must be one of {HAYSTACKS}, got {haystack!r}")
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be a number in [0, 1] (0 = start, 1 = end), got {depth!r}")
    positive_int("length", length, what="a positive integer number of tokens")


class HaystackBuilder:
    """Builds ``NeedlePrompt``s with a ``ChatTokenizer`` (``longctx.model.tokenizer.load_tokenizer()``).

    The filler token streams are tokenized once and cached per builder. A tokenizer with a chat template
    (SmolLM2) frames the task as a ChatML user turn; one without (Gemma 3 270M, a base model) as plain text
    after BOS, the question on its own line and the answer's first words after it."""

    def __init__(self, tokenizer, num_distractors: int = 3) -> None:
        self.tok = tokenizer
        self.num_distractors = int(num_distractors)
        self._filler: dict[str, list[int]] = {}
        self.chat = bool(getattr(tokenizer, "chat_template", True))

    def _filler_ids(self, haystack: str, n: int) -> list[int]:
        ids = self._filler.get(haystack)
        if ids is None:
            text = PASSKEY_FILLER * 8 if haystack == "passkey" else natural_text()
            ids = self.tok.encode(text)
            self._filler[haystack] = ids
        reps = blocks_for_tokens(max(0, n), len(ids))  # copies of the filler that hold n tokens
        return (ids * max(1, reps))[:n]

    def _pieces(self, haystack: str, rng: random.Random):
        chat_open = (f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
                     if self.chat else "")
        if haystack == "passkey":
            value = str(rng.randint(10000, 99999))
            needle = f"\nThe pass key is {value}. Remember it. {value} is the pass key.\n"
            question = "\n\nWhat is the pass key?"
            answer_prefix = "The pass key is"
            return chat_open + PASSKEY_INTRO, needle, question, answer_prefix, value, []
        keys = rng.sample(KEY_WORDS, 1 + self.num_distractors)
        values = [str(rng.randint(1000000, 9999999)) for _ in keys]
        needles = [
            f" One of the special magic numbers for {k} is: {v}. " for k, v in zip(keys, values, strict=True)
        ]
        question = (
            f"\n\nWhat is the special magic number for {keys[0]} mentioned in the provided text?"
        )
        answer_prefix = f"The special magic number for {keys[0]} mentioned in the provided text is"
        return chat_open + MULTIKEY_INTRO, needles[0], question, answer_prefix, values[0], needles[1:]

    @staticmethod
    def _place(total: int, k: int, lens: list[int], rng: random.Random) -> list[tuple[int, int]]:
        """Non-overlapping ``(start, len)`` spans for the distractors in a haystack of ``total`` tokens,
        none containing the needle's insertion point ``k`` strictly inside."""
        spans: list[tuple[int, int]] = []
        for n in lens:
            for _ in range(1000):
                s = rng.randrange(0, max(1, total - n + 1))
                if not s < k < s + n and all(s + n <= a or a + m <= s for a, m in spans):
                    spans.append((s, n))
                    break
        return spans

    def needle_value(self, seed: int, haystack: str = "passkey") -> str:
        """The value trial ``seed`` hides (``build(...).answer``), without tokenizing anything."""
        _check(1, 0.0, haystack)
        return self._pieces(haystack, random.Random(f"{haystack}-{seed}"))[4]

    def build(self, length: int, depth: float, seed: int = 0, haystack: str = "passkey") -> NeedlePrompt:
        """A prompt of exactly ``length`` tokens with the needle at token depth ``round(depth * F)``."""
        _check(length, depth, haystack)
        rng = random.Random(f"{haystack}-{seed}")
        head_text, needle_text, question, answer_prefix, value, distractors = self._pieces(haystack, rng)
        head = self.tok.encode(head_text) if self.chat else self.tok.prompt_ids(head_text)
        needle = self.tok.encode(needle_text)
        turn = "<|im_end|>\n<|im_start|>assistant\n" if self.chat else "\n"
        tail = self.tok.encode(question + turn + answer_prefix)
        answer_ids = self.tok.encode(" " + value)
        fixed = len(head) + len(needle) + len(tail) + sum(len(self.tok.encode(d)) for d in distractors)
        F = int(length) - fixed  # filler tokens
        if F < 0:
            raise ValueError(
                f"length {length} is too short for the {haystack} prompt: the instruction, needle(s) and "
                f"question alone take {fixed} tokens"
            )
        d_ids = [self.tok.encode(d) for d in distractors]
        total = F + sum(map(len, d_ids))  # haystack tokens = filler + distractors
        k = round(depth * total)  # haystack tokens before the needle
        spans = self._place(total, k, [len(d) for d in d_ids], rng)
        # each trial its own text
        offset = rng.randrange(0, 20000 if haystack == "multikey" else PASSKEY_CYCLE)
        filler = self._filler_ids(haystack, F + offset)[offset:]
        body, it = [], iter(filler)
        for (start, _), d in sorted(zip(spans, d_ids, strict=True)):
            body += [next(it) for _ in range(start - len(body))] + d
        body += list(it)
        Fh = len(body)
        ids = head + body[:k] + needle + body[k:] + tail
        assert len(ids) == length, (len(ids), length)
        return NeedlePrompt(
            token_ids=ids, answer_ids=answer_ids, answer=value, needle_start=len(head) + k,
            needle_len=len(needle), haystack_start=len(head), haystack_len=Fh,
            distractor_starts=sorted(len(head) + s + (len(needle) if s >= k else 0) for s, _ in spans),
            question_start=length - len(tail),
        )

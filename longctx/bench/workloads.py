"""Benchmark workloads with prompts sized in real tokens of the SmolLM2 tokenizer.

The source's script sized prompts as ``"lorem ipsum " * (n // 2)``, assuming two tokens per repeat; SmolLM2's
tokenizer spends 5, so its "8192-token" prompt has 20,491 tokens. Here every prompt is built to a token
count measured with the tokenizer (chat template included for chat requests), and each request carries its
measured ``prompt_tokens``.

A request is a plain dict: ``{"messages" | "prompt", "max_tokens", "kind", "prompt_tokens", "expected"?}``.
- ``chat``: a short user turn (default 64 tokens) asking for a short answer (default 32 tokens).
- ``needle``: a haystack of filler sentences with "The secret code is NNNN." at a seeded depth, then the
  question; ``expected`` is the code, so answers are checked.
- ``long-prefill``: a long document (default 2048 tokens) to summarize in a few tokens: the request that
  stalls everyone else's decode on a monolithic server.
- ``shared-prefix``: one common system prompt of ``prefix_tokens`` tokens (default 1024: the templated system
  turn, measured), then a distinct short question per request, so a server with prefix caching computes
  the system prompt once; the system prompt lists door codes and each question asks one (``expected``), so
  answers are checked. Each request carries its measured ``prefix_tokens``.
"""

from __future__ import annotations

import random

WORKLOADS = ("chat", "needle", "long-prefill", "shared-prefix")
DEFAULTS = {"chat": (64, 32), "needle": (512, 12), "long-prefill": (2048, 8), "shared-prefix": (None, 12)}
DEFAULT_PREFIX_TOKENS = 1024  # shared-prefix: the common system prompt, in tokens
DOORS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")

FILLER_SENTENCES = (
    "The river bends twice before it reaches the old mill at the edge of town.",
    "Most of the orchard was planted in spring, when the ground was still soft.",
    "A narrow staircase leads from the kitchen to a room full of maps.",
    "The committee met on Tuesday and postponed the vote until next month.",
    "Fresh bread was delivered every morning to the houses along the harbour.",
    "Cold air from the mountains kept the valley cool through the summer.",
    "The library closes early on Fridays so that the staff can sort returns.",
    "Several birds nested under the bridge, safe from the wind and the rain.",
    "Her notebook listed every train that stopped at the small station.",
    "The market square fills with stalls of fruit, cloth and pottery each week.",
    "An old clock above the door has run five minutes slow for years.",
    "They repainted the boat in bright blue before the autumn regatta.",
    "The museum keeps its oldest coins in a dim room at the back.",
    "Children walked to school along a path lined with tall poplars.",
    "The baker tried a new recipe with walnuts, honey and a little salt.",
    "On clear nights the lighthouse beam sweeps across the whole bay.",
)


def count_chat_tokens(tokenizer, user_text: str) -> int:
    return len(tokenizer.encode_chat(user_text))


def filler_text(num_tokens: int, tokenizer, seed: int = 0) -> str:
    """Filler sentences whose tokenization has at most ``num_tokens`` tokens (within a word of it)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    rng = random.Random(seed)
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words))) < num_tokens:
        words += rng.choice(FILLER_SENTENCES).split()
    lo, hi = 0, len(words)  # the most words whose text fits in num_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(" ".join(words[:mid]))) <= num_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def _chat_request(
    tokenizer, body: str, question: str, prompt_tokens: int, max_tokens: int, kind: str, **extra
) -> dict:
    """A chat request whose templated prompt has about ``prompt_tokens`` tokens (measured)."""
    overhead = count_chat_tokens(tokenizer, question)
    if prompt_tokens < overhead:
        raise ValueError(
            f"prompt_tokens={prompt_tokens} is less than the chat template and question alone "
            f"({overhead} tokens)"
        )
    text = (
        filler_text(max(0, prompt_tokens - overhead - 1), tokenizer, extra.pop("seed", 0))
        if not body
        else body
    )
    content = f"{text}\n{question}" if text else question
    req = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "kind": kind}
    req["prompt_tokens"] = count_chat_tokens(tokenizer, content)
    req.update(extra)
    return req


def needle_prompt(tokenizer, prompt_tokens: int, code: str, depth: float, seed: int = 0) -> str:
    """A haystack of about ``prompt_tokens`` chat tokens with the needle at ``depth`` (0 = start, 1 = end)."""
    question = "What is the secret code? Answer with the number only."
    needle = f"The secret code is {code}."
    budget = prompt_tokens - count_chat_tokens(tokenizer, question) - len(tokenizer.encode(" " + needle)) - 2
    if budget < 0:
        raise ValueError(
            f"prompt_tokens={prompt_tokens} is too short for the chat template, question and needle"
        )
    hay = filler_text(max(0, budget), tokenizer, seed).split(". ")
    at = round(depth * len(hay))
    hay.insert(at, needle.rstrip("."))
    return ". ".join(hay).strip() + "\n" + question


def _system_turn_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode_chat([{"role": "system", "content": text}], add_generation_prompt=False))


def shared_prefix_workload(num_prompts: int, tokenizer, prefix_tokens: int, max_tokens: int,
                           seed: int = 0) -> list[dict]:
    """``num_prompts`` chat requests that share one system prompt of at most ``prefix_tokens`` tokens (the
    templated system turn, measured) and differ in their question (request number and door)."""
    rng = random.Random(seed)
    codes = {door: str(rng.randrange(1000, 10000)) for door in DOORS}
    facts = " ".join(f"The code of the {door} door is {code}." for door, code in codes.items())
    head = "You are a helpful assistant. Answer from these notes.\n"
    fixed = _system_turn_tokens(tokenizer, head + "\n" + facts)
    if prefix_tokens < fixed:
        raise ValueError(
            f"prefix_tokens={prefix_tokens} is less than the system prompt's notes alone ({fixed} tokens)"
        )
    system = head + filler_text(max(0, prefix_tokens - fixed - 2), tokenizer, seed) + "\n" + facts
    measured = _system_turn_tokens(tokenizer, system)
    out = []
    for i in range(num_prompts):
        door = DOORS[i % len(DOORS)]
        question = f"Request {i}: what is the code of the {door} door? Answer with the number only."
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        out.append({"messages": messages, "max_tokens": max_tokens, "kind": "shared-prefix",
                    "prompt_tokens": len(tokenizer.encode_chat(messages)), "prefix_tokens": measured,
                    "expected": codes[door]})
    return out


def build_workload(
    name: str, num_prompts: int, tokenizer, prompt_tokens: int | None = None, max_tokens: int | None = None,
    seed: int = 0, prefix_tokens: int | None = None,
) -> list[dict]:
    """``num_prompts`` requests of workload ``name`` (one of ``WORKLOADS``), seeded. ``prefix_tokens`` sizes
    the common system prompt of ``shared-prefix`` (only there; its questions are short, so no
    ``prompt_tokens``)."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {name!r}")
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if prefix_tokens is not None and name != "shared-prefix":
        raise ValueError(f"prefix_tokens applies to the shared-prefix workload only, not {name!r}")
    default_prompt, default_max = DEFAULTS[name]
    max_tokens = default_max if max_tokens is None else int(max_tokens)
    if name == "shared-prefix":
        if prompt_tokens is not None:
            raise ValueError(
                "the shared-prefix workload is sized by prefix_tokens (the common system prompt), "
                "not prompt_tokens"
            )
        prefix_tokens = DEFAULT_PREFIX_TOKENS if prefix_tokens is None else int(prefix_tokens)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        return shared_prefix_workload(num_prompts, tokenizer, prefix_tokens, max_tokens, seed)
    prompt_tokens = default_prompt if prompt_tokens is None else int(prompt_tokens)
    if prompt_tokens < 16 or max_tokens < 1:
        raise ValueError(
            f"prompt_tokens must be >= 16 and max_tokens >= 1, got {prompt_tokens}, {max_tokens}"
        )
    rng = random.Random(seed)  # one generator for the whole workload: the needles' codes and depths
    return [_request(name, tokenizer, prompt_tokens, max_tokens, seed + i, rng) for i in range(num_prompts)]


_QUESTIONS = {"chat": "Describe this scene in one short sentence.",
              "long-prefill": "Summarize the text above in five words."}


def _request(
    name: str, tokenizer, prompt_tokens: int, max_tokens: int, seed: int, rng: random.Random
) -> dict:
    """One request of the ``chat``, ``needle`` or ``long-prefill`` workload (``seed``: its filler text)."""
    if name != "needle":
        return _chat_request(tokenizer, "", _QUESTIONS[name], prompt_tokens, max_tokens, name, seed=seed)
    code = str(rng.randrange(1000, 10000))
    text = needle_prompt(tokenizer, prompt_tokens, code, rng.random(), seed)
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "kind": name,
            "prompt_tokens": count_chat_tokens(tokenizer, text), "expected": code}

"""Why a passkey needle at depth 1 (right before the question) is lost: one prompt, changed one thing at a
time.

``depth_one_variants(builder, length, seed)`` returns the depth-1 passkey prompt of ``HaystackBuilder.build``
and variants that each change ONE thing about it, with the same needle value and filler:

- ``"depth 1"``: as built: ``... filler cut mid-sentence`` + needle + ``"\\n\\nWhat is the pass key?"``;
- ``"depth 0.5"``: the same trial with the needle in the middle (the reference that works);
- ``"32 filler tokens between"``: the last 32 filler tokens moved from before the needle to after it (the
  needle 32 tokens further from the question; nothing else changes, the length neither);
- ``"filler ends a sentence"``: the filler before the needle cut back to its last full stop (the needle no
  longer interrupts a sentence; the prompt is a few tokens shorter);
- ``"junction re-tokenized"``: the needle's final newline and the question's two newlines,
  tokenized separately by the builder (``"\\n"`` then ``"\\n\\n"``), re-tokenized together (``"\\n\\n\\n"``);
- ``"no blank lines"``: the question's ``"\\n\\n"`` replaced by a space;
- ``"no answer prefix"``: the assistant turn starts empty instead of with ``"The pass key is"``.

Each variant is a ``NeedlePrompt`` whose ``needle_start`` and ``question_start`` are where its needle and
question really are. Scoring is the usual one (``NiahRunner.score``: containment of the value)."""

from __future__ import annotations

import dataclasses

from longctx.evals.haystack import HaystackBuilder, NeedlePrompt

QUESTION = "\n\nWhat is the pass key?"
ANSWER_PREFIX = "The pass key is"
VARIANTS = (
    "depth 1", "depth 0.5", "32 filler tokens between", "filler ends a sentence", "junction re-tokenized",
    "no blank lines", "no answer prefix",
)


def depth_one_variants(builder: HaystackBuilder, length: int, seed: int) -> dict[str, NeedlePrompt]:
    """``{variant: prompt}`` for one passkey trial (see the module docstring)."""
    tok = builder.tok
    p = builder.build(length, 1.0, seed=seed, haystack="passkey")
    ids, ns, nl = p.token_ids, p.needle_start, p.needle_len
    before, needle, tail = ids[:ns], ids[ns : ns + nl], ids[ns + nl :]
    tail_text = tok.decode(tail, skip_special_tokens=False)
    if not tail_text.startswith(QUESTION) or ANSWER_PREFIX not in tail_text:
        raise ValueError(f"unexpected passkey tail {tail_text!r}: the builder's question or prefix changed")

    def variant(token_ids, needle_start, question_start):
        return dataclasses.replace(p, token_ids=list(token_ids), needle_start=needle_start,
                                   question_start=question_start)

    out = {"depth 1": p, "depth 0.5": builder.build(length, 0.5, seed=seed, haystack="passkey")}
    gap = 32
    out["32 filler tokens between"] = variant(
        before[:-gap] + needle + before[-gap:] + tail, ns - gap, p.question_start
    )
    filler_text = tok.decode(before[p.haystack_start :])
    cut = filler_text.rfind(". ")
    if cut < 0:
        raise ValueError(
            f"no full stop in the {len(before) - p.haystack_start}-token filler: use a longer prompt"
        )
    clean = before[: p.haystack_start] + tok.encode(filler_text[: cut + 1])
    out["filler ends a sentence"] = variant(clean + needle + tail, len(clean), len(clean) + nl)
    joined = tok.encode(tok.decode(needle + tail, skip_special_tokens=False))
    out["junction re-tokenized"] = variant(before + joined, ns, ns + nl - 1)
    no_blank = tok.encode(tail_text.replace(QUESTION, " " + QUESTION.strip(), 1))
    out["no blank lines"] = variant(before + needle + no_blank, ns, ns + nl)
    no_prefix = tok.encode(tail_text[: tail_text.rindex(ANSWER_PREFIX)])
    out["no answer prefix"] = variant(before + needle + no_prefix, ns, ns + nl)
    assert list(out) == list(VARIANTS)
    return out

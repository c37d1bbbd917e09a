"""How a needle trial is scored: does the generated answer contain the needle's value as a whole number?

``contains_answer(output, answer)`` splits the generated text into maximal runs of digits and asks whether
one of them *is* the value: ``"1056549".``, ``1056549.`` and ``The pass key is 1056549`` all count;
``10565490`` and ``105 6549`` do not. RULER (Hsieh et al. 2024) scores its needle tasks by string match,
whether the reference appears in the lower-cased prediction; comparing whole digit runs is that match made
strict enough that a longer number holding the value inside it is not a hit. The second, continuous score of
a trial is the teacher-forced log-probability of the answer's tokens (``longctx.evals.niah``).

``rescore_record(data)`` re-scores a recorded table (``{"meta", "rows"}``) from each row's recorded output:
the verdict the rows were recorded with moves to ``correct_exact`` (the old rule: the greedy tokens right
after the answer prefix are exactly the answer's), ``correct`` becomes the containment verdict.
"""

from __future__ import annotations

import datetime
import re

SCORING = ("contains: the generated answer contains the needle's value as a whole number (a maximal run of "
           "digits equal to it)")
_DIGITS = re.compile(r"\d+")


def _check_value(answer: str) -> str:
    answer = str(answer)
    if not answer.isdigit():
        raise ValueError(f"a needle's value must be a string of digits, got {answer!r}")
    return answer


def contains_answer(output: str, answer: str) -> bool:
    """True when ``answer`` (digits) is one of the maximal digit runs of ``output``."""
    return _check_value(answer) in _DIGITS.findall(str(output))


def answer_closed(output: str, answer: str) -> bool:
    """True once ``output`` holds ``answer`` as a digit run already followed by a non-digit: no further
    token can change the verdict (a decoder may stop there)."""
    answer = _check_value(answer)
    return any(m.group() == answer and m.end() < len(output) for m in _DIGITS.finditer(str(output)))


def rescore_record(data: dict, answer_of=None) -> int:
    """Re-score ``data["rows"]`` in place by ``contains_answer``; returns how many verdicts changed.

    A row without ``answer`` gets ``answer_of(row)`` (e.g. the passkey value its seed draws). The first
    re-scoring keeps the recorded verdict as ``correct_exact``; re-scoring again changes nothing."""
    changed = 0
    for row in data["rows"]:
        if "answer" not in row:
            if answer_of is None:
                raise ValueError(f"a row has no 'answer' and no answer_of was given: {sorted(row)}")
            row["answer"] = str(answer_of(row))
        row.setdefault("correct_exact", bool(row["correct"]))
        verdict = contains_answer(row["output"], row["answer"])
        changed += verdict != bool(row["correct"])
        row["correct"] = verdict
    meta = data.setdefault("meta", {})
    if meta.get("scoring") != SCORING:
        meta["scoring"] = SCORING
        meta["rescored"] = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "from": "recorded outputs (no rerun); the recorded verdict (exact first tokens) is kept as "
            "correct_exact",
            "verdicts_changed": changed,
        }
    return changed

"""What a failed *value* answer is told: which coarse region of the number line the expected value is in.

For the learner's answer `got`, the expected values it could fail against are cut into regions: the
direction (too large, too small, the wrong sign) times a band of the ratio got / expected ("by less than
10 %", "about 2x", "about 4x", "roughly 1000x", ...), and for integers "by 1 to 3". The message names the
region that holds the expected value, and the region's classic slip when it has one (about 1000x: a unit
slip). Every region is at least six tolerance widths wide (an integer region holds at least three
integers): narrower regions (near the tolerance, near zero, with a large tolerance, for small integers)
are merged with a neighbour and described more coarsely. The regions depend only on `got` and the
tolerance, never on the expected value, so whatever a message says, it says it for a stretch of expected
values wider than the tolerance: no arithmetic on it can recover the expected value.
"""

import functools

from longctx.grading._plain import FLOAT

INF = FLOAT("inf")
_ROOT10 = 3.1622776601683795
# edges of the bands of m = max(ratio, 1 / ratio), and their words
_EDGES = [1.0, 1.1, 1.5, 2.5, 3.5, 6.0, 9.5, 10 * _ROOT10, 100 * _ROOT10, 1000 * _ROOT10] + \
    [_ROOT10 * 10.0 ** k for k in (4, 5, 6, 7, 8, 9, 10, 11)] + [INF]
_WORDS = ["{w}, by less than 10 %", "{w}, by 10 % to 50 %", "about 2x {w}", "about 3x {w}", "about 4x {w}",
          "about 8x {w}", "roughly 10x {w}", "roughly 100x {w}", "roughly 1000x {w}"] + \
    [f"roughly 10^{k}x {{w}}" for k in (4, 5, 6, 7, 8, 9, 10, 11)] + ["roughly 10^12x {w} or more"]
_SLIPS = {
    0: "a few per cent off: MiB and MB mixed up (2^20/10^6 = 1.049), or GiB and GB (2^30/10^9 = 1.074)?",
    2: "a factor of 2: the causal-mask halving of attention FLOPs, K and V counted once instead of twice, "
       "2 bytes per fp16 value, or 2 FLOPs per multiply-add?",
    3: "a factor of 3: query heads vs KV heads (grouped-query attention)?",
    4: "a factor of 4: fp32 (4 bytes) vs 1 byte, or two factors of 2 at once?",
    5: "a factor of 8: bits vs bytes?",
    8: "a factor of about 1000: a unit slip (ms vs s, bytes vs KB, GB vs TB; or 1024: KiB vs bytes)?",
    11: "a factor of about 10^6: a unit slip (bytes vs MB, us vs s; or 2^20: bytes vs MiB)?",
    14: "a factor of about 10^9: a unit slip (FLOPs vs GFLOPs, bytes vs GB, ns vs s; or 2^30: bytes vs GiB)?",
}
ROUNDING = "check the rounding (floor or ceiling) and whether the count includes both ends"


def _t_regions(rel, a):
    """Regions of t = expected / got as (lo, hi, label), label = (family, side, first band, end band)."""
    out = []
    n = len(_EDGES) - 1
    for i in range(n):
        lo_m, hi_m = _EDGES[i], _EDGES[i + 1]
        out.append((1.0 / hi_m, 1.0 / lo_m, ("same", "large", i, i + 1)))     # |expected| < |got|
        out.append((lo_m, hi_m, ("same", "small", i, i + 1)))
        out.append((-1.0 / lo_m, -1.0 / hi_m, ("sign", "large", i, i + 1)))
        out.append((-hi_m, -lo_m, ("sign", "small", i, i + 1)))
    # the passing zone |1 - t| <= max(rel |t|, a), cut out
    p_lo = 1.0 - a if 1.0 - a < 1.0 / (1.0 + rel) else 1.0 / (1.0 + rel)
    p_hi = 1.0 + a if rel >= 1.0 or 1.0 + a > 1.0 / (1.0 - rel) else 1.0 / (1.0 - rel)
    return _cut(out, p_lo, p_hi)


def _cut(regions, lo, hi):
    """`regions` with [lo, hi] removed."""
    out = []
    for r_lo, r_hi, label in regions:
        if r_lo < lo:
            out.append((r_lo, r_hi if r_hi < lo else lo, label))
        if r_hi > hi:
            out.append((r_lo if r_lo > hi else hi, r_hi, label))
    return out


def _merge(a, b):
    if a[0] == b[0] and a[1] == b[1] and a[0] != "offset":
        return (a[0], a[1], a[2] if a[2] < b[2] else b[2], a[3] if a[3] > b[3] else b[3])
    return ("mixed", None, 0, 0)


def _integers(region):
    lo, hi, _ = region
    if lo == -INF or hi == INF:
        return 3
    return FLOAT.__floor__(hi - 1e-9) - FLOAT.__ceil__(lo) + 1


def _narrow(region, rel, abs_, integer):
    lo, hi, _ = region
    if lo == -INF or hi == INF:
        return False
    if integer:
        return _integers(region) < 3
    mag = hi if hi > -lo else -lo
    width = rel * mag if rel * mag > abs_ else abs_
    return hi - lo < 6.0 * width


def _side_regions(regions, rel, abs_, integer, outward):
    """Merge narrow regions (sorted, contiguous, on one side of the passing zone) into neighbours;
    `outward` is -1 when index 0 is the far end, +1 when the last index is."""
    regions = list(regions)
    while True:
        narrow = [i for i, r in enumerate(regions) if _narrow(r, rel, abs_, integer)]
        if not narrow or len(regions) == 1:
            return regions
        i = min(narrow, key=lambda k: regions[k][1] - regions[k][0])
        j = i + outward if 0 <= i + outward < len(regions) else i - outward
        a, b = (i, j) if i < j else (j, i)
        regions[a:b + 1] = [(regions[a][0], regions[b][1], _merge(regions[a][2], regions[b][2]))]


@functools.lru_cache(maxsize=64)  # a test probing many expected values for one answer builds them once
def regions(got, rel, abs_, integer):
    """Regions of expected values outside the passing zone of `got` (got != 0), sorted, as (lo, hi, label)."""
    mag = got if got > 0.0 else -got
    out = [((lo * got, hi * got) if got > 0.0 else (hi * got, lo * got)) + (label,)
           for lo, hi, label in _t_regions(rel, (0.5 if integer else abs_) / mag)]
    if integer:
        for lo, side in ((got - 3.5, "large"), (got + 0.5, "small")):
            out = _cut(out, lo, lo + 3.0) + [(lo, lo + 3.0, ("offset", side, 0, 0))]
    out = sorted((r for r in out if r[0] < r[1] and not (integer and _integers(r) == 0)), key=lambda r: r[0])
    below = [r for r in out if r[1] <= got]
    above = [r for r in out if r[0] >= got]
    return tuple(_side_regions(below, rel, abs_, integer, -1) + _side_regions(above, rel, abs_, integer, 1))


def _locate(regions_, expected):
    """The region holding `expected` (a region of the same sign first at a shared edge, e.g. at 0)."""
    best, gap = regions_[0], INF
    for region in regions_:
        lo, hi, label = region
        d = lo - expected if expected < lo else (expected - hi if expected > hi else 0.0)
        if d < gap or d == gap == 0.0 and label[0] == "same":
            best, gap = region, d
    return best


def _range_words(first, end, words):
    if end - first == 1:
        return _WORDS[first].format(w=words)
    lo, hi = _EDGES[first], _EDGES[end]
    if hi == INF:
        return words if lo == 1.0 else f"more than {lo:g}x {words}"
    if hi <= 2.0:
        return f"{words}, by less than {(hi - 1) * 100:.0f} %" if lo == 1.0 else \
            f"{words}, by {(lo - 1) * 100:.0f} % to {(hi - 1) * 100:.0f} %"
    return f"{words}, by less than {hi:g}x" if lo == 1.0 else f"between {lo:g}x and {hi:g}x {words}"


def describe(got, expected, rel, abs_, integer):
    """(what the region of `expected` says, its slip hint or '') for an answer `got` that failed."""
    if got == 0:
        return f"{'too small' if expected > 0 else 'too large'}: it should not be zero", ""
    family, side, first, end = _locate(regions(got, rel, abs_, integer), expected)[2]
    numeric = "too large" if got > expected else "too small"
    if family == "mixed":
        return numeric, ""
    if family == "offset":
        return f"{numeric}, by 1 to 3: {ROUNDING}", ""
    words = "too large" if side == "large" else "too small"
    slip = _SLIPS.get(first, "") if end - first == 1 else ""
    if family == "same":
        return _range_words(first, end, words + (" in magnitude" if got < 0 else "")), slip
    if first == 0:
        return "of the wrong sign (its size is within 10 % of the right one)", "the sign is flipped?"
    return f"of the wrong sign, and {_range_words(first, end, words)} in size", slip

"""Replies stuck in a repetition loop: one rule for the verifier's replies that evaluate measures
tau on (a loop there is the verifier's) and for the replies regenerate writes as training data
(a loop there is ours to keep, drop or trim: regenerate --loops).

A loop: the reply ran to the token budget without ending its turn, and over its last LOOP_WINDOW
tokens at least LOOP_MATCH of them equal the token one period earlier, for some period of
1..LOOP_WINDOW/2 tokens (`1.1.1.1.`, a sentence said again and again; a numbered list whose items
of four tokens or more repeat but for the number matches 75% or more).
"""

from __future__ import annotations

LOOP_WINDOW = 32
LOOP_MATCH = 0.75


def loop_period(generated: list[int], window: int = LOOP_WINDOW, min_match: float = LOOP_MATCH) -> int | None:
    """The shortest period the reply's last `window` tokens repeat with (the rule above), or None.
    The caller says whether the reply ran to its budget (is_looping does, from its last token)."""
    for period in range(1, window // 2 + 1):
        if len(generated) < window + period:
            break
        tail = generated[-window - period :]
        same = sum(tail[i + period] == tail[i] for i in range(window))
        if same >= min_match * window:
            return period
    return None


def is_looping(generated: list[int], eos: set[int], window: int = LOOP_WINDOW, min_match: float = LOOP_MATCH) -> bool:
    """Whether a reply is stuck in a repetition loop (the rule above): a reply whose last token
    ends the turn never is."""
    if not generated or generated[-1] in eos:
        return False
    return loop_period(generated, window, min_match) is not None


def trimmed_length(generated: list[int], period: int, window: int = LOOP_WINDOW, min_match: float = LOOP_MATCH) -> int:
    """How many tokens of a looping reply to keep: up to where the repetition began (walking back
    while every `window` tokens still repeat the period at `min_match`), plus one period (the
    repeated span said once)."""
    same = [generated[j] == generated[j + period] for j in range(len(generated) - period)]
    start = max(0, len(same) - window)
    run = sum(same[start : start + window])
    while start > 0:
        run += same[start - 1] - (same[start - 1 + window] if start - 1 + window < len(same) else 0)
        if run < min_match * window:
            break
        start -= 1
    while start < len(same) and not same[start]:  # the window's tolerance walked past the loop's first repeat
        start += 1
    return min(len(generated), start + period)

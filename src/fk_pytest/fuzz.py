"""Hypothesis settings for shape fuzzing, and shared strategy pieces.

Two profiles: ``ci`` (derandomised, few examples, no shrinking: the same shapes every run) and
``thorough`` (more examples, shrinking on). ``--fk-seed`` turns derandomisation off and seeds the
draws, so a leaderboard run uses shapes a candidate has never seen.
"""
from __future__ import annotations

from typing import Optional, Sequence

from hypothesis import HealthCheck, Phase, seed as hypothesis_seed, settings
from hypothesis import strategies as st

# Examples per fuzz test, per profile. The CPU draws fewer: each interpreted example costs seconds.
# ``--fk-thorough`` keeps the full profile's 25; the default draws FULL_QUICK_EXAMPLES there.
EXAMPLES = {"cpu": 4, "full": 25}
FULL_QUICK_EXAMPLES = 8

# Token counts production produces that kernels get wrong: 1, just off powers of two, odd sizes.
AWKWARD_TOKENS = (1, 2, 3, 5, 7, 31, 33, 127, 129, 255, 257, 1000)


def default_examples(profile: str, thorough: bool = False) -> int:
    return FULL_QUICK_EXAMPLES if profile == "full" and not thorough else EXAMPLES[profile]


def fuzz_settings(profile: str, examples: Optional[int], seed: Optional[int], thorough_mode: bool = False):
    """A decorator applying the settings (and seed) for one fuzz run."""
    thorough = profile == "full"
    config = settings(
        max_examples=examples or default_examples(profile, thorough_mode),
        deadline=None,
        database=None,
        derandomize=seed is None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink) if thorough
        else (Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )

    def apply(fn):
        fn = config(fn)
        return hypothesis_seed(seed)(fn) if seed is not None else fn

    return apply


def token_counts(max_tokens: int) -> st.SearchStrategy[int]:
    awkward = [t for t in AWKWARD_TOKENS if t <= max_tokens]
    return st.one_of(st.sampled_from(awkward), st.integers(1, max_tokens))


def real_or_near(widths: Sequence[int]) -> st.SearchStrategy[int]:
    """A real width, or a nearby multiple of 8 (hard-coded widths fail on these)."""
    widths = sorted(set(widths))
    near = st.builds(lambda w, d: max(8, w + 8 * d), st.sampled_from(widths), st.integers(-4, 4))
    return st.one_of(st.sampled_from(widths), near)

"""The samplers' options (no torch here: composing a run imports this module)."""

from dataclasses import dataclass


@dataclass
class DifficultyPoolConfig:
    """prime-rl's pools: a prompt's recent pass rate files it as easy, medium or hard, each pool drawn with its share.
    A prompt never scored is medium."""

    window: int = 4  # a prompt's pass rate is that of its completions in its last `window` groups
    correct_threshold: float = 1.0  # a completion passes when its reward reaches this (as eval.correct_threshold)
    easy_above: float = 0.7  # a pass rate above this is easy
    hard_below: float = 0.3  # below this, hard; between the two, medium
    easy_share: float = 0.1  # of each draw; a pool too small for its share leaves the rest to the others
    medium_share: float = 0.8  # of each draw, from the medium pool (which holds the prompts never scored)
    hard_share: float = 0.1  # of each draw, from the hard pool; the three shares add up to 1
    # A prompt whose last group all passed or all failed sits out this many passes over the dataset (a pass: as
    # many prompts drawn as the dataset holds); 0: never.
    set_aside_passes: int = 1  # passes over the dataset a solved or unsolvable prompt sits out; 0: never


@dataclass
class CurriculumConfig:
    """Easiest first, by a dataset column: draws come from the easiest `start_share` of the prompts, a share that
    grows linearly to all of them over the first `full_after` prompts drawn."""

    column: str | None = None  # the dataset column that orders prompts, smallest first (sampler.column=difficulty)
    descending: bool = False  # largest first instead
    start_share: float = 0.25  # the easiest share of the prompts that draws come from at first
    full_after: int | None = None  # prompts drawn until every prompt may be drawn; None: one pass over the dataset


@dataclass
class SkipFlatGroupsConfig:
    """Shuffled passes, as uniform's, that skip each prompt whose last `groups` groups all had rewards of zero
    variance (nothing to learn from them): the cheap, before-generation complement of DAPO's dynamic sampling."""

    groups: int = 2  # a prompt is skipped once this many of its last groups in a row had no spread

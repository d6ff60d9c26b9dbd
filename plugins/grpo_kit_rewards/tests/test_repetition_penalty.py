import pytest

from grpo_kit_rewards.configs import RepetitionPenaltyConfig
from grpo_kit_rewards.repetition_penalty import RepetitionPenalty


def penalty(completion_ids=None, completions=None, **options):
    reward = RepetitionPenalty(RepetitionPenaltyConfig(**options))
    completions = completions or [""] * len(completion_ids)
    return reward(["q"] * len(completions), completions, completion_ids or [[]] * len(completions))


def test_trl_documented_example():
    assert penalty([[1, 2, 3, 4], [5, 5, 5, 5, 5]], ngram_size=2, max_penalty=-1.0) == [0.0, -0.75]


def test_token_ngrams():
    # trigrams of 1 2 1 2 1 2: (1,2,1) (2,1,2) (1,2,1) (2,1,2), two distinct of four
    scores = penalty([[1, 2, 1, 2, 1, 2], [1, 2], [], [1, 2, 3, 4]], max_penalty=-0.5)
    assert scores == [pytest.approx(-0.25), 0.0, 0.0, 0.0]
    assert str(scores[3]) == "0.0"  # not -0.0 in the logs


def test_word_ngrams_as_open_r1():
    completions = ["The cat the CAT the cat", "one two", "all different words here"]
    # bigrams of the cat the cat the cat: five, two distinct
    assert penalty(completions=completions, unit="words", ngram_size=2) == [pytest.approx(-0.6), 0.0, 0.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_penalty": 0.5}, "max_penalty must be <= 0"),
        ({"ngram_size": 0}, "ngram_size must be >= 1"),
        ({"unit": "chars"}, "unit must be one of tokens, words"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        RepetitionPenalty(RepetitionPenaltyConfig(**options))

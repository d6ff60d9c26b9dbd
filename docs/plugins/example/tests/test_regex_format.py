"""The regex_format reward: whole-completion and anywhere matches, chat completions, a bad pattern's message."""

import pytest

from grpo_kit_example.regex_format import RegexFormat, RegexFormatConfig


def test_the_whole_completion_must_match_by_default():
    reward = RegexFormat(RegexFormatConfig())
    assert reward(["1+2="] * 4, ["3", " 12\n", "3 apples", ""], [[]] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_a_match_anywhere():
    reward = RegexFormat(RegexFormatConfig(pattern=r"<answer>.*</answer>", full_match=False))
    assert reward(["q", "q"], ["so <answer>4</answer>.", "4"], [[], []]) == [1.0, 0.0]


def test_chat_completions_are_judged_by_their_last_message():
    prompts = [[{"role": "user", "content": "?"}]] * 2
    completions = [[{"role": "assistant", "content": "42"}], [{"role": "assistant", "content": "forty-two"}]]
    assert RegexFormat(RegexFormatConfig())(prompts, completions, [[], []]) == [1.0, 0.0]


def test_a_bad_pattern_says_which_option_and_how_to_fix_it():
    with pytest.raises(ValueError, match=r"reward.regex_format.pattern='\(' is not a regular expression"):
        RegexFormat(RegexFormatConfig(pattern="("))

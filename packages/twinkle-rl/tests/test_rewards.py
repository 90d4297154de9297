"""Rewards read the completion from the last assistant message and the ground truth from
user_data, as the preprocessors store it; a missing ground truth is a clear error."""

import pytest

from twinkle.data_format import InputFeature, Trajectory
from twinkle.reward import (
    CountdownAccuracyReward,
    FormatReward,
    GSM8KAccuracyReward,
    GSM8KFormatReward,
    Reward,
)
from twinkle.reward.countdown import evaluate


def reply(text, **user_data):
    return Trajectory(
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
        user_data=[user_data],
    )


@pytest.mark.parametrize(
    ("text", "accuracy", "form"),
    [
        ("3 + 4 = 7\n#### 7", 1.0, 1.0),
        ("#### 7.0", 1.0, 1.0),
        ("#### 1,007", 0.0, 1.0),
        ("#### 8", 0.0, 1.0),
        ("the answer is 7", 0.0, 0.0),
        ("#### 7\nbut maybe more text", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_gsm8k_rewards(text, accuracy, form):
    assert GSM8KAccuracyReward()([reply(text, answer="7")]) == [accuracy]
    assert GSM8KFormatReward()([reply(text, answer="7")], []) == [form]


def test_gsm8k_reads_thousands_separators_as_numbers():
    assert GSM8KAccuracyReward()([reply("#### 1,200", answer="1200")]) == [1.0]


def test_rewards_read_sampled_input_features_and_plain_dicts():
    feature = InputFeature(
        input_ids=[1, 2],
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 5"}],
        user_data=[{"answer": "5"}],
    )
    plain = {"messages": [{"role": "assistant", "content": "#### 4"}], "user_data": [{"answer": 5}]}
    assert GSM8KAccuracyReward()([feature, plain]) == [1.0, 0.0]


def test_a_missing_ground_truth_names_the_field_and_the_preprocessor():
    with pytest.raises(ValueError, match=r"user_data\[0\]\['answer'\].*GSM8KProcessor"):
        GSM8KAccuracyReward()([reply("#### 5")])


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>hmm</think> <answer>(1 + 2) * 8</answer>", 1.0),
        ("<think>x</think><answer>8 * (2 + 1) = 24</answer>", 1.0),
        ("<answer>(1 + 2) * 8</answer>", 1.0),
        ("<think>x</think><answer>1 + 2 + 8</answer>", 0.0),  # 11, not 24
        ("<think>x</think><answer>3 * 8</answer>", 0.0),  # wrong numbers
        ("<answer>__import__('os')</answer>", 0.0),  # not arithmetic, never evaluated
        ("<answer>(1 + 2) * 8 / 0</answer>", 0.0),
        ("(1 + 2) * 8", 0.0),
    ],
)
def test_countdown_accuracy(text, score):
    assert CountdownAccuracyReward()([reply(text, target=24, nums=[1, 2, 8])], []) == [score]


def test_countdown_evaluation_refuses_anything_but_arithmetic():
    assert evaluate("(1 + 2) * -3 / 2") == -4.5
    for bad in ("2 ** 10", "abs(-1)", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            evaluate(bad)


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>a\nb</think>\n<answer>1</answer>", 1.0),
        ("<answer>1</answer>", 0.0),
        ("<think>a</think><answer>1</answer> trailing", 0.0),
        ("<think>a</think>", 0.0),
    ],
)
def test_format_reward(text, score):
    assert FormatReward()([reply(text)], []) == [score]


def test_the_documents_custom_reward_subclass_works():
    class Length(Reward):
        def __call__(self, trajectories, ground_truths=None):
            return [float(len(t["messages"][-1]["content"])) for t in trajectories]

    assert Length()([reply("abc")]) == [3.0]

"""Preprocessors for language-model RL tasks whose rewards check a ground truth kept in
``user_data``: GSM8K math and the Countdown game."""

from twinkle.preprocessor.llm.countdown import COUNTDOWN_PROMPT, CountdownProcessor
from twinkle.preprocessor.llm.gsm8k import GSM8K_INSTRUCTION, GSM8KProcessor, gsm8k_final_answer

__all__ = [
    "COUNTDOWN_PROMPT",
    "GSM8K_INSTRUCTION",
    "CountdownProcessor",
    "GSM8KProcessor",
    "gsm8k_final_answer",
]

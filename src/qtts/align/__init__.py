"""Word timestamps: the official Qwen3-ForcedAligner run on our model files (:mod:`qtts.align.aligner`)."""

from .aligner import AlignedWord, ForcedAligner, prompt_text, repair_timestamps, words_from_times

__all__ = ["AlignedWord", "ForcedAligner", "prompt_text", "repair_timestamps", "words_from_times"]

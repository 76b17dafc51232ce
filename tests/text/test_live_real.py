"""stream_text on a real (tiny, random-weight) checkpoint, torch and ONNX plans: with greedy decoding
the codes equal stream()'s in the streaming text layout for every chunking of the text, also when
the text arrives slowly (the talker waits)."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import numpy as np
import pytest

import qtts
from qtts.cli import main as qtts_main
from qtts.options import SynthesisOptions
from support.live_fakes import aslow, chunkings, recording, slow

TEXT = "Hi there, 42 cats; ça va?"  # one sentence: a 16-frame context cuts at sentence ends after 8 ids
OPTS = SynthesisOptions(greedy=True, max_frames=16, split_sentences=False, non_streaming_text=False)


@pytest.fixture(scope="module")
def engines(snapshot, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("live-onnx") / "bundle")
    assert qtts_main(["export", "onnx", "--model", snapshot, "-o", out, "--components", "talker", "predictor"]) == 0
    return {"torch": qtts.load(snapshot, threads=1),
            "onnx": qtts.load(snapshot, plan=os.path.join(out, "plan.json"), threads=1)}


@pytest.mark.parametrize("plan", ["torch", "onnx"])
def test_codes_equal_stream_for_every_chunking(engines, plan):
    tts, vocoder = recording(engines[plan])
    speaker = tts.speakers[0]
    ref = list(tts.stream(TEXT, speaker=speaker, options=OPTS))
    want = vocoder.take()
    n_ids = len(tts.components.tokenizer.encode(TEXT))
    assert len(want) == OPTS.max_frames > n_ids  # the talker took the whole text before the budget ended
    for name, pieces in chunkings(TEXT).items():
        chunks = list(tts.stream_text(pieces, speaker=speaker, options=OPTS))
        np.testing.assert_array_equal(vocoder.take(), want, err_msg=f"{plan} {name}")
        assert chunks[-1].finish_reason == ref[-1].finish_reason
        np.testing.assert_allclose(np.concatenate([c.samples for c in chunks]),
                                   np.concatenate([c.samples for c in ref]), atol=1e-5)


def test_slow_text_same_codes(engines):
    """A slow LLM (a word every 0.3 s): the same codes (that the talker then waits and never gets
    tts_pad early is asserted on the fake backend, whose frames take no time)."""
    tts, vocoder = recording(engines["torch"])
    speaker = tts.speakers[0]
    list(tts.stream(TEXT, speaker=speaker, options=OPTS))
    want = vocoder.take()
    chunks = list(tts.stream_text(slow(chunkings(TEXT)["words"], 0.3), speaker=speaker, options=OPTS))
    np.testing.assert_array_equal(vocoder.take(), want)
    assert chunks[-1].info["pieces"] == 1 and chunks[-1].info["text_chars"] == len(TEXT)


def test_speed_stretches_like_stream(engines):
    """options.speed: stream_text's audio (sync and async sources) equals stream()'s at that speed."""
    tts = engines["torch"]
    speaker, opts = tts.speakers[0], dataclasses.replace(OPTS, speed=1.5)
    want = np.concatenate([c.samples for c in tts.stream(TEXT, speaker=speaker, options=opts)])
    assert len(want) == round(OPTS.max_frames * 1920 / 1.5)

    async def run():
        return [c async for c in tts.stream_text(aslow(chunkings(TEXT)["words"], 0.002), speaker=speaker,
                                                  options=opts)]

    for chunks in (list(tts.stream_text(chunkings(TEXT)["random"], speaker=speaker, options=opts)), asyncio.run(run())):
        np.testing.assert_allclose(np.concatenate([c.samples for c in chunks]), want, atol=1e-5)
        assert chunks[-1].info["speed"] == 1.5

"""TTS.stream_text on fake components: the talker gets exactly what stream() gives it, over any
chunking; slow text makes it wait (never tts_pad early); contexts end at sentence ends; errors.

The real-checkpoint exactness tests (torch and ONNX plans) are in tests/text/test_live_real.py.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from qtts.errors import InputError
from qtts.options import SynthesisOptions
from qtts.text.live import TextFeed
from qtts.voice import Voice
from support.live_fakes import H, aslow, chunkings, decode_steps, fake_tts, slow, tokenizer

VOICE = Voice(np.ones(H, np.float32), model_size="0b6")
ICL = Voice(np.ones(H, np.float32), ref_codes=np.arange(7 * 16).reshape(7, 16) % 2048, ref_text="A reference.",
            model_size="0b6")
OPTS = SynthesisOptions(greedy=True, max_frames=48, watchdog=False, split_sentences=False, non_streaming_text=False)
TEXT = "Hello world, this is 42 tests. Ça va? 你好，世界！ OK."
CONDITIONING = {
    "xvector": ("Qwen3-TTS-12Hz-0.6B-Base", {"voice": VOICE}),
    "icl": ("Qwen3-TTS-12Hz-0.6B-Base", {"voice": ICL}),
    "custom_voice": ("Qwen3-TTS-12Hz-0.6B-CustomVoice", {"speaker": "ryan"}),
}


def inputs(backend) -> list[tuple[int, np.ndarray]]:
    return [(e[1], e[2]) for e in backend.events if e[0] == "input"]


def reference(kind, kw, text=TEXT, opts=OPTS):
    tts, backend, vocoder = fake_tts(kind)
    chunks = list(tts.stream(text, options=opts, **kw))
    return vocoder.take(), inputs(backend), chunks[-1]


def assert_same_inputs(got, want) -> None:
    assert len(got) == len(want)
    for (pos_a, a), (pos_b, b) in zip(got, want):
        assert pos_a == pos_b
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", sorted(CONDITIONING))
def test_talker_inputs_equal_stream_over_any_chunking(mode):
    kind, kw = CONDITIONING[mode]
    codes, talker_inputs, last = reference(kind, kw)
    assert last.info["frames"] == OPTS.max_frames  # the budget, not an early EOS: all the text was taken
    for name, pieces in chunkings(TEXT, seed=len(mode)).items():
        tts, backend, vocoder = fake_tts(kind)
        chunks = list(tts.stream_text(pieces, options=OPTS, **kw))
        np.testing.assert_array_equal(vocoder.take(), codes, err_msg=name)
        assert_same_inputs(inputs(backend), talker_inputs)
        assert chunks[-1].is_final and chunks[-1].finish_reason == last.finish_reason
        assert chunks[-1].info["pieces"] == 1 and chunks[-1].info["text_chars"] == len(TEXT)


def test_async_iterable_and_pushed_feed():
    kind, kw = CONDITIONING["xvector"]
    codes, _, _ = reference(kind, kw)
    tts, _, vocoder = fake_tts(kind)

    async def run():
        return [c async for c in tts.stream_text(aslow(chunkings(TEXT)["words"], 0.002), options=OPTS, **kw)]

    chunks = asyncio.run(run())
    np.testing.assert_array_equal(vocoder.take(), codes)
    assert chunks[-1].is_final
    feed = TextFeed(tokenizer())

    def push():
        for piece in chunkings(TEXT)["random"]:
            feed.push(piece)
            time.sleep(0.002)
        feed.close()

    threading.Thread(target=push).start()
    list(tts.stream_text(feed, options=OPTS, **kw))
    np.testing.assert_array_equal(vocoder.take(), codes)


def test_slow_text_waits_and_never_feeds_pad_early():
    """3 words a second or slower: the talker waits for each text id; tts_pad only after tts_eos."""
    kind, kw = CONDITIONING["xvector"]
    codes, talker_inputs, _ = reference(kind, kw)
    tts, backend, vocoder = fake_tts(kind)
    words = chunkings(TEXT)["words"]
    chunks = list(tts.stream_text(slow(words, 0.03), options=OPTS, **kw))
    got = vocoder.take()
    np.testing.assert_array_equal(got, codes)
    assert_same_inputs(inputs(backend), talker_inputs)
    assert chunks[-1].info["text_wait_s"] > 0.03 * (len(words) - 4)
    # read the text id of every decode step back from its input vector
    tok, cfg = tokenizer(), tts.config
    body = tok.encode(TEXT)
    expected = body[1:] + [cfg.tts_eos_token_id] + [cfg.tts_pad_token_id] * len(got)
    vectors = {i: backend.text_embeds([i])[0] for i in set(expected)}
    steps = decode_steps(backend)
    for s, (_, x) in enumerate(steps):
        text_part = x - backend.frame_embeds(got[s][None])[0]
        fed = [i for i, v in vectors.items() if np.allclose(text_part, v, atol=1e-5)]
        assert fed == [expected[s]], (s, fed, expected[s])
    first_pad = expected.index(cfg.tts_pad_token_id)
    assert first_pad == len(body)  # pad only after every body id and tts_eos


def test_waiting_flushes_pending_frames():
    kind, kw = CONDITIONING["xvector"]
    tts, _, _ = fake_tts(kind)
    opts = SynthesisOptions(greedy=True, max_frames=48, watchdog=False, first_chunk_frames=2, chunk_frames=8)
    chunks = list(tts.stream_text(slow(chunkings(TEXT)["words"], 0.03), options=opts, **kw))
    sizes = [c.num_frames for c in chunks]
    assert sum(sizes) == 48 and any(0 < s < 8 for s in sizes[1:-1])  # flushed while waiting
    assert [c.frame_start for c in chunks] == list(np.cumsum([0, *sizes[:-1]]))


def test_icl_prefill_waits_for_the_text_it_overlays():
    """ICL overlays the text on the reference frames: the prefill needs that many body ids first."""
    kind, kw = CONDITIONING["icl"]
    tts, backend, _ = fake_tts(kind)
    feed = TextFeed(tokenizer())
    it = tts.stream_text(feed, options=OPTS, **kw)
    started = threading.Event()

    def consume():
        started.set()
        list(it)

    t = threading.Thread(target=consume)
    t.start()
    started.wait()
    ref_ids = len(tokenizer().encode("A reference."))
    words = TEXT.split(" ")
    for w in words[:3]:
        feed.push(w + " ")
    time.sleep(0.2)
    assert not any(e[0] == "input" for e in backend.events)  # 8 reference positions need 8 - ref ids
    for w in words[3:]:
        feed.push(w + " ")
    feed.close()
    t.join(10)
    assert ref_ids < 8 and any(e[0] == "input" for e in backend.events)


def test_sentence_cut_contexts_equal_stream_per_sentence():
    """A small context: each ends after a sentence and the next sentence starts a fresh context."""
    sentences = ["Hi there.", "Go now.", "你好。", "今天很好。"]
    text = " ".join(sentences)
    opts = SynthesisOptions(greedy=True, watchdog=False, context_frames=72)  # 4 text ids per context
    kind, kw = CONDITIONING["xvector"]
    want = []
    for s in sentences:
        tts, _, vocoder = fake_tts(kind)
        list(tts.stream(s, options=opts, **kw))
        want.append(vocoder.take())
    for name, pieces in chunkings(text).items():
        tts, _, vocoder = fake_tts(kind)
        chunks = list(tts.stream_text(pieces, options=opts, **kw))
        assert chunks[-1].info["pieces"] == len(sentences), name
        np.testing.assert_array_equal(vocoder.take(), np.concatenate(want), err_msg=name)
        assert vocoder.streams == 1  # one vocoder stream: no seam between contexts


def test_early_eos_hands_the_rest_to_a_new_context():
    kind, kw = CONDITIONING["xvector"]
    tts, backend, _ = fake_tts(kind, eos_at=4)
    text = "one two three four five six seven eight nine ten eleven twelve"
    chunks = list(tts.stream_text(slow(chunkings(text)["words"], 0.005), options=OPTS, **kw))
    info = chunks[-1].info
    assert info["pieces"] > 2 and set(info["finish_reasons"]) == {"eos"}
    prefills = [x for _, x in inputs(backend) if len(x) > 1]
    assert len(prefills) == info["pieces"]  # one prefill per context
    # the first body id of each context (last prefill row minus C(codec_bos)) starts a word, in order
    bos = backend.codec_embeds([tts.config.talker.codec_bos_id])[0]
    words = {w: backend.text_embeds(tokenizer().encode(w))[0] for w in text.split(" ")}
    firsts = [next(w for w, v in words.items() if np.allclose(p[-1] - bos, v, atol=1e-5)) for p in prefills]
    assert firsts[0] == "one" and firsts == sorted(firsts, key=text.split(" ").index) and len(set(firsts)) == len(firsts)


def test_one_long_word_still_progresses():
    """Contexts that end early inside one long word must not start over at the word (no loop)."""
    tts, _, _ = fake_tts(CONDITIONING["xvector"][0], eos_at=3)
    chunks = list(tts.stream_text(["x" * 300], voice=VOICE, options=OPTS))
    assert 1 < chunks[-1].info["pieces"] < 300


def test_empty_text_is_an_input_error():
    tts, _, _ = fake_tts(CONDITIONING["xvector"][0])
    with pytest.raises(InputError, match="empty"):
        list(tts.stream_text(["", " \n", "\x00", "\t"], voice=VOICE, options=OPTS))


def test_bad_calls():
    tts, _, _ = fake_tts(CONDITIONING["xvector"][0])
    with pytest.raises(InputError, match="streaming text layout"):
        tts.stream_text(["hi"], voice=VOICE, options=SynthesisOptions(non_streaming_text=True))
    with pytest.raises(InputError, match="iterable"):
        tts.stream_text(42, voice=VOICE)
    with pytest.raises(InputError, match="needs one"):
        tts.stream_text(["hi"])  # conditioning is checked at the call
    with pytest.raises(InputError, match="strings"):
        list(tts.stream_text(["hi ", b"bytes"], voice=VOICE, options=OPTS))
    with pytest.raises(InputError, match="context_frames"):
        tts.stream_text(["hi"], voice=VOICE, options=SynthesisOptions(context_frames=10))


def test_source_errors_reach_the_caller():
    def broken():
        yield "Hello there "
        raise ValueError("the LLM went away")

    tts, _, _ = fake_tts(CONDITIONING["xvector"][0])
    with pytest.raises(ValueError, match="went away"):
        list(tts.stream_text(broken(), voice=VOICE, options=OPTS))


def test_close_stops_generation_and_the_reader():
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield f"word{i} "
            i += 1
            time.sleep(0.01)

    tts, backend, _ = fake_tts(CONDITIONING["xvector"][0])
    it = tts.stream_text(endless(), voice=VOICE, options=SynthesisOptions(greedy=True, watchdog=False))
    next(it)
    it.close()
    n_events, n_pulled = len(backend.events), len(pulled)
    time.sleep(0.1)
    assert len(backend.events) == n_events  # nothing ran after close
    assert len(pulled) <= n_pulled + 1  # the reader stopped after its piece in flight

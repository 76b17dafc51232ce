"""TTS.stream / synthesize on fake components: chunking, ordering, closing, modes, stats."""

from __future__ import annotations

import numpy as np
import pytest

from qtts.errors import InputError
from qtts.options import SynthesisOptions
from qtts.voice import Voice
from support.fakes import VOICE, FakeVocoder, H, make_tts

OPTS = SynthesisOptions(greedy=True, max_frames=30, watchdog=False)
#: the serial path (one thread) with a 2-frame first chunk: tests that count backend calls per chunk
SERIAL = SynthesisOptions(greedy=True, max_frames=30, watchdog=False, pipeline=False, first_chunk_frames=2)


def test_chunk_sizes_double_from_first_up_to_chunk_frames():
    tts, _ = make_tts()
    chunks = list(tts.stream("Hello world.", voice=VOICE, options=OPTS))
    sizes = [c.num_frames for c in chunks]
    assert sizes == [1, 2, 4, 8, 8, 7]  # 30 frames; the last chunk is the final one
    assert [len(c.samples) for c in chunks] == [1920 * s for s in sizes]
    assert [c.frame_start for c in chunks] == list(np.cumsum([0] + sizes[:-1]))
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    assert chunks[-1].finish_reason == "length"
    info = chunks[-1].info
    assert info["frames"] == 30 and info["audio_s"] == pytest.approx(2.4) and info["ttfa_s"] <= info["wall_s"]


def test_custom_chunking():
    tts, _ = make_tts()
    opts = SynthesisOptions(greedy=True, max_frames=10, watchdog=False, first_chunk_frames=1, chunk_frames=3)
    sizes = [c.num_frames for c in tts.stream("Hi there.", voice=VOICE, options=opts)]
    assert sizes == [1, 2, 3, 3, 1]


def test_stream_equals_synthesize_and_offline_decode():
    tts, backend = make_tts()
    chunks = list(tts.stream("Hello world.", voice=VOICE, options=OPTS))
    streamed = np.concatenate([c.samples for c in chunks])
    fed = [e[2] for e in backend.events if e[0] == "decode"]
    assert [len(c) for c in fed] == [c.num_frames for c in chunks if c.num_frames]  # one decode per chunk
    offline = FakeVocoder([]).stream().decode(np.concatenate(fed))  # the same 30 frames in one call, fresh state
    np.testing.assert_array_equal(streamed, offline)
    audio = tts.synthesize("Hello world.", voice=VOICE, options=OPTS)
    np.testing.assert_array_equal(streamed, audio.samples)
    assert audio.finish_reason == "length" and audio.duration == pytest.approx(2.4)


def test_first_chunk_before_generation_ends():
    tts, backend = make_tts()
    it = tts.stream("Hello world.", voice=VOICE, options=SERIAL)
    first = next(it)
    talks_at_first = sum(1 for e in backend.events if e[0] == "talker")
    assert first.num_frames == 2
    list(it)
    talks_total = sum(1 for e in backend.events if e[0] == "talker")
    assert talks_at_first <= 3 < talks_total  # prefill + 2 steps, then 28 more
    first_decode = next(i for i, e in enumerate(backend.events) if e[0] == "decode")
    last_talk = max(i for i, e in enumerate(backend.events) if e[0] == "talker")
    assert first_decode < last_talk


def test_close_stops_generation():
    tts, backend = make_tts()
    it = tts.stream("Hello world.", voice=VOICE, options=SynthesisOptions(greedy=True, max_frames=500, pipeline=False))
    next(it)
    n = len(backend.events)
    it.close()
    assert len(backend.events) == n
    with pytest.raises(StopIteration):
        next(it)


def test_eos_finish_reason():
    tts, _ = make_tts(eos_at=5)
    audio = tts.synthesize("Hello world.", voice=VOICE, options=OPTS)
    assert audio.finish_reason == "eos" and audio.info["frames"] == 5


def test_runaway_finish_reason():
    tts, _ = make_tts(stuck_code=3)
    opts = SynthesisOptions(greedy=True, max_frames=400)
    audio = tts.synthesize("Hello world.", voice=VOICE, options=opts)
    assert audio.finish_reason == "runaway" and audio.info["frames"] < 400


def test_long_text_split_into_pieces_with_own_budgets():
    tts, _ = make_tts(eos_at=4)
    text = "First sentence here. Second one follows! And a third? Yes, a fourth."
    audio = tts.synthesize(text, voice=VOICE, options=SynthesisOptions(greedy=True, max_sentence_chars=30))
    assert audio.info["pieces"] >= 2
    assert audio.info["frames"] == 4 * audio.info["pieces"]
    assert audio.info["finish_reasons"] == ["eos"] * audio.info["pieces"]


def test_a_text_that_fits_one_piece_is_one_context():
    """Sentences of a text of at most max_sentence_chars share one talker context (as the official
    model speaks any text); a longer one is cut between whole sentences."""
    tts, _ = make_tts(eos_at=4)
    text = "First sentence here. Second one follows! And a third?"
    opts = SynthesisOptions(greedy=True, max_sentence_chars=len(text))
    assert tts.synthesize(text, voice=VOICE, options=opts).info["pieces"] == 1
    opts = SynthesisOptions(greedy=True, max_sentence_chars=len(text) - 1)
    assert tts.synthesize(text, voice=VOICE, options=opts).info["pieces"] == 2


def test_vocoder_state_continues_across_pieces():
    tts, backend = make_tts(eos_at=3)
    opts = SynthesisOptions(greedy=True, max_sentence_chars=30, first_chunk_frames=4, chunk_frames=4)
    chunks = list(tts.stream("One sentence here. Another sentence there.", voice=VOICE, options=opts))
    assert chunks[-1].info["pieces"] == 2
    assert tts.components.vocoder.streams == 1  # one vocoder stream for the whole call: no seam between pieces
    assert [c.num_frames for c in chunks] == [4, 2]  # chunks span the piece boundary (3 + 3 frames)
    assert [c.frame_start for c in chunks] == [0, 4]


def test_seeded_sampling_reproducible():
    tts, _ = make_tts()
    opts = SynthesisOptions(seed=3, max_frames=12, watchdog=False)
    a = tts.synthesize("Hello.", voice=VOICE, options=opts).samples
    b = tts.synthesize("Hello.", voice=VOICE, options=opts).samples
    np.testing.assert_array_equal(a, b)


def test_icl_primes_vocoder_and_drops_reference_audio():
    tts, backend = make_tts()
    voice = Voice(np.ones(H, np.float32), ref_codes=np.zeros((7, 16), np.int64), ref_text="ref", model_size="0b6")
    chunks = list(tts.stream("Hello world.", voice=voice, options=SynthesisOptions(greedy=True, max_frames=4)))
    assert backend.events[0][:2] == ("decode", 7)  # primed before generation
    assert sum(len(c.samples) for c in chunks) == 4 * 1920


@pytest.mark.parametrize(
    "kind,kwargs,match",
    [
        ("Qwen3-TTS-12Hz-0.6B-Base", {}, "needs one"),
        ("Qwen3-TTS-12Hz-0.6B-Base", {"voice": VOICE, "speaker": "ryan"}, "CustomVoice"),
        ("Qwen3-TTS-12Hz-0.6B-Base", {"voice": VOICE, "instruct": "calm"}, "VoiceDesign"),
        ("Qwen3-TTS-12Hz-0.6B-Base", {"voice": VOICE, "language": "klingon"}, "valid: auto"),
        ("Qwen3-TTS-12Hz-0.6B-CustomVoice", {"speaker": "nobody"}, "valid: aiden"),
        ("Qwen3-TTS-12Hz-0.6B-CustomVoice", {}, "ryan"),
        ("Qwen3-TTS-12Hz-0.6B-CustomVoice", {"speaker": "ryan", "instruct": "happy"}, "1.7B"),
        ("Qwen3-TTS-12Hz-0.6B-CustomVoice", {"voice": VOICE}, "Base"),
        ("Qwen3-TTS-12Hz-1.7B-VoiceDesign", {}, "instruct"),
        ("Qwen3-TTS-12Hz-1.7B-VoiceDesign", {"speaker": "ryan", "instruct": "x"}, "CustomVoice"),
    ],
)
def test_mode_mismatch_lists_valid(kind, kwargs, match):
    tts, _ = make_tts(kind)
    with pytest.raises(InputError, match=match):
        tts.stream("Hello.", options=OPTS, **kwargs)


def test_facts():
    tts, _ = make_tts("Qwen3-TTS-12Hz-0.6B-CustomVoice")
    assert tts.model_type == "custom_voice" and "ryan" in tts.speakers and "english" in tts.languages
    assert tts.sample_rate == 24000


# -- the real pipeline on a tiny random checkpoint --------------------------------------------


@pytest.mark.parametrize("icl", [False, True])
def test_real_stream_equals_offline_decode(real_tts, icl):
    import torch

    from qtts.audio.chunk import snr_db
    from qtts.engine.generate import generate
    from qtts.options import LoopParams
    from qtts.text.prompt import build_prompt, resolve_mode

    parts = real_tts.components
    assert parts.vocoder.threads == 1  # load(threads=1) reaches the vocoder too
    rng = np.random.default_rng(5)
    voice = Voice(rng.standard_normal(parts.config.talker.hidden_size).astype(np.float32), model_size="0b6",
                  ref_codes=rng.integers(0, 2048, (10, 16)) if icl else None, ref_text="Ref." if icl else None)
    opts = SynthesisOptions(greedy=True, max_frames=20, watchdog=False, split_sentences=False)
    chunks = list(real_tts.stream("Hello world, streaming test.", voice=voice, options=opts))
    streamed = np.concatenate([c.samples for c in chunks])
    # the same codes again (greedy), decoded offline in one call, reference part cut like the official wrapper
    ro = opts.resolve(parts.config.generation)
    mode = resolve_mode(parts.config, voice)
    prompt = build_prompt(parts.config, parts.tokenizer, "Hello world, streaming test.", mode, ro.non_streaming_text)
    lp = LoopParams(talker=ro.talker, predictor=ro.predictor, max_frames=20, tts_pad_id=151671, watchdog=None)
    codes = np.array(list(generate(parts.backend, prompt, lp, speaker=voice.speaker)))
    full = codes if not icl else np.concatenate([voice.ref_codes, codes])
    with torch.inference_mode():
        wav = parts.vocoder.decoder(torch.from_numpy(full.T.copy())[None]).reshape(-1).numpy()
    cut = int(len(voice.ref_codes) / len(full) * len(wav)) if icl else 0
    offline = wav[cut:]
    assert len(streamed) == len(offline) == 20 * 1920
    assert snr_db(offline, streamed) >= 100.0


def test_real_first_chunk_before_generation_ends(real_tts):
    be = real_tts.components.backend
    calls = []
    orig = be.talker

    def counting(*a):
        calls.append(1)
        return orig(*a)

    be.talker = counting
    try:
        it = real_tts.stream("Hello.", voice=Voice(np.ones(real_tts.config.talker.hidden_size, np.float32) * 0.1,
                                                   model_size="0b6"),
                             options=SynthesisOptions(greedy=True, max_frames=20, watchdog=False, pipeline=False,
                                                      first_chunk_frames=2))
        first = next(it)
        at_first = len(calls)
        rest = list(it)
    finally:
        be.talker = orig
    assert first.num_frames == 2 and len(first.samples) == 2 * 1920
    assert at_first == 2 and len(calls) > at_first and rest[-1].is_final  # prefill + 1 step per later frame


def test_real_concurrent_streams_do_not_interfere(real_tts):
    import threading

    voice = Voice(np.full(real_tts.config.talker.hidden_size, 0.1, np.float32), model_size="0b6")
    opts = SynthesisOptions(greedy=True, max_frames=10, watchdog=False)
    texts = ["Hello there.", "A different sentence entirely."]
    expect = [real_tts.synthesize(t, voice=voice, options=opts).samples for t in texts]
    got = [None, None]

    def work(i):
        got[i] = real_tts.synthesize(texts[i], voice=voice, options=opts).samples

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e, g in zip(expect, got):
        np.testing.assert_array_equal(e, g)
    assert real_tts.thread_safe


def test_real_bfloat16_talker_fp32_vocoder(tiny_snapshot):
    import torch

    import qtts

    tts = qtts.load(tiny_snapshot(), dtype="bfloat16", threads=1)
    assert tts.components.backend.talker_module.codec_head.weight.dtype == torch.bfloat16
    assert next(tts.components.vocoder.decoder.parameters()).dtype == torch.float32
    assert next(tts.components.speaker_encoder.encoder.parameters()).dtype == torch.bfloat16
    voice = Voice(np.full(tts.config.talker.hidden_size, 0.1, np.float32), model_size="0b6")
    audio = tts.synthesize("Hello.", voice=voice, options=SynthesisOptions(seed=0, max_frames=4))
    assert audio.samples.dtype == np.float32 and len(audio.samples) == 4 * 1920 and np.isfinite(audio.samples).all()

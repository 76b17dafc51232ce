"""``qtts say`` (text -> audio file or PCM on stdout, optionally the codec frames), ``qtts decode``
(saved frames -> audio) and ``qtts voice create|show`` (.voice files)."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import sys

from ..errors import InputError
from ..options import MAX_PENALTY, MAX_TEMPERATURE, MIN_PENALTY, MIN_TEMPERATURE
from .common import (
    FORCE_HELP,
    Progress,
    add_model,
    check_audio,
    check_file,
    cli_plan,
    cli_words,
    command,
    group,
    hidden_alias,
    number,
)

SILENCE_HELP = "seconds of silence appended to the ICL reference (stops reference bleed; default 0.5)"
CODES_HELP = ("also write the generated codec frames: .npy = [frames, 16] int64; .npz = the same as 'codes' "
              "plus an ICL voice's reference codes as 'prime' (decodes on its own with qtts decode)")
ICL_NOTE = ("qtts: note: an ICL voice primes the vocoder with its reference codes; decode this .npy with "
            "the same --voice, or write --codes-out FILE.npz to keep them with the frames")


def register(sub) -> None:
    p = command(sub, "say", run_say, "synthesize speech to an audio file (wav, flac, mp3, opus, pcm) "
                "or raw PCM on stdout")
    p.add_argument("text", nargs="?", help="text to speak (or use -f)")
    p.add_argument("-f", "--file", metavar="FILE", help="read the text from this UTF-8 file ('-' = stdin)")
    add_model(p)
    who = p.add_argument_group("voice (Base: --voice or --ref-audio; CustomVoice: --speaker; VoiceDesign: --instruct)")
    who.add_argument("--voice", metavar="FILE", help="a .voice file from 'qtts voice create'")
    who.add_argument("--ref-audio", metavar="FILE", help="reference audio to clone (wav/flac/ogg/mp3, any rate)")
    who.add_argument("--ref-text", metavar="TEXT", help="transcript of --ref-audio (enables ICL cloning)")
    who.add_argument("--trailing-silence", type=number(float, 0, 5), default=0.5, metavar="S", help=SILENCE_HELP)
    who.add_argument("--speaker", metavar="NAME", help="CustomVoice speaker name")
    who.add_argument("--instruct", metavar="TEXT", help="voice/style instruction (VoiceDesign, 1.7B CustomVoice)")
    who.add_argument("--language", metavar="LANG", help="language name or 'auto' (default)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="output file; the extension picks the format "
                   "(.wav .flac .mp3 .opus .pcm); '-' = raw 16-bit 24 kHz mono PCM on stdout")
    p.add_argument("--codes-out", metavar="FILE", help=CODES_HELP)
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    t = p.add_argument_group("word timestamps (docs/timestamps.md)")
    t.add_argument("--subtitles", metavar="FILE", help="also write subtitles of the speech: .srt or .vtt")
    t.add_argument("--words-json", metavar="FILE", help="also write every word's start and end (seconds) as JSON")
    t.add_argument("--aligner", metavar="DIR|HUB_ID", help="the Qwen3-ForcedAligner-0.6B snapshot that times the "
                   "words (default: $QTTS_ALIGNER, else the official one in the Hugging Face cache; without "
                   "one, each text piece is timed as a whole)")
    p.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)  # old flag: output always streams
    p.add_argument("--live", action="store_true", help="speak the text while it is still arriving (e.g. "
                   "-f - piped from an LLM): read incrementally, one talker context across sentences")
    _speed_argument(p)
    _sampling_arguments(p)
    _chunk_arguments(p)
    p.add_argument("--no-pipeline", dest="pipeline", action="store_false",
                   help="generate and decode on one thread (default: generation on a second thread)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")
    _register_decode(sub)

    voice_sub = group(sub, "voice", "create or show .voice files (cloned speakers)")
    v = command(voice_sub, "create", run_voice_create, "clone a voice from reference audio into a .voice file")
    v.add_argument("ref_audio", help="reference audio (wav/flac/ogg/mp3, any sample rate; 3-10 s of clean speech)")
    add_model(v)
    v.add_argument("--ref-text", help="exact transcript of the reference (enables ICL cloning, usually better)")
    v.add_argument("--name", default="", help="a name stored in the file")
    v.add_argument("--trailing-silence", type=number(float, 0, 5), default=0.5, help=SILENCE_HELP)
    v.add_argument("-o", "--output", required=True, help="output .voice file (an existing one is kept unless --force)")
    v.add_argument("--force", action="store_true", help=FORCE_HELP)
    show = command(voice_sub, "show", run_voice_show, "show what a .voice file holds")
    show.add_argument("voice", help="a .voice file")


def _sampling_arguments(p) -> None:
    s = p.add_argument_group("sampling (default: the checkpoint's generation_config.json)")
    s.add_argument("--seed", type=int, metavar="N", help="random seed (reproducible output)")
    s.add_argument("--greedy", action="store_true", help="deterministic argmax decoding")
    s.add_argument("--temperature", type=number(float, MIN_TEMPERATURE, MAX_TEMPERATURE), metavar="T",
                   help=f"{MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g} (--greedy for argmax)")
    s.add_argument("--top-k", type=number(lo=0), metavar="K", help="0 = off")
    s.add_argument("--top-p", type=number(float, hi=1, above=0), metavar="P", help="1 = off")
    s.add_argument("--repetition-penalty", type=number(float, MIN_PENALTY, MAX_PENALTY), metavar="R",
                   help=f"{MIN_PENALTY:g} to {MAX_PENALTY:g}; 1 = off")
    s.add_argument("--max-frames", type=number(lo=1), metavar="N",
                   help="frame budget of each text piece (12.5 frames = 1 s; long text is split into pieces of a few "
                   "sentences unless --no-split; --live: of each talker context; default: from the piece's length)")
    s.add_argument("--non-streaming-text", action="store_true", default=None,
                   help="put the whole text in the prompt (default for CustomVoice/VoiceDesign)")
    s.add_argument("--no-split", action="store_true", help="do not split long text into sentences")
    s.add_argument("--no-watchdog", action="store_true", help="disable the stuck-code watchdog")


def _speed_argument(p) -> None:
    p.add_argument("--speed", type=number(float, lo=0.25, hi=4.0), default=1.0, metavar="S",
                   help="speaking rate 0.25-4.0, pitch kept (a time stretch while streaming; default 1.0)")


def _chunk_arguments(p, title: str = "streaming") -> None:
    c = p.add_argument_group(title)
    c.add_argument("--first-chunk-frames", type=number(lo=1), default=1, metavar="N",
                   help="frames in the first audio chunk (default 1)")
    c.add_argument("--chunk-frames", type=number(lo=1), default=8, metavar="N",
                   help="largest later chunk; sizes double up to it (default 8)")
    hidden_alias(c, "--first-chunk", dest="first_chunk_frames", type=number(lo=1))
    hidden_alias(c, "--chunk", dest="chunk_frames", type=number(lo=1))


def read_text(args) -> str:
    if args.text is not None and args.file:
        raise InputError("give the text either as an argument or with -f, not both")
    if args.file == "-":
        return sys.stdin.read()
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as fh:
                return fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"-f {args.file}: cannot read the text file ({exc})") from exc
    if args.text is None:
        raise InputError("no text: pass it as an argument (qtts say 'Hello' ...) or with -f FILE")
    return args.text


def live_pieces(args):
    """The text as it arrives: chunks of stdin (-f -) or of a file/FIFO, decoded as UTF-8 incrementally."""
    if args.text is not None:
        if args.file:
            raise InputError("give the text either as an argument or with -f, not both")
        return iter([args.text])
    if not args.file:
        raise InputError("--live reads the text with -f FILE or -f - (stdin)")
    if args.file == "-":
        return _read_fd(sys.stdin.fileno(), close=False)
    return _read_fd(_open_text(args.file), close=True)


def _read_fd(fd: int, close: bool):
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        while data := os.read(fd, 4096):  # returns what is there, without waiting for more
            if text := decoder.decode(data):
                yield text
        if tail := decoder.decode(b"", final=True):
            yield tail
    finally:
        if close:
            os.close(fd)


def _open_text(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise InputError(f"-f {path}: cannot read the text file ({exc})") from exc


def build_options(args):
    from ..engine.request import SpeechFields, to_options

    fields = SpeechFields(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed, greedy=args.greedy,
                          max_frames=args.max_frames, speed=args.speed)
    return to_options(
        fields, non_streaming_text=args.non_streaming_text, split_sentences=not args.no_split,
        watchdog=not args.no_watchdog, first_chunk_frames=args.first_chunk_frames, chunk_frames=args.chunk_frames,
        pipeline=getattr(args, "pipeline", True),
    )


def resolve_voice(tts, args):
    """The Voice for Base checkpoints (from --voice or --ref-audio), else None."""
    from ..voice import Voice

    if args.voice and args.ref_audio:
        raise InputError("use either --voice or --ref-audio, not both")
    if args.ref_text and not args.ref_audio:
        raise InputError("--ref-text needs --ref-audio (a .voice file already holds its reference text)")
    if args.voice:
        return Voice.load(args.voice)
    if args.ref_audio:
        return tts.create_voice(args.ref_audio, ref_text=args.ref_text, trailing_silence=args.trailing_silence)
    return None


def run_say(args) -> int:
    from ..api import load
    from ..audio.codes import CODES_SUFFIXES
    from ..plans.cache import plan_short

    if args.live and args.non_streaming_text:
        raise InputError("--live feeds the text as it arrives, which needs the streaming text layout: "
                         "drop --non-streaming-text")
    text = live_pieces(args) if args.live else read_text(args)
    if not args.live:
        from ..text.prompt import clean_text

        clean_text(text, what="the text")  # empty, or over the 50,000-character limit: before the model loads
    fmt = check_audio(args.output, force=args.force)
    if args.codes_out:
        check_file(args.codes_out, "--codes-out", suffixes=CODES_SUFFIXES, force=args.force)
    timed = check_timestamp_files(args)
    options = build_options(args)
    tts = load(args.model, plan=cli_plan(args), dtype=args.dtype, threads=args.threads, aligner=args.aligner)
    voice = resolve_voice(tts, args)
    speak = tts.stream_text if args.live else tts.stream
    chunks = speak(text, voice=voice, speaker=args.speaker, instruct=args.instruct, language=args.language,
                   options=options, timestamps=timed or None)
    progress = Progress(args.quiet)
    frames = [] if args.codes_out else None
    words: list = []
    last = write_chunks(chunks, args.output, fmt, progress, frames, words)
    if args.codes_out:
        prime = voice.ref_codes if voice is not None and voice.icl else None  # what stream() primed with
        write_codes(args.codes_out, frames, prime, tts.codec, args.quiet)
    if timed:
        write_timestamps(args, words, None if args.live else tts.synth.pieces(text, options))
    progress.summary(last, plan_short(tts.components.plan))
    return 0


def check_timestamp_files(args) -> bool:
    """Check --subtitles / --words-json before the model loads; True when either is given."""
    from ..align.subtitles import subtitle_format

    if args.subtitles:
        subtitle_format(args.subtitles)
        check_file(args.subtitles, "--subtitles", force=args.force)
    if args.words_json:
        check_file(args.words_json, "--words-json", suffixes=(".json",), force=args.force)
    return bool(args.subtitles or args.words_json)


def write_timestamps(args, words: list, pieces: list[str] | None) -> None:
    """--subtitles and --words-json from the stream's word timings (``pieces``: the text pieces, for cue text)."""
    from ..align.subtitles import words_json, write_subtitles, write_text

    unit = "word" if words and all(w.unit == "word" for w in words) else "piece"
    if unit == "piece" and not args.quiet:
        print("qtts: no forced aligner (--aligner, $QTTS_ALIGNER): the timestamps time each text piece as a whole",
              file=sys.stderr)  # fmt: skip
    if args.subtitles:
        write_subtitles(args.subtitles, words, dict(enumerate(pieces)) if pieces else None)
    if args.words_json:
        write_text(args.words_json, words_json(words, unit))


def write_chunks(chunks, output: str, fmt: str, progress, frames: list | None = None, words: list | None = None):
    """Write the stream as it comes to ``output`` ('-' = PCM on stdout); returns the final chunk.

    ``frames``: a list that gets each chunk's codec frames, in order; ``words``: one that gets its word timings."""
    from ..audio.writers import AudioWriter, float_to_int16

    last = None
    if output == "-":
        with contextlib.closing(chunks):  # a reader that closes the pipe stops generation at once
            for last in chunks:
                sys.stdout.buffer.write(float_to_int16(last.samples).tobytes())
                sys.stdout.buffer.flush()
                progress.update(last)
                _keep(frames, last, words)
        return last
    # closing(): a failed write (a full disk) stops the generation threads before the error leaves
    try:
        with contextlib.closing(chunks), AudioWriter(output, fmt=fmt) as w:
            for last in chunks:
                w.write(last.samples)
                progress.update(last)
                _keep(frames, last, words)
    except OSError as exc:
        if exc.filename or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, output) from None
    return last


def _keep(frames: list | None, chunk, words: list | None = None) -> None:
    if frames is not None:
        frames.append(chunk.codes)
    if words is not None:
        words.extend(chunk.words)


def write_codes(path: str, frames: list, prime, codec: str | None, quiet: bool) -> None:
    """``--codes-out``: every frame in order (.npz: with the ICL prime and the codec fingerprint);
    a note when an .npy needs the voice."""
    import numpy as np

    from ..audio.codes import save_codes

    save_codes(path, np.concatenate(frames), prime, codec)
    if prime is not None and path.lower().endswith(".npy") and not quiet:
        print(ICL_NOTE, file=sys.stderr)


def _register_decode(sub) -> None:
    p = command(sub, "decode", run_decode, "vocode saved codec frames (qtts say --codes-out, or any "
                "[frames, 16] integer .npy) to an audio file, through the plan's vocoder")
    p.add_argument("codes", metavar="CODES",
                   help=".npy [frames, 16] integer codes, or an .npz from say --codes-out")
    add_model(p, dtype=False)
    p.add_argument("--voice", metavar="FILE", help="the .voice the codes were made with: an ICL voice primes the "
                   "vocoder with its reference codes, as say does (an .npz from say already holds them)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="output file; the extension picks the "
                   "format (.wav .flac .mp3 .opus .pcm); '-' = raw 16-bit 24 kHz mono PCM on stdout")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    _speed_argument(p)
    _chunk_arguments(p, "streaming (the sizes say used, default 1 and 8, give exactly its audio)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")


def run_decode(args) -> int:
    from ..api import load
    from ..audio.codes import load_codes
    from ..options import SynthesisOptions

    fmt = check_audio(args.output, force=args.force)
    codes, prime, codec = load_codes(args.codes)
    prime = decode_prime(args.codes, prime, args.voice)
    check_codec(args.codes, codec, args.model)
    tts = load(args.model, plan=cli_plan(args), threads=args.threads, parts=("vocoder",))
    options = SynthesisOptions(first_chunk_frames=args.first_chunk_frames, chunk_frames=args.chunk_frames,
                               speed=args.speed)
    progress = Progress(args.quiet)
    progress.summary(write_chunks(tts.decode_stream(codes, prime, options), args.output, fmt, progress))
    return 0


def check_codec(codes_path: str, codec: str | None, model: str) -> None:
    """Refuse codes whose file names another speech tokenizer than ``--model``'s (before loading it)."""
    from ..backends import snapshot_dir
    from ..plans.plan import codec_fingerprint

    if codec is None:
        return  # an .npy, or an .npz written by hand: nothing to check
    ours = codec_fingerprint(snapshot_dir(model))
    if codec != ours:
        raise InputError(f"{codes_path} was made with another checkpoint's speech tokenizer (codec {codec}), but "
                         f"--model {model} has codec {ours}; pass the checkpoint that made the codes (any checkpoint "
                         "with the same speech_tokenizer/ decodes them the same)")


def decode_prime(codes_path: str, prime, voice_path: str | None):
    """The vocoder prime: the file's own, or an ICL ``--voice``'s reference codes (they must agree)."""
    import numpy as np

    from ..voice import Voice

    if not voice_path:
        return prime
    voice = Voice.load(voice_path)
    ref = voice.ref_codes if voice.icl else None
    if prime is not None and (ref is None or not np.array_equal(prime, ref)):
        raise InputError(f"--voice {voice_path}: {codes_path} holds other reference codes (prime) than this "
                         "voice; drop --voice to decode it as it was made")
    return ref


def run_voice_create(args) -> int:
    from ..api import load

    check_file(args.output, suffixes=(".voice",), force=args.force)
    tts = load(args.model, plan=cli_plan(args), dtype=args.dtype, threads=args.threads)
    voice = tts.create_voice(args.ref_audio, ref_text=args.ref_text, name=args.name,
                             trailing_silence=args.trailing_silence)
    voice.save(args.output)
    mode = "ICL" if voice.icl else "x-vector only"
    print(f"wrote {args.output}: {mode}, {voice.enc_dim}-dim speaker vector, "
          f"model {voice.model_type} {cli_words(voice.model_size)}")
    return 0


def run_voice_show(args) -> int:
    from ..voice import Voice

    facts = Voice.load(args.voice).describe()
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        print(f"{key:<{width}}  {cli_words(str(value))}")
    return 0

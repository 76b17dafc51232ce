"""``qtts say`` (text -> audio file or PCM on stdout) and ``qtts voice create|show`` (.voice files)."""

from __future__ import annotations

import argparse
import contextlib
import sys

from ..errors import InputError
from .common import (
    Progress,
    add_model,
    check_audio,
    check_file,
    cli_words,
    command,
    group,
    hidden_alias,
    number,
)

SILENCE_HELP = "seconds of silence appended to the ICL reference (stops reference bleed; default 0.5)"


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
    p.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)  # old flag: output always streams
    p.add_argument("--speed", type=number(float, lo=0.25, hi=4.0), default=1.0, metavar="S",
                   help="speaking rate 0.25-4.0, pitch kept (a time stretch while streaming; default 1.0)")
    _sampling_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")

    voice_sub = group(sub, "voice", "create or show .voice files (cloned speakers)")
    v = command(voice_sub, "create", run_voice_create, "clone a voice from reference audio into a .voice file")
    v.add_argument("ref_audio", help="reference audio (wav/flac/ogg/mp3, any sample rate; 3-10 s of clean speech)")
    add_model(v)
    v.add_argument("--ref-text", help="exact transcript of the reference (enables ICL cloning, usually better)")
    v.add_argument("--name", default="", help="a name stored in the file")
    v.add_argument("--trailing-silence", type=number(float, 0, 5), default=0.5, help=SILENCE_HELP)
    v.add_argument("-o", "--output", required=True, help="output .voice file")
    show = command(voice_sub, "show", run_voice_show, "show what a .voice file holds")
    show.add_argument("voice", help="a .voice file")


def _sampling_arguments(p) -> None:
    s = p.add_argument_group("sampling (default: the checkpoint's generation_config.json)")
    s.add_argument("--seed", type=int, metavar="N", help="random seed (reproducible output)")
    s.add_argument("--greedy", action="store_true", help="deterministic argmax decoding")
    s.add_argument("--temperature", type=number(float, above=0), metavar="T")
    s.add_argument("--top-k", type=number(lo=0), metavar="K", help="0 = off")
    s.add_argument("--top-p", type=number(float, hi=1, above=0), metavar="P", help="1 = off")
    s.add_argument("--repetition-penalty", type=number(float, above=0), metavar="R", help="1 = off")
    s.add_argument("--max-frames", type=number(lo=1), metavar="N",
                   help="frame budget per sentence (12.5 frames = 1 s; default: from the text length)")
    s.add_argument("--non-streaming-text", action="store_true", default=None,
                   help="put the whole text in the prompt (default for CustomVoice/VoiceDesign)")
    s.add_argument("--no-split", action="store_true", help="do not split long text into sentences")
    s.add_argument("--no-watchdog", action="store_true", help="disable the stuck-code watchdog")
    c = p.add_argument_group("streaming")
    c.add_argument("--first-chunk-frames", type=number(lo=1), default=2, metavar="N",
                   help="frames in the first audio chunk (default 2)")
    c.add_argument("--chunk-frames", type=number(lo=1), default=8, metavar="N", help="frames per later chunk (default 8)")
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


def build_options(args):
    from ..options import SamplingParams, SynthesisOptions

    talker = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty)
    return SynthesisOptions(
        talker=talker, seed=args.seed, greedy=args.greedy, max_frames=args.max_frames,
        non_streaming_text=args.non_streaming_text, split_sentences=not args.no_split,
        watchdog=not args.no_watchdog, first_chunk_frames=args.first_chunk_frames, chunk_frames=args.chunk_frames,
        speed=args.speed,
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

    text = read_text(args)
    fmt = check_audio(args.output)
    options = build_options(args)
    tts = load(args.model, plan=args.plan, dtype=args.dtype, threads=args.threads)
    voice = resolve_voice(tts, args)
    chunks = tts.stream(text, voice=voice, speaker=args.speaker, instruct=args.instruct,
                        language=args.language, options=options)
    progress = Progress(args.quiet)
    progress.summary(write_chunks(chunks, args.output, fmt, progress))
    return 0


def write_chunks(chunks, output: str, fmt: str, progress):
    """Write the stream as it comes to ``output`` ('-' = PCM on stdout); returns the final chunk."""
    from ..audio import AudioWriter, float_to_int16

    last = None
    if output == "-":
        with contextlib.closing(chunks):  # a reader that closes the pipe stops generation at once
            for last in chunks:
                sys.stdout.buffer.write(float_to_int16(last.samples).tobytes())
                sys.stdout.buffer.flush()
                progress.update(last)
        return last
    with AudioWriter(output, fmt=fmt) as w:
        for last in chunks:
            w.write(last.samples)
            progress.update(last)
    return last


def run_voice_create(args) -> int:
    from ..api import load

    check_file(args.output)
    tts = load(args.model, plan=args.plan, dtype=args.dtype, threads=args.threads)
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

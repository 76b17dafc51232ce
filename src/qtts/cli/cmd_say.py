"""qtts say: synthesize text to a WAV file (or raw PCM on stdout)."""

from __future__ import annotations

import sys

from ..errors import InputError

COMMAND = ("say",)
HELP = "synthesize speech: qtts say 'text' --model M [--voice V | --ref-audio A | --speaker S | --instruct I] -o out.wav"


def add_model_arguments(p) -> None:
    p.add_argument("--model", "-m", required=True, help="snapshot directory or hub id (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-Base)")
    p.add_argument("--plan", help="execution plan JSON (runtimes per component)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="torch weight dtype")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")


def add_arguments(p) -> None:
    p.add_argument("text", nargs="?", help="text to speak (or use -f)")
    p.add_argument("-f", "--file", help="read the text from this UTF-8 file ('-' = stdin)")
    add_model_arguments(p)
    who = p.add_argument_group("voice (Base: --voice or --ref-audio; CustomVoice: --speaker; VoiceDesign: --instruct)")
    who.add_argument("--voice", help="a .voice file from 'qtts voice create'")
    who.add_argument("--ref-audio", help="reference audio to clone (wav/flac/ogg/mp3, any rate)")
    who.add_argument("--ref-text", help="transcript of --ref-audio (enables ICL cloning)")
    who.add_argument("--trailing-silence", type=float, default=0.5,
                     help="seconds of silence appended to the ICL reference (stops reference bleed; default 0.5)")
    who.add_argument("--speaker", help="CustomVoice speaker name")
    who.add_argument("--instruct", help="voice/style instruction (VoiceDesign, 1.7B CustomVoice)")
    who.add_argument("--language", help="language name or 'auto' (default)")
    p.add_argument("-o", "--output", required=True, help="output WAV path, or '-' for raw 16-bit 24 kHz mono PCM on stdout")
    p.add_argument("--stream", action="store_true", help="write the WAV progressively while generating")
    s = p.add_argument_group("sampling (default: the checkpoint's generation_config.json)")
    s.add_argument("--seed", type=int, help="random seed (reproducible output)")
    s.add_argument("--greedy", action="store_true", help="deterministic argmax decoding")
    s.add_argument("--temperature", type=float)
    s.add_argument("--top-k", type=int)
    s.add_argument("--top-p", type=float)
    s.add_argument("--repetition-penalty", type=float)
    s.add_argument("--max-frames", type=int, help="frame budget per sentence (12.5 frames = 1 s; default: from text length)")
    s.add_argument("--non-streaming-text", action="store_true", default=None,
                   help="put the whole text in the prompt (default for CustomVoice/VoiceDesign)")
    s.add_argument("--no-split", action="store_true", help="do not split long text into sentences")
    s.add_argument("--no-watchdog", action="store_true", help="disable the stuck-code watchdog")
    c = p.add_argument_group("streaming")
    c.add_argument("--first-chunk", type=int, default=2, help="frames in the first audio chunk (default 2)")
    c.add_argument("--chunk", type=int, default=8, help="frames per later chunk (default 8)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")


def read_text(args) -> str:
    if args.text is not None and args.file:
        raise InputError("give the text either as an argument or with -f, not both")
    if args.file:
        if args.file == "-":
            return sys.stdin.read()
        try:
            with open(args.file, encoding="utf-8") as fh:
                return fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read text file '{args.file}': {exc}") from exc
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
        watchdog=not args.no_watchdog, first_chunk_frames=args.first_chunk, chunk_frames=args.chunk,
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


class Progress:
    def __init__(self, quiet: bool):
        self.quiet = quiet

    def update(self, chunk) -> None:
        if not self.quiet:
            i = chunk.info
            print(f"\rqtts: {i['frames']} frames, {i['frames'] / 12.5:.2f} s audio, {i['wall_s']:.1f} s",
                  end="", file=sys.stderr, flush=True)

    def summary(self, chunk) -> None:
        if self.quiet:
            return
        i = chunk.info
        rtf = f"{i['rtf']:.2f}" if i.get("rtf") is not None else "-"
        ttfa = f"{i['ttfa_s']:.2f}s" if i.get("ttfa_s") is not None else "-"
        print(f"\rqtts: frames={i['frames']} audio={i['audio_s']:.2f}s wall={i['wall_s']:.2f}s "
              f"rtf={rtf} ttfa={ttfa} finish_reason={chunk.finish_reason}", file=sys.stderr)


def check_output(path: str) -> None:
    """Fail before loading the model when the output cannot be written."""
    import os

    if path == "-":
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"output directory '{directory}' does not exist; create it or choose another -o path")
    if os.path.isdir(path):
        raise InputError(f"output '{path}' is a directory; give a file name such as {os.path.join(path, 'out.wav')}")


def run(args) -> int:
    from ..api import load

    text = read_text(args)
    check_output(args.output)
    options = build_options(args)
    tts = load(args.model, plan=args.plan, dtype=args.dtype, threads=args.threads)
    voice = resolve_voice(tts, args)
    chunks = tts.stream(text, voice=voice, speaker=args.speaker, instruct=args.instruct,
                        language=args.language, options=options)
    progress = Progress(args.quiet)
    last = write_chunks(chunks, args.output, args.stream, progress)
    progress.summary(last)
    return 0


def write_chunks(chunks, output: str, stream: bool, progress):
    """Consume the stream into ``output`` ('-' = PCM on stdout); returns the final chunk."""
    import numpy as np

    from ..audio import WavWriter, float_to_int16, write_wav

    last = None
    if output == "-":
        out = sys.stdout.buffer
        for chunk in chunks:
            out.write(float_to_int16(chunk.samples).tobytes())
            out.flush()
            progress.update(chunk)
            last = chunk
        return last
    if stream:
        with WavWriter(output) as w:
            for chunk in chunks:
                w.write(chunk.samples)
                progress.update(chunk)
                last = chunk
        return last
    parts = []
    for chunk in chunks:
        parts.append(chunk.samples)
        progress.update(chunk)
        last = chunk
    write_wav(output, np.concatenate(parts))
    return last

"""qtts voice create: clone a voice from reference audio into a .voice file."""

from __future__ import annotations

from .cmd_say import add_model_arguments, check_output

COMMAND = ("voice", "create")
HELP = "create a .voice file from reference audio: qtts voice create ref.wav --model M [--ref-text T] -o me.voice"


def add_arguments(p) -> None:
    p.add_argument("ref_audio", help="reference audio (wav/flac/ogg/mp3, any sample rate; 3-10 s of clean speech)")
    add_model_arguments(p)
    p.add_argument("--ref-text", help="exact transcript of the reference (enables ICL cloning, usually better)")
    p.add_argument("--name", default="", help="a name stored in the file")
    p.add_argument("--trailing-silence", type=float, default=0.5,
                   help="seconds of silence appended to the ICL reference (stops reference bleed; default 0.5)")
    p.add_argument("-o", "--output", required=True, help="output .voice file")


def run(args) -> int:
    from ..api import load

    check_output(args.output)
    tts = load(args.model, plan=args.plan, dtype=args.dtype, threads=args.threads)
    voice = tts.create_voice(args.ref_audio, ref_text=args.ref_text, name=args.name,
                             trailing_silence=args.trailing_silence)
    voice.save(args.output)
    mode = "ICL" if voice.icl else "x-vector only"
    print(f"wrote {args.output}: {mode}, {voice.enc_dim}-dim speaker vector, model {voice.model_type} {voice.model_size}")
    return 0

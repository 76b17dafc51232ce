"""Clone a voice from reference audio and write a WAV.

    python examples/say.py MODEL REF.wav "Hello there." out.wav [--ref-text "what REF.wav says"]

MODEL is a Base snapshot directory or hub id (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-Base).
"""

import argparse

import qtts

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("ref_audio")
ap.add_argument("text")
ap.add_argument("out")
ap.add_argument("--ref-text", default=None, help="transcript of the reference (enables ICL cloning)")
ap.add_argument("--max-frames", type=int, default=None)
args = ap.parse_args()

tts = qtts.load(args.model)
voice = tts.create_voice(args.ref_audio, ref_text=args.ref_text)
options = qtts.SynthesisOptions(seed=0, max_frames=args.max_frames)
audio = tts.synthesize(args.text, voice=voice, options=options)
audio.save(args.out)
print(f"{args.out}: {audio.duration:.2f} s, finish_reason={audio.finish_reason}")

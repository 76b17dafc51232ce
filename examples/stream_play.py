"""Stream speech chunk by chunk (e.g. to a sound card) and report time to first audio.

    python examples/stream_play.py MODEL SPEAKER "Some text." [--pcm out.raw]

MODEL is a CustomVoice snapshot (speakers: see `qtts say --help` or tts.speakers).
Without --pcm the chunks are only counted; with it, raw 16-bit PCM is appended as it arrives
(play it with: aplay -r 24000 -f S16_LE -c 1 out.raw).
"""

import argparse
import time

import qtts

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("speaker")
ap.add_argument("text")
ap.add_argument("--pcm", default=None)
ap.add_argument("--max-frames", type=int, default=None)
args = ap.parse_args()

tts = qtts.load(args.model)
options = qtts.SynthesisOptions(first_chunk_frames=2, chunk_frames=8, max_frames=args.max_frames)
sink = open(args.pcm, "wb") if args.pcm else None
t0 = time.perf_counter()
for i, chunk in enumerate(tts.stream(args.text, speaker=args.speaker, options=options)):
    if i == 0:
        print(f"first audio after {time.perf_counter() - t0:.3f} s ({chunk.num_frames} frames)")
    if sink:
        sink.write(chunk.int16_bytes)  # hand this to your audio device instead
    if chunk.is_final:
        print(f"done: {chunk.info['audio_s']:.2f} s audio, rtf {chunk.info['rtf']:.2f}, {chunk.finish_reason}")
if sink:
    sink.close()

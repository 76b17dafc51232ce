"""Talk to `qtts serve` with the unmodified OpenAI client and save a streamed WAV.

    qtts serve --model path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice &
    python examples/client.py http://127.0.0.1:8000/v1 vivian "Hello from qtts." out.wav
"""

import argparse

from openai import OpenAI

ap = argparse.ArgumentParser()
ap.add_argument("base_url")
ap.add_argument("voice")
ap.add_argument("text")
ap.add_argument("out")
args = ap.parse_args()

client = OpenAI(base_url=args.base_url, api_key="unused")
with client.audio.speech.with_streaming_response.create(
    model="qtts", voice=args.voice, input=args.text, response_format="wav"
) as response:
    response.stream_to_file(args.out)
print(f"wrote {args.out}")

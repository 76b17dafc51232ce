"""Ask a running `qtts wyoming` service for speech, as Home Assistant does, and save it as WAV.

    qtts wyoming -m Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice &
    python examples/wyoming_client.py "Hello from Wyoming." --voice vivian -o hello.wav
"""

import argparse
import asyncio
import wave

from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncClient
from wyoming.tts import Synthesize, SynthesizeVoice


async def speak(uri: str, text: str, voice: str | None, out: str) -> None:
    async with AsyncClient.from_uri(uri, read_timeout=300) as client:
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice) if voice else None).event())
        with wave.open(out, "wb") as wav:
            while (event := await client.read_event()) is not None and event.type != "audio-stop":
                if AudioStart.is_type(event.type):  # 24 kHz, 16-bit, mono
                    start = AudioStart.from_event(event)
                    wav.setframerate(start.rate), wav.setsampwidth(start.width), wav.setnchannels(start.channels)
                elif AudioChunk.is_type(event.type):  # arrives while the service is still generating
                    wav.writeframes(AudioChunk.from_event(event).audio)
                elif event.type == "error":
                    raise SystemExit(f"qtts: {event.data.get('text')}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("text")
    p.add_argument("--uri", default="tcp://127.0.0.1:10200")
    p.add_argument("--voice", help="a voice from the service's describe answer (default: its first)")
    p.add_argument("-o", "--output", default="wyoming.wav")
    args = p.parse_args()
    asyncio.run(speak(args.uri, args.text, args.voice, args.output))

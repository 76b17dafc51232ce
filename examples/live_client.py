"""Speak an LLM's answer while it is still being written: qtts serve's WebSocket endpoint.

    qtts serve --model path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice &
    python examples/live_client.py ws://127.0.0.1:8000 vivian out.pcm   # s16le, 24 kHz, mono
"""

import argparse
import json
import threading
import time

from websockets.sync.client import connect

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("voice")
ap.add_argument("out")
ap.add_argument("--text", default="Sure! The meeting moved to Thursday at 3 pm. Anything else?")
ap.add_argument("--max-frames", type=int, help="frame budget per talker context")
args = ap.parse_args()
session = {"voice": args.voice, "response_format": "pcm"}
if args.max_frames:
    session["max_frames"] = args.max_frames


def llm(ws):  # stands in for an LLM streaming its answer, a word every 50 ms
    for word in args.text.split(" "):
        ws.send(json.dumps({"type": "text.delta", "delta": word + " "}))
        time.sleep(0.05)
    ws.send(json.dumps({"type": "text.done"}))


with connect(args.url + "/v1/audio/speech/stream") as ws, open(args.out, "wb") as out:
    ws.send(json.dumps({"type": "session.update", "session": session}))
    threading.Thread(target=llm, args=(ws,)).start()
    for message in ws:  # ends when the server closes after audio.done
        if isinstance(message, bytes):
            out.write(message)  # or play it now
        else:
            print(message)
print(f"wrote {args.out}; close code {ws.close_code}")

"""Run synthesis through an execution plan (e.g. the ONNX vocoder, or a whole ONNX bundle).

    qtts export vocoder --model MODEL --chunk-frames 8 -o voc8.onnx
    qtts export vocoder --model MODEL --chunk-frames 2 -o voc2.onnx
    python examples/with_plan.py MODEL voc8.onnx voc2.onnx SPEAKER "Text." out.wav

A plan is a dict or a JSON file (``qtts export onnx`` writes BUNDLE/plan.json): qtts.load(MODEL, plan=...).
"""

import argparse
import os

import qtts

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("main_onnx")
ap.add_argument("first_onnx")
ap.add_argument("speaker")
ap.add_argument("text")
ap.add_argument("out")
args = ap.parse_args()

plan = {"vocoder": {"impl": "onnx", "artifacts": {
    "main": os.path.abspath(args.main_onnx), "first": os.path.abspath(args.first_onnx)}}}
tts = qtts.load(args.model, plan=plan)
audio = tts.synthesize(args.text, speaker=args.speaker, options=qtts.SynthesisOptions(seed=0, max_frames=24))
audio.save(args.out)
print(f"{args.out}: {audio.duration:.2f} s via {plan['vocoder']['impl']} vocoder")

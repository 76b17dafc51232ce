#!/bin/sh
# The `plan` image's entry point (compose service `plan`, docs/container.md): build the ONNX plan
# of a mounted checkpoint into the cache volume once; a later start finds it and exits at once.
#   QTTS_MODEL    checkpoint folder (default /models/model), mounted read-only
#   QTTS_WEIGHTS  int8 (default), int4 or fp32: see docs/fidelity.md
#   QTTS_BUNDLE   bundle folder (default $QTTS_CACHE/<checkpoint folder name>-<weights>)
# Exit 0: the bundle is there (built now or before); 2: no checkpoint at QTTS_MODEL; 1: export failed.
set -eu
model=${QTTS_MODEL:-/models/model}
weights=${QTTS_WEIGHTS:-int8}
bundle=${QTTS_BUNDLE:-${QTTS_CACHE:-/cache}/$(basename "$model")-$weights}
if [ -f "$bundle/plan.json" ]; then
  echo "qtts-plan: $bundle/plan.json is there: nothing to build"
  exit 0
fi
if [ ! -f "$model/config.json" ]; then
  echo "qtts-plan: error: $model/config.json is missing: mount a checkpoint folder there" \
       "(compose: ./models/<name> with QTTS_MODEL=<name>)" >&2
  exit 2
fi
# a killed build leaves only the .partial folder, never a bundle that a server would load
partial="$bundle.partial"
rm -rf "$partial"
start=$(date +%s)
echo "qtts-plan: building $bundle ($weights) from $model; a 0.6B checkpoint takes ~2 min"
qtts export onnx --model "$model" -o "$partial" --weights "$weights"
mv "$partial" "$bundle"
echo "qtts-plan: built $bundle in $(( $(date +%s) - start )) s"

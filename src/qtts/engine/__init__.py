"""The engine: one generation loop of phase functions (:mod:`.generate`) over the backend seam, its
sampling (:mod:`.sampling`), continuous batching (:mod:`.batching`) and the one frames -> chunks streaming
body (:mod:`.stream`). numpy only: no torch, no runtime (backends are passed in)."""

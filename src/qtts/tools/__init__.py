"""Developer tools, never imported at run time by the api, engine or backends: random checkpoints
(:mod:`.random_checkpoint`, :mod:`.random_weights`, :mod:`.standin_tokenizer`), the official package
shim (:mod:`.official`) and the benchmarks (:mod:`.bench`, :mod:`.bench_concurrency`)."""

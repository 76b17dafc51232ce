"""Text in: the Qwen2 tokenizer (:mod:`.tokenizer`), sentence splitting (:mod:`.sentences`), the prompt of
every mode (:mod:`.prompt`), and live text that arrives while speech is made (:mod:`.incremental`,
:mod:`.live`). numpy + tokenizers only: no torch, no runtime."""

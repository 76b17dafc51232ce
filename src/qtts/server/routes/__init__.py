"""The server's routes, one module per resource: ``speech`` (POST /v1/audio/speech, with
``speech_words``: word timestamps), ``speech_stream`` (the live WebSocket, with ``utterance``: its
utterances) and ``voices`` (/v1/voices). What they share (a request's options, voice, caps and
stats) is the job layer, :mod:`qtts.server.jobs` and :mod:`qtts.engine.request`; no route imports
another's private names."""

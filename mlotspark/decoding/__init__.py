"""How each next token is chosen: sampling, stop strings, and strategies beyond one
sampled token per step.

- ``sampling``: samplers and logits processors (*how a token is sampled*), and the
  one loop running each row's processors (``process_logits``).
- ``acceptance``: what a sampled token does (EOS, stop string, cancel, length): the
  one rule of the solo, batched, beam and speculative paths.
- ``text_stream``: ``TextStream``, a sequence's text (mlx-lm's streaming detokenizer,
  cut at stop strings, held back while a stop may be starting); ``stops``: ``Holdback``,
  the one hold-back of stop strings, think tags and tool-call openings, and ``StopMatcher``.
- ``reasoning``: a thinking model's think block kept apart from its answer (split, budget).
- ``beam``: beam search and multiple returns (``num_beams``, ``num_return_sequences``), one
  decode step of every row per ``step()``.
- ``speculative`` + ``drafters``: exact speculative decoding (prompt lookup, draft model).
- ``constrained``: JSON-schema replies (llguidance); ``tools``: the grammar that keeps tool
  calls valid; ``tool_calls``: call formats, where a call opens, one splitter for every API.
- ``strategy``: the runtime asks ``own_loop(options)`` whether a request needs its own
  decode loop (the scheduler then steps it once per turn, next to the batch), and ``select_step`` for the token-step
  function (``decode_step``: mlx-lm's ``generate_step`` from the prompt's last token, or
  speculative decoding; same contract). None of them prefills: the runtime did
  (``runtime/prefill.py``, the one prefill, with the caches' ``prepare_decode``).

May import: ``errors``, ``options``, ``results``, ``storage``, ``platform``, ``models``, ``caches``,
``memory`` (to tell a cascade cache). Never ``runtime``: the runtime's ``Sequence`` is passed in,
as a ``request.DecodeRequest``.
"""

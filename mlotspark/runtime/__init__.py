"""Running requests: one sequence's generation, continuous batching, the scheduler.

- ``generation``: ``Generation``, a request as its caller made it (prompt, cache, options,
  the context limit) and, once it ends, its result: a record the caller only reads.
- ``sequence``: ``Sequence``, the one engine-side state of a running request (prefill
  counters, tokens, text and acceptance, sampler, stats, cache), stepped by the batch or,
  once prefilled, a step of its own loop per turn (speculation, beams, several returns), and
  the one stats finaliser (``Sequence.finalize``) that solo, batched and beam requests all use.
- ``batching``: ``DecodeBatch``: many sequences, one step.
- ``prefill``: the one prefill: one prompt chunk of a request, the chunks of several
  plain-KV requests in one padded forward pass (``prefill_batch``), for every request
  (batched or own loop), or a whole prompt outside the engine (``prefill_prompt``); each
  ends in ``prepare_decode``.
- ``scheduler``: the engine thread, the priority queue, admission under the memory
  limit and the governor's batch cap.
- ``stepping``: the scheduler's decode half: each turn, one batched step of the running
  requests that decode a token at a time, then one step of each that runs its own loop.
- ``scheduler_config``: ``SchedulerConfig`` (mode, max batch, memory limit), the
  throughput meter the governor reads.
- ``request_handle``: ``RequestHandle``, what ``Engine.submit`` returns.

May import: ``errors``, ``options``, ``results``, ``platform``, ``models``, ``caches``,
``memory``, ``decoding``, ``thermal``. Never ``engine``, ``cli``, ``bench`` or ``tui``.
"""

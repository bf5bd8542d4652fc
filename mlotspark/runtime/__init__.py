"""Running requests: one sequence's generation, continuous batching, the scheduler.

- ``generation``: ``Generation``: a request that decodes in its own loop (mlx-lm's
  ``generate_step``, speculation, beams) after its prefill, stop strings, cancellation,
  the context limit, and the one stats finaliser (``Generation.finalize``) that solo,
  batched and beam requests all use.
- ``batching``: ``SequenceState`` and ``DecodeBatch``: many sequences, one step.
- ``prefill``: the one prefill: one prompt chunk of a request, the chunks of several
  plain-KV requests in one padded forward pass (``prefill_batch``), or a whole prompt
  before a request's own loop (``prefill_prompt``); each ends in ``prepare_decode``.
- ``scheduler``: the engine thread, the priority queue, admission under the memory
  limit and the governor's batch cap.
- ``scheduler_config``: ``SchedulerConfig`` (mode, max batch, memory limit), the
  throughput meter the governor reads.
- ``request_handle``: ``RequestHandle``, what ``Engine.submit`` returns.

May import: ``errors``, ``options``, ``results``, ``platform``, ``models``, ``caches``,
``memory``, ``decoding``, ``thermal``. Never ``engine``, ``cli``, ``bench`` or ``tui``.
"""

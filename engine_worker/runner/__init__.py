"""The model runner: the engine's only modules that import mlx (through :mod:`.mlx_core`, which
loads OpenBLAS first), and what turns its tokens into text.

* :mod:`.generator`: the :class:`~.generator.BatchRunner` the scheduler drives, over mlx-lm's
  ``BatchGenerator``, which sees the model through :mod:`.float_logits` (float32 logits);
  :mod:`.urgent_lane`: a second generator for urgent first tokens.
* :mod:`.sampling`, :mod:`.logprobs`: per-request samplers, processors, stop sequences and log
  probabilities; :mod:`.batch_sampler`: the one sampler of a generator's rows, which samples them
  in one call a step; :mod:`.grammar`: the masks of constrained rows.
* :mod:`.detokenizer`, :mod:`.token_bytes`, :mod:`.text_stream`: tokens to UTF-8-safe text with
  stop strings.
* :mod:`.loader`: loading a model folder; :mod:`.device_memory`: the device's memory and a
  model's sizes; :mod:`.blas`: the CPU BLAS preload.

Importing this package loads nothing; its modules load mlx as they are imported (except
:mod:`.token_bytes` and :mod:`.text_stream`, plain Python the web side may use).
"""

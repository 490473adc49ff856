"""An OpenAI-compatible API over the service's jobs: ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/models``, and its Files and Batch APIs (``/v1/files``,
``/v1/batches``), for clients written against OpenAI's SDKs."""

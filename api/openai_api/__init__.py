"""An OpenAI-compatible API over the service's jobs: ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/models``, for clients written against OpenAI's SDKs."""

"""An OpenAI-compatible API over the service's jobs, for clients written against OpenAI's SDKs:
``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``. Its Files and Batch APIs
(``/v1/files``, ``/v1/batches``) are the batches domain's (api/batches/); urls.py routes them all."""

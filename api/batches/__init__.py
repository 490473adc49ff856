"""Files and batches: OpenAI's Files and Batch APIs over the service's jobs, from the upload of an
input file to the output and error files, with their feeder, views, admin and Celery tasks."""

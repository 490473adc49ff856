"""What every domain of the app uses: the error types and the one handler that turns them into
responses, the JSON parser, the strict serializer fields, the Redis connections and the names of
the Redis keys and channels."""

"""The small local model: built from a shipped corpus, saved in Hugging Face layout."""

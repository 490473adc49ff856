"""The small local models the project serves and tests with, built from a shipped corpus and saved
in Hugging Face layout; the engine loads them as it loads any mlx-lm model folder.

``DEMO_MODEL_DIR`` holds the trained demo model shipped in the repository (``train.py`` trains it,
``evaluate.py`` checks its goals); ``builder.py`` builds the untrained test model the tests and
``make model`` use, with the same tokenizer.
"""

from pathlib import Path

DEMO_MODEL_DIR = Path(__file__).with_name("demo")

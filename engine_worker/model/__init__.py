"""The small local models: built from a shipped corpus, saved in Hugging Face layout.

``DEMO_MODEL_DIR`` holds the trained demo model shipped in the repository (see ``train.py``);
``builder.py`` builds the untrained test model.
"""

from pathlib import Path

DEMO_MODEL_DIR = Path(__file__).with_name("demo")

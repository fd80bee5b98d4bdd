"""The bundled demo model: a small Mixture-of-Experts trained on Shakespeare (train_shakespeare.py)."""
from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "shakespeare"

"""Kneser-Ney n-gram baseline (placeholder docstring, expanded below)."""
from .model import NgramModel
from .kneser_ney import train_kneser_ney

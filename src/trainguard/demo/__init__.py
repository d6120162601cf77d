"""A self-contained demo: a tiny causal transformer on a synthetic language."""

from trainguard.demo.data import MarkovLanguage
from trainguard.demo.model import TinyCausalLM

__all__ = ["MarkovLanguage", "TinyCausalLM"]

"""Evaluations on the real model: needle in a haystack, attention entropy, perplexity."""

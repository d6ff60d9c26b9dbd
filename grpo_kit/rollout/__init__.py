"""Prompts -> completions -> rewards -> advantages: generation, scoring, tool use, replay, evaluation."""

"""Tape-based reverse-mode autodiff: nodes with backward rules, `backward`, `Gradients`."""
from .tape import Node, GraphReleasedError, backward, no_recording, is_recording
from .gradients import Gradients

__all__ = ["Node", "Gradients", "GraphReleasedError", "backward", "no_recording", "is_recording"]

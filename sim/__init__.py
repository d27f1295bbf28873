"""Discrete-event simulation of a Hermes run: the real engine and policies on a virtual clock."""

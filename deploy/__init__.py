"""Deployment: local testbed launcher, compose profiles and (later) SSH roll-out."""

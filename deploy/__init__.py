"""Deployment: local testbed launcher, compose profiles and the SSH roll-out (hermes-deploy)."""

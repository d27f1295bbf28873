"""Bring-your-own-model examples: each module exposes ``task`` (a ``hermes.Task``).

Run one from the repository root (the current directory is importable, as
with uvicorn); the command is at the top of each file:

- ``image_folder``: a custom CNN and a custom ``Dataset`` reading image files from a folder;
- ``regression``: an MLP with MSE loss and an R² metric on scikit-learn's diabetes set;
- ``non_iid``: device-local data, each device holding different classes;
- ``sequence``: a GRU over int64 token ids, trained with AdamW.
"""

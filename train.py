"""``python train.py [overrides…]``: the same as ``llmrubric train`` (:mod:`llmrubric.apps.train`)."""

from llmrubric.apps.commands import launch

if __name__ == "__main__":
    launch("train")

"""``python evaluate.py [overrides…]``: the same as ``llmrubric evaluate`` (:mod:`llmrubric.apps.evaluate`)."""

from llmrubric.apps.commands import launch

if __name__ == "__main__":
    launch("evaluate")

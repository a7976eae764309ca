"""``python train.py [overrides…]``: the same as ``llmrubric train`` (:mod:`llmrubric.apps.train`)."""

from llmrubric.apps.train import main

if __name__ == "__main__":
    main()

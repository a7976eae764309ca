"""``python train.py [overrides…]``: the same as ``llmrubric train`` (:mod:`llmrubric.training.app`)."""

from llmrubric.training.app import main

if __name__ == "__main__":
    main()

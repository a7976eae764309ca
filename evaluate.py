"""``python evaluate.py [overrides…]``: the same as ``llmrubric evaluate`` (:mod:`llmrubric.evaluation.app`)."""

from llmrubric.evaluation.app import main

if __name__ == "__main__":
    main()

"""``python evaluate.py [overrides…]``: the same as ``llmrubric evaluate`` (:mod:`llmrubric.apps.evaluate`)."""

from llmrubric.apps.evaluate import main

if __name__ == "__main__":
    main()

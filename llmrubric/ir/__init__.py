"""IR evaluations on top of extracted distributions and calibrated predictions.

``autograder``: RUBRIC qrels, trec_eval measures through ir-measures, Rubric-Cover@k and
the workbench's verification analyses; ``nuggets``: AutoNuggetizer All/Vital scores;
``grounded_qa``: retrieval, citation, answer-quality and evidence scores; ``calibrated``:
test-bank summaries as features of the calibration network.
"""

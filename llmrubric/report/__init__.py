"""The evaluation report: ``build`` (the glue) asks ``plan`` which variants the chosen sections need,
trains them (:func:`llmrubric.experiments.variants.run_variants`), computes ``sections`` and ``calibration``
from their predictions (``results``), and writes the folder that ``render`` lays out (templates in
``templates/``, figures from ``plots``)."""

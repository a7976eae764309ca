"""The applications on top of the library: the Hydra apps ``train`` and ``evaluate``, and one module per noun
of the ``llmrubric`` command (``data``, ``models``, ``extract``, ``score``, ``labels``, ``ir``); ``commands``
holds what they share to register their verbs."""

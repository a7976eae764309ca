"""Helpers the tests share (fixtures stay in ``tests/conftest.py``): the repository's paths, the fast
trainer, tiny offline models, loopback servers (a fake OpenAI endpoint, llama.cpp, PostgreSQL) and a
multi-source data set. ``tests/`` is on ``sys.path`` under pytest, so tests import ``support.<module>``."""
